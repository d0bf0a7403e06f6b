"""A server's prefill lane: requests that hold a slot are prefilled in batches, one batch at a time,
and while a batch runs nobody decodes, as in SGLang 0.5.23's scheduler. So prefill a prefix cache
saves (sim.prefix_cache) shortens every running request's wait, not only the request's own.

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
from collections import deque
from collections.abc import Sequence

from genfleet.sim.capacity import Capacity
from genfleet.sim.prefix_cache import PrefixCache


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
