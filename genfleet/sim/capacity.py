"""The simulator's capacity model: the prefix cache, the KV capacity that admits requests, and the
prefill lane.

A host's prefix cache, modelled on SGLang 0.5.23's radix cache (`mem_cache/radix_cache.py`), so
that routing requests that share a prefix to one host can be measured.

What SGLang does, and the sim after it:

- Lookup (`Req.init_next_round_input`, `managers/schedule_batch.py`): when a prefill batch takes
  a request (sim.capacity), the longest cached prefix of its ids is its `cached_tokens`,
  capped at `len(ids) - 1` (`_compute_max_prefix_len`: the last token is always prefilled, for its
  logits), then page-aligned down (`RadixKey.page_aligned`). A lookup refreshes the recency of what it
  matched. Only the uncached tokens are prefilled.
- Insert after prefill (`checkpoint_kv_cache`, `mem_cache/common.py`, called for a request that
  did not finish in its prefill, `managers/scheduler_components/batch_result_processor.py`): the
  prompt, as its batch ends, so that a request in a later batch finds it (one in the same batch
  does not).
- Insert at the end (`release_kv_cache(req, tree_cache, checkpoint=True)`, `mem_cache/common.py`,
  for a request finished or aborted while running): `origin_input_ids + output_ids` up to the KV
  the request computed (`Req.owned_kv_len`: `kv_committed_len`), that is every output id but the
  last, which was sampled but never fed back. A request aborted while waiting computed nothing.
- Eviction (`RadixCache.evict`): leaves first, least recently used first, until the tokens fit.

The sim's simplifications:

- Pages of `page_size` tokens (default 16, as SGLang runs with `--page-size 16`; SGLang's own
  default is 1): the cache holds whole pages, keyed by a hash chained over the pages before, so a
  lookup costs a tuple and a dict probe per page, never a per-token walk. Two different prefixes
  share an entry only if their chained 64-bit hashes collide.
- The capacity is for the cache alone; SGLang's KV pool also holds the running requests' KV, and
  never evicts a node a running request holds (`lock_ref`). Here a running request's prefix may
  be evicted under pressure; its end re-inserts it.
- One asyncio loop runs the sim: nothing here awaits, so no lock is needed.

The capacity model: slots, a KV cache that admits by reservation, a decode speed that falls as more
requests run, and occupancy stats.

The KV cache (`--max-total-tokens`, off by default), after SGLang 0.5.23's `PrefillAdder`
(`managers/schedule_policy.py`): a waiting request is admitted only while its prompt plus its
whole `min(max_new_tokens, CLIP_MAX_NEW_TOKENS)` (4,096, or `SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`
as SGLang reads it: `environ.py`) fits in what the running requests leave, each of them holding its prompt, what it has
decoded, and `min(max_new_tokens - decoded, 4096) x new_token_ratio` more (`add_one_req`,
`_get_running_request_total_token_offset`). So a generous cap keeps requests waiting while the cache
sits mostly empty, which is what staged first caps are for.

The ratio moves as SGLang's does (`managers/scheduler_components/new_token_ratio_tracker.py`): it
starts at `new_token_ratio` (0.7: `SGLANG_INIT_NEW_TOKEN_RATIO` x `--schedule-conservativeness`),
falls by (start - floor) / `SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS` (600) on every decode step, down to
the floor, start x `SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR` (0.14: 0.098), and is back at its start each
time the server goes idle (`managers/scheduler.py`, the idle branch: `new_token_ratio_tracker.reset()`).
A decode step is one token of every running request, so the steps are the shared decode clock's
advance (prefill batches, which do not decay it in SGLang either, stop that clock). So on a busy
server the reservation of the running requests fades within 600 steps (measured on SGLang's own
scheduler: 0.098 from 44 s of a KV-limited run, docs/running.md), and what bounds the batch is the
KV they hold plus one newcomer's whole clipped cap. Before the sim modelled the decay it predicted
1.55x for staged caps where SGLang gave 1.18x (bench/results.md, section 10, at 6265e1a).

Simplified: SGLang raises the ratio after a retraction (KV ran out mid-decode) and takes the work
back; the sim never retracts: a request it admitted runs on, and at a low ratio the KV the running
requests hold may briefly exceed the cache (its `token_usage` above 1), where SGLang would retract.

Every running request decodes at the same speed, `rate / (1 + running / knee)` tokens/s, except
while a prefill batch has the GPU (sim.capacity: `pause_decoding`), when nobody decodes, as in
SGLang 0.5.23's scheduler without `--enable-mixed-chunk`. So one shared "decode clock" (tokens
decoded per request since start) integrates that piecewise-constant speed exactly as `running`
changes and pauses begin and end; a request's progress is the clock's advance since its prefill
ended. A pause's end is known when it begins, so the clock needs no call at that moment to be
exact. The same bookkeeping integrates `running` over time, which gives an exact time-weighted mean
occupancy.

A server's prefill lane: requests that hold a slot are prefilled in batches, one batch at a time,
and while a batch runs nobody decodes, as in SGLang 0.5.23's scheduler. So prefill a prefix cache
saves (sim.capacity) shortens every running request's wait, not only the request's own.

What SGLang does:

- One GPU, turn by turn (`managers/scheduler.py`, `event_loop_normal` -> `get_next_batch_to_run`):
  each turn runs a prefill ("extend") batch whenever requests wait and can be admitted ("Run
  prefill first if possible"), else one decode step of the running batch. A prefill batch and the
  decode steps mix only with `--enable-mixed-chunk`, off by default (`arg_groups/fields/schedule.py`),
  and `--prefill-decode-interval` is 0 (`validation_hook.py`): the running requests do not decode
  while a prefill batch runs.
- A batch (`_get_new_batch_prefill_raw`, and `PrefillAdder` in `managers/schedule_policy.py`) takes
  the waiting requests in queue order (`--schedule-policy fcfs`, the default), matching each
  against the radix cache as it comes to it (`req.init_next_round_input(self.tree_cache)`), and
  charges its uncached ("extend") tokens to a budget of `--max-prefill-tokens` (16384;
  `_update_prefill_budget`). It stops at the first request that does not fit (`add_one_req`
  answers OTHER and the loop breaks); the first request of a batch always goes ("Without
  chunking, allow the first request even above the input cap").
- Requests in one batch do not find each other's prompts: a prompt enters the cache after its
  batch (`checkpoint_kv_cache`, `managers/scheduler_components/batch_result_processor.py`). Only
  the cache-aware policies (lpm, dfs-weight, ...) hold back a request whose prefix an earlier
  waiting request shares, for the next batch (`SchedulePolicy._compute_prefix_matches`); FCFS
  does not, so two requests with one prompt in one batch both miss.

The sim, after it:

- One lane per server. A request joins its queue once it holds a slot (sim.capacity). An idle lane
  forms a batch on the event loop's next turn (requests that arrive together share it), a busy one
  as its batch ends, FCFS up to `max_prefill_tokens` uncached tokens, matching each request then.
- A batch takes `uncached tokens / prefill_rate` seconds (prefill_rate is the server's, not a
  request's), during which the shared decode clock stands still (`Capacity.pause_decoding`).
- At its end its prompts are cached and its requests start decoding, their first token out of the
  prefill; the next batch forms from the requests queued by then.
- An abort: a request still queued leaves the queue (SGLang's "Abort in waiting queue": nothing
  computed); one in the running batch cannot leave it: the batch runs its course, its prompt cached.

Simplifications: no chunked prefill. SGLang cuts a request that does not fit the chunk budget
(`--chunked-prefill-size`, 8192 on an H200: `arg_groups/memory_hook.py`) and runs the rest in the
next batches, with no decode step between (the chunked request goes first); the sim puts a request
that does not fit in the next batch, and one longer than the budget in a batch of its own. The lane
is busy as long; a request's first token may come a little sooner or later. Prefill time is linear
in the uncached tokens: no attention term growing with the prefix, no per-batch overhead.
"""
from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

