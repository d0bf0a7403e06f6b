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
from dataclasses import replace

from common.records import TaskPayload


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
