"""Staged caps (`--first-max-new-tokens N|auto`): a prompt's first request asks a smaller
max_new_tokens than its real cap, and a completion cut there goes on exactly up to the real cap.

Why it pays: SGLang's scheduler admits a request only while the KV cache has room for what every
request may still decode. An admitted request is charged min(max_new_tokens, 4096) tokens of the
KV budget, and each running one its remaining max_new_tokens times `new_token_ratio` (0.5.23
`srt/managers/schedule_policy.py`: `PrefillAdder.add_one_req`, `_get_running_request_total_token_
offset`; the 4096 is `SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`, `srt/environ.py`). With caps in the
thousands and completions in the hundreds the reservation, not the memory in use, bounds how many
requests run: on a KV-limited server a 4,000 cap admitted 7 of 150 streams at 11% KV use.

Stages: the follow-up of a cut at a staged cap asks twice that cap (`next_stage`), or all that is
left of the real cap once twice would reach it. Asking the rest at once would charge a long
completion's whole tail at the clip (4,096) again; with a heavy tail (the seeds' lengths: p90 five
times the median) that is where most of the reservation goes. Doubling keeps every part's charge
within twice what it decodes, for a log2 of extra requests on the longest prompts (each a prefill of
a prefix the radix cache holds). A follow-up goes next in line on its queue (workers/tasks.py
`hand_over`), not behind the prompts waiting there: its prefix is still in the host's cache, and a
run with 100,000 prompts queued does not park its partial completions in Redis for hours.

Why it cannot change a record: the follow-up of a cut at a staged cap is the exact continuation
(`replies.follow_up`): its input is the prompt's ids and every id generated so far, and it asks for
the next stage of the real cap. A model conditioned on its own prefix goes on as if the cap had been
larger from the start, so the record is the one a single request with the full cap gives, token for
token (tests/sglang_real/test_first_cap_on_sglang.py, on SGLang's own server); only `continued` counts the
extra part. The follow-up stays in the prompt's own queue (a cut at the first cap says nothing about
the prompt being long), and affinity routing sends it to the host whose radix cache holds its prefix
(the same leading prompt tokens rank the same host first: workers/upstreams.py).

`auto`: the cap is the `first_cap_quantile` (the median) of the dataset's finished completion lengths (the
histogram `status` reads, common/fleet_stats.py), once `first_cap_min_samples` have finished; until
then `first_cap_start`. Each worker re-reads it every `REFRESH_S`, so the cap follows the run. The
first completions to finish are the short ones, so an early quantile is low; that costs a
continuation's prefill for more prompts, never a different record.

Staging needs the ids a continuation is built from and the tokenizer that decodes them whole: over
the chat API, with `--regenerate all`, or on a worker without GENFLEET_TOKENIZER the first request
asks the full cap (the producer says so for the first two at enqueue, the worker for the last in
its start-up log). So it does with `--loop-guard flag`: a flagged loop runs on to the real cap,
and its finding belongs to the whole completion, while a continuation's guard judges only its own
tokens. A loop the guard stops (`abort`) ends the completion where one request would end it.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import replace

import redis

from genfleet.common.fleet_stats import read_lengths
from genfleet.common.records import TaskPayload
from genfleet.common.settings import Settings

log = logging.getLogger(__name__)

# How long a worker keeps a dataset's `auto` cap before reading the lengths again.
REFRESH_S = 30.0
# No first cap below this: a cut every few hundred tokens would cost a prefill per part for little
# KV room.
MIN_FIRST_CAP = 128
# Staged only when the first cap leaves at least this much of the real one: the KV saved is small
# below it, and a prompt whose real cap fills its context to within a few tokens would have a
# follow-up the scheduler refuses (its input bound is context - 6: 0.5.23 `managers/utils.py::
# validate_input_length`), losing the first part.
MIN_STAGED_REST = 64
# Each staged follow-up asks this many times the cap of the part before it (the module's docstring).
STAGE_GROWTH = 2


def staged(payload: TaskPayload, cap: int | None, *, api: str, exact_text: bool) -> TaskPayload:
    """The request to send for `payload`: its first request asking `cap` new tokens where staging
    applies, else `payload` itself. `exact_text`: the worker decodes the joined ids itself (it has
    the tokenizer); without it each part's text is the server's, and a cut inside a multi-byte
    character would lose that character (docs/running.md, "Limits of these options")."""
    if cap is None or cap > payload.max_new_tokens - MIN_STAGED_REST or not first_request(payload):
        return payload
    if api == "chat" or payload.input_ids is None or payload.regenerate != "last" or not exact_text:
        return payload  # nothing to continue from exactly
    if payload.loop_guard == "flag":
        # A flagged loop runs on to the real cap, and its finding (where it starts, how often it
        # repeats) belongs to the whole completion; the next part's guard only sees its own tokens.
        return payload
    return replace(payload, max_new_tokens=cap, staged_from=payload.max_new_tokens)


def next_stage(asked: int, left: int) -> int:
    """What the follow-up of a cut at a staged cap of `asked` tokens asks, with `left` of the real
    cap to go: twice `asked`, or all of `left` when twice would leave less than MIN_STAGED_REST."""
    ask = STAGE_GROWTH * asked
    return left if ask > left - MIN_STAGED_REST else ask


def first_request(payload: TaskPayload) -> bool:
    return payload.continuation is None and not payload.regenerated and payload.staged_from is None


class FirstCaps:
    """Each dataset's first cap, as `--first-max-new-tokens` asked: a number, or `auto` from the
    lengths its run has finished so far (one read per dataset per `REFRESH_S`, shared by the
    worker's threads)."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.client = client
        self.start = settings.first_cap_start
        self.quantile = settings.first_cap_quantile
        self.min_samples = settings.first_cap_min_samples
        self._lock = threading.Lock()
        self._auto: dict[tuple[str, str], tuple[float, int]] = {}  # (run, dataset) -> (read at, cap)

    def cap_for(self, payload: TaskPayload) -> int | None:
        wanted = payload.first_max_new_tokens
        if wanted is None or not first_request(payload):
            return None
        if wanted != "auto":
            return int(wanted)
        key = (payload.run, payload.dataset)
        with self._lock:
            read_at, cap = self._auto.get(key, (-math.inf, self.start))
            if time.monotonic() - read_at < REFRESH_S:
                return cap
            # Marked as read before the read: the other threads keep the last cap meanwhile.
            self._auto[key] = (time.monotonic(), cap)
        cap = self.auto_cap(payload.run, payload.dataset, previous=cap)
        with self._lock:
            self._auto[key] = (time.monotonic(), cap)
        return cap

    def auto_cap(self, run: str, dataset: str, *, previous: int) -> int:
        try:
            lengths = read_lengths(self.client, run, [dataset])[dataset]
        except redis.RedisError as error:
            log.warning("first cap of %s/%s: lengths unreadable (%s); keeping %d", run, dataset, error, previous)
            return previous
        if lengths.samples < self.min_samples:
            return self.start
        return auto_value(lengths.quantile(self.quantile), start=self.start)

    def current(self) -> dict[tuple[str, str], int]:
        """The `auto` caps this worker last used, per (run, dataset): for its beacon and metrics."""
        with self._lock:
            return {key: cap for key, (_, cap) in self._auto.items()}


def auto_value(quantile: float | None, *, start: int) -> int:
    """The cap for a dataset whose finished lengths have this quantile: rounded up to a multiple
    of 64 (so a cap moves in steps, not with every record), never below MIN_FIRST_CAP."""
    if quantile is None:
        return start
    return max(MIN_FIRST_CAP, 64 * math.ceil(quantile / 64))