DEFAULT_PREFIX_CACHE_TOKENS = 500_000  # about an H200's KV pool for an 8B model at bf16
DEFAULT_PAGE_SIZE = 16
# SGLang 0.5.23 `environ.py`: SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION, SGLANG_INIT_NEW_TOKEN_RATIO,
# SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS (the sim reads the same
# variables: sim.command).
CLIP_MAX_NEW_TOKENS = 4096
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
# The waiting queue is weighed again at most this often while the ratio decays (a decode step apart).
RECHECK_MIN_S = 0.005


@dataclass(eq=False)
class KvClaim:
    """One request's hold on the KV cache (sim.capacity): its prompt and cap, and where the shared
    decode clock stood when it started, so what it has decoded is the clock's advance since."""

    prompt_tokens: int
    max_new_tokens: int
    origin: float = 0.0


class _Page:
    __slots__ = ("children", "parent")

    def __init__(self, parent: int | None) -> None:
        self.parent = parent
        self.children = 0  # cached pages that extend this one


class PrefixCache:
    """Cached token pages of one host; `capacity_tokens` 0 turns the cache off.

    Recency is the order of `_pages`, least recent first. A lookup or an insert moves the pages of
    its path to the end deepest first, so a page always stands before its ancestors: the first
    page is always a leaf, and eviction pops it (leaf-first LRU in O(1) per page)."""

    def __init__(self, capacity_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS, page_size: int = DEFAULT_PAGE_SIZE) -> None:
        if capacity_tokens < 0 or page_size < 1:
            raise ValueError(f"need capacity_tokens >= 0 and page_size >= 1, got {capacity_tokens}, {page_size}")
        self.capacity_tokens = capacity_tokens
        self.page_size = page_size
        self._pages: OrderedDict[int, _Page] = OrderedDict()
        self.evicted_tokens = 0

    @property
    def enabled(self) -> bool:
        return self.capacity_tokens > 0

    @property
    def tokens(self) -> int:
        """Tokens held now."""
        return len(self._pages) * self.page_size

    def match(self, ids: Sequence[int]) -> int:
        """The cached prefix of `ids` a request scheduled now reuses: at most `len(ids) - 1` tokens,
        whole pages. The matched pages become the most recently used."""
        if not self._pages:
            return 0
        path = []
        for key in self._keys(ids, len(ids) - 1):
            if key not in self._pages:
                break
            path.append(key)
        self._touch(path)
        return len(path) * self.page_size

    def insert(self, ids: Sequence[int]) -> None:
        """Cache the whole pages of `ids` (most recently used), then evict down to the capacity."""
        if not self.enabled:
            return
        path, parent = [], None
        for key in self._keys(ids, len(ids)):
            if key not in self._pages:
                self._pages[key] = _Page(parent)
                if parent is not None:
                    self._pages[parent].children += 1
            path.append(key)
            parent = key
        self._touch(path)
        self._evict()

    def clear(self) -> None:
        """`/flush_cache` (`RadixCache.reset`)."""
        self._pages.clear()

    def _keys(self, ids: Sequence[int], limit: int) -> Iterator[int]:
        """The chained key of each whole page among the first `limit` ids."""
        size, key = self.page_size, 0
        for start in range(0, max(limit, 0) // size * size, size):
            key = hash((key, tuple(ids[start : start + size])))
            yield key

    def _touch(self, path: list[int]) -> None:
        for key in reversed(path):  # deepest first: ancestors end up after their descendants
            self._pages.move_to_end(key)

    def _evict(self) -> None:
        while len(self._pages) * self.page_size > self.capacity_tokens:
            _, page = self._pages.popitem(last=False)
            if page.children:  # cannot happen (see the class docstring); never orphan a page
                raise AssertionError("prefix cache evicted a page that has children")
            if page.parent is not None:
                self._pages[page.parent].children -= 1
            self.evicted_tokens += self.page_size


# SGLang 0.5.23's --max-prefill-tokens default (`arg_groups/fields/schedule.py`).
DEFAULT_MAX_PREFILL_TOKENS = 16384


@dataclass(frozen=True)
class CapacitySettings:
    rate: float = 100.0
    knee: float = 64.0
    prefill_rate: float = 50_000.0  # prompt tokens/s of the server's prefill (sim.capacity)
    max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS  # uncached tokens in one prefill batch
    max_running: int | None = None
    max_total_tokens: int | None = None  # the KV cache that admits by reservation (sim.capacity)
    new_token_ratio: float = INIT_NEW_TOKEN_RATIO  # where the ratio starts, and starts again when idle
    min_new_token_ratio_factor: float = MIN_NEW_TOKEN_RATIO_FACTOR  # its floor, as a share of the start
    new_token_ratio_decay_steps: int = NEW_TOKEN_RATIO_DECAY_STEPS  # decode steps from start to floor
    clip_max_new_tokens: int = CLIP_MAX_NEW_TOKENS
    prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS  # 0: no prefix cache (sim.capacity)
    page_size: int = DEFAULT_PAGE_SIZE  # the prefix cache's granularity, in tokens


@dataclass(frozen=True)
class CapacityStats:
    running: int
    waiting: int
    peak_running: int
    mean_running: float
    requests_started: int
    requests_finished: int
    requests_disconnected: int
    # Ended by an abort: POST /abort_request, or a client that left (sim.engine).
    aborted_requests: int
    # Every token decoded, those of requests aborted or whose client left included (GPU time spent).
    tokens_generated: int
    # At each prefill: the prompt's tokens, those found in the prefix cache, and the rest, which
    # were prefilled (what the GPU spent on prompts).
    prompt_tokens_total: int
    cached_tokens_total: int
    prefill_tokens_computed: int
    # Prefill batches run, and the seconds they took, during which nobody decoded (sim.capacity).
    prefill_batches: int
    prefill_busy_s: float
    uptime_s: float
    # The share of a running request's remaining cap reserved now (sim.capacity: it decays).
    new_token_ratio: float


class Capacity:
    """Running and waiting requests, the shared decode clock, and counters since the last reset."""

    def __init__(self, settings: CapacitySettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._clock = clock
        self._started_at = self._last = clock()
        self._decoded = self._running_area = 0.0
        self._paused_until: float | None = None  # the end of the prefill batch running now
        self._ratio_from = 0.0  # the decode clock when the server last left idle (the ratio's start)
        self._recheck_pending = False
        self.running = 0
        self._waiters: deque[tuple[asyncio.Future[None], KvClaim]] = deque()
        self._claims: set[KvClaim] = set()
        self.reset_stats()

    # -- decode clock -------------------------------------------------------------------------

    def decode_rate(self) -> float:
        """Tokens/s of each running request right now: none while a prefill batch runs."""
        self._advance()
        return 0.0 if self._paused_until is not None else self._speed()

    def progress(self) -> float:
        """Tokens each running request has decoded since the server started (a shared clock)."""
        self._advance()
        return self._decoded

    def seconds_until(self, progress: float) -> float:
        """When the decode clock reaches `progress`, if `running` stays as it is and no further
        prefill batch starts: the rest of the running batch's pause, then decoding. A waiter wakes
        and re-checks; one woken early by a later pause simply sleeps again."""
        now = self._advance()
        remaining = progress - self._decoded
        if remaining <= 0:
            return 0.0
        paused = self._paused_until - now if self._paused_until is not None else 0.0
        return paused + remaining / self._speed()

    def pause_decoding(self, seconds: float) -> None:
        """Stop the decode clock for `seconds` from now: a prefill batch has the GPU."""
        now = self._advance()
        self._paused_until = now + seconds
        self._prefill_batches += 1
        self._prefill_busy_s += seconds

    # -- slots --------------------------------------------------------------------------------

    async def acquire(self, claim: KvClaim | None = None) -> None:
        """Take a running slot, waiting in FIFO order while `max_running` are busy or the KV cache
        cannot hold `claim`'s reservation (sim.capacity)."""
        claim = claim or KvClaim(0, 0)
        if not self._waiters and self._has_room(claim):
            self._start_one(claim)
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append((waiter, claim))
        self._recheck_while_the_ratio_decays()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(claim)  # the slot was handed over just as the client went away
            elif (waiter, claim) in self._waiters:  # a release in between may have dropped it already
                self._waiters.remove((waiter, claim))
                self._admit_waiting()  # the head may have been what held the rest back
            raise

    def release(self, claim: KvClaim | None = None) -> None:
        self._advance()
        self.running -= 1
        self._claims.discard(claim)
        self._admit_waiting()

    def new_token_ratio(self) -> float:
        """The share of a running request's remaining cap reserved for it now: decayed by every
        decode step since the server was last idle (sim.capacity)."""
        start, floor = self.settings.new_token_ratio, self._ratio_floor()
        steps = self.settings.new_token_ratio_decay_steps
        if self.running == 0:
            return start  # idle: SGLang resets it (the decode clock runs on meanwhile, but nothing decodes)
        if steps <= 0:
            return floor
        return max(floor, start - (start - floor) / steps * (self.progress() - self._ratio_from))

    def _ratio_floor(self) -> float:
        start = self.settings.new_token_ratio
        return min(start * self.settings.min_new_token_ratio_factor, start)

    def _admit_waiting(self) -> None:
        while self._waiters:
            waiter, claim = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if not self._has_room(claim):
                return
            self._waiters.popleft()
            self._start_one(claim)
            waiter.set_result(None)

    def _recheck_while_the_ratio_decays(self) -> None:
        """While requests wait on the KV cache and the ratio still falls, look again every decode step
        or so: SGLang weighs its waiting queue every turn, and a falling ratio frees reservation with no
        request ending (sim.capacity)."""
        if self._recheck_pending or not self._waiters or self.settings.max_total_tokens is None:
            return
        if self.new_token_ratio() <= self._ratio_floor():
            return

        def recheck() -> None:
            self._recheck_pending = False
            self._admit_waiting()
            self._recheck_while_the_ratio_decays()

        self._recheck_pending = True
        asyncio.get_running_loop().call_later(max(RECHECK_MIN_S, 1.0 / self._speed()), recheck)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def kv_tokens(self) -> int:
        """KV tokens the running requests hold now: prompts and what they decoded."""
        progress = self.progress()
        return sum(claim.prompt_tokens + self._decoded_by(claim, progress) for claim in self._claims)

    def _decoded_by(self, claim: KvClaim, progress: float) -> int:
        return min(claim.max_new_tokens, int(progress - claim.origin))

    # -- counters -----------------------------------------------------------------------------

    def record_tokens(self, count: int) -> None:
        self._tokens_generated += count

    def record_prefill(self, prompt_tokens: int, cached_tokens: int) -> None:
        self._prompt_tokens += prompt_tokens
        self._cached_tokens += cached_tokens

    def record_finished(self) -> None:
        self._requests_finished += 1

    def record_disconnected(self) -> None:
        self._requests_disconnected += 1

    def record_aborted(self) -> None:
        self._aborted_requests += 1

    def stats(self) -> CapacityStats:
        now = self._advance()
        elapsed = now - self._stats_since
        return CapacityStats(
            running=self.running,
            waiting=self.waiting,
            peak_running=self._peak_running,
            mean_running=self._running_area / elapsed if elapsed > 0 else float(self.running),
            requests_started=self._requests_started,
            requests_finished=self._requests_finished,
            requests_disconnected=self._requests_disconnected,
            aborted_requests=self._aborted_requests,
            tokens_generated=self._tokens_generated,
            prompt_tokens_total=self._prompt_tokens,
            cached_tokens_total=self._cached_tokens,
            prefill_tokens_computed=self._prompt_tokens - self._cached_tokens,
            prefill_batches=self._prefill_batches,
            prefill_busy_s=self._prefill_busy_s,
            uptime_s=now - self._started_at,
            new_token_ratio=self.new_token_ratio(),
        )

    def reset_stats(self) -> None:
        self._stats_since = self._advance()
        self._running_area = 0.0
        self._peak_running = self.running
        self._requests_started = self._requests_finished = self._requests_disconnected = 0
        self._aborted_requests = 0
        self._tokens_generated = 0
        self._prompt_tokens = self._cached_tokens = 0
        self._prefill_batches, self._prefill_busy_s = 0, 0.0

    # -- internals ----------------------------------------------------------------------------

    def _has_room(self, claim: KvClaim) -> bool:
        limit, total = self.settings.max_running, self.settings.max_total_tokens
        if limit is not None and self.running >= limit:
            return False
        if total is None or not self._claims:  # an empty cache takes anyone (SGLang's first request)
            return True
        wanted = claim.prompt_tokens + min(claim.max_new_tokens, self.settings.clip_max_new_tokens)
        return self._reserved() + wanted <= total

    def _reserved(self) -> float:
        """What the running requests hold and are expected to need (sim.capacity)."""
        progress, ratio = self.progress(), self.new_token_ratio()
        held = 0.0
        for claim in self._claims:
            decoded = self._decoded_by(claim, progress)
            clipped = min(claim.max_new_tokens - decoded, self.settings.clip_max_new_tokens)
            held += claim.prompt_tokens + decoded + clipped * ratio
        return held

    def _start_one(self, claim: KvClaim) -> None:
        self._advance()
        if self.running == 0:  # the server was idle until now: the ratio starts again (sim.capacity)
            self._ratio_from = self._decoded
        claim.origin = self._decoded
        self._claims.add(claim)
        self.running += 1
        self._requests_started += 1
        self._peak_running = max(self._peak_running, self.running)

    def _speed(self) -> float:
        """Tokens/s of each running request while decoding."""
        return self.settings.rate / (1.0 + self.running / self.settings.knee)

    def _advance(self) -> float:
        """Integrate decode progress and occupancy up to now; `running` is constant since `_last`,
        and decoding stood still from `_last` until `_paused_until` (if set)."""
        now = self._clock()
        elapsed = now - self._last
        if elapsed > 0:
            decoding = elapsed
            if self._paused_until is not None:
                decoding = max(0.0, now - max(self._last, self._paused_until))
                if now >= self._paused_until:
                    self._paused_until = None
            self._decoded += decoding * self._speed()
            self._running_area += elapsed * self.running
            self._last = now
        return now


class PrefillTurn:
    """One request's place in the lane: queued, then in a batch (`batched`, with the `cached_tokens`
    its match found), then `done` as its batch ends."""

    def __init__(self, lane: PrefillLane, prompt_ids: Sequence[int], prompt_tokens: int) -> None:
        self._lane = lane
        self.prompt_ids = prompt_ids
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = 0
        self.batched = False
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def withdraw(self) -> bool:
        """Leave the queue if no batch has taken the request yet (an abort, a cancelled request):
        True if it left; a no-op once batched."""
        return self._lane.withdraw(self)


class PrefillLane:
    """The server's prefill batches, one at a time, FCFS."""

    def __init__(self, capacity: Capacity, prefix_cache: PrefixCache) -> None:
        self._capacity = capacity
        self._cache = prefix_cache
        self._queue: deque[PrefillTurn] = deque()
        self._batch: list[PrefillTurn] | None = None  # the batch running now
        self._forming = False  # a batch is due to form on the loop's next turn

    @property
    def queued(self) -> int:
        """Requests waiting for a batch."""
        return len(self._queue)

    def submit(self, prompt_ids: Sequence[int], prompt_tokens: int) -> PrefillTurn:
        """Queue a request that holds a slot; its turn's `done` resolves as its batch ends."""
        turn = PrefillTurn(self, prompt_ids, prompt_tokens)
        self._queue.append(turn)
        if self._batch is None and not self._forming:
            self._forming = True
            asyncio.get_running_loop().call_soon(self._start_batch)
        return turn

    def withdraw(self, turn: PrefillTurn) -> bool:
        if turn.batched or turn not in self._queue:
            return False
        self._queue.remove(turn)
        return True

    def _start_batch(self) -> None:
        self._forming = False
        if self._batch is not None or not self._queue:
            return
        settings = self._capacity.settings
        batch: list[PrefillTurn] = []
        uncached_total = 0
        while self._queue:
            turn = self._queue[0]
            cached = self._cache.match(turn.prompt_ids)
            uncached = turn.prompt_tokens - cached
            if batch and uncached_total + uncached >= settings.max_prefill_tokens:
                break  # SGLang's PrefillAdder: the first request that does not fit ends the batch
            self._queue.popleft()
            turn.cached_tokens, turn.batched = cached, True
            self._capacity.record_prefill(turn.prompt_tokens, cached)
            batch.append(turn)
            uncached_total += uncached
        self._batch = batch
        seconds = uncached_total / settings.prefill_rate
        self._capacity.pause_decoding(seconds)
        asyncio.get_running_loop().call_later(seconds, self._end_batch)

    def _end_batch(self) -> None:
        """Cache the batch's prompts, as SGLang checkpoints them after the prefill, and let its
        requests decode; then the next batch, if any request waits."""
        batch, self._batch = self._batch or [], None
        for turn in batch:
            self._cache.insert(turn.prompt_ids)
            if not turn.done.done():
                turn.done.set_result(None)
        self._start_batch()
