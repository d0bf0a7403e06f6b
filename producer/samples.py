"""`--samples N`: N independent completions of each prompt, each its own task.

Sample k of the prompt in row r takes the row slot `r * N + k` in the run's enqueued and done
bitmaps, so every sample is enqueued, retried, dead-lettered, requeued and settled on its own, and a
re-run of `enqueue` publishes exactly the samples not yet claimed. Its id is `{prompt id}#{k}`.

Its `sampling_seed` is derived from the prompt id, the sample index and the run's `--seed` (0 when
none), so the same run file asks the same seeds again. SGLang honours a per-request seed only under
`--enable-deterministic-inference` (0.5.23 `sampling/sampling_batch_info.py` builds the seed tensor
only `if enable_deterministic`); without it the samples are still independent draws (sampling is
random at temperature > 0), just not reproducible.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace
from typing import TypeVar

from genfleet.common.records import TaskPayload

T = TypeVar("T")
# Prompts whose samples are interleaved in the queue: sample k of a prompt follows sample k-1 by
# this many tasks, long enough for the first one's prefill to be cached on its host before the next
# arrives, short enough that the cache still holds it.
SPREAD_GROUP = 256


def sample_slots(row: int, samples: int) -> list[int]:
    """The bitmap slots of a prompt's samples (the row itself without `--samples`)."""
    return [row * samples + k for k in range(samples)]


def sample_seed(prompt_id: str, sample: int, base_seed: int = 0) -> int:
    """A seed in SGLang's accepted range ([-2**63, 2**63 - 1], `SamplingParams.verify`), stable
    across processes and machines (never Python's salted hash)."""
    digest = hashlib.blake2b(f"{base_seed}\0{prompt_id}\0{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def sample_payload(base: TaskPayload, slot: int, samples: int) -> TaskPayload:
    sample = slot % samples
    sampling = {**base.sampling,
                "sampling_seed": sample_seed(base.id, sample, int(base.sampling.get("sampling_seed") or 0))}
    return replace(base, id=f"{base.id}#{sample}", row=slot, sample=sample, sampling=sampling)


def spread_samples(per_prompt: Sequence[Sequence[T]], group: int = SPREAD_GROUP) -> list[T]:
    """The queue order of a batch's tasks: within each group of prompts, every prompt's sample 0,
    then every sample 1, ... SGLang's default FCFS scheduler prefills requests that arrive together
    in one batch, so samples of one prompt sent back to back would all miss its prefix cache
    (in-batch prefix caching only applies to the cache-aware policies: 0.5.23
    `managers/schedule_policy.py::_compute_prefix_matches`; the default is "fcfs",
    `arg_groups/fields/schedule.py`). Spread out, each later sample finds the prompt cached on the
    host its affinity key routes it to (workers/upstreams.py)."""
    ordered: list[T] = []
    for start in range(0, len(per_prompt), group):
        chunk = per_prompt[start:start + group]
        for k in range(max((len(tasks) for tasks in chunk), default=0)):
            ordered += [tasks[k] for tasks in chunk if k < len(tasks)]
    return ordered
