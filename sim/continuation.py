"""Continuing a cut completion: a `/generate` request whose `input_ids` are an earlier request's
`input_ids + output_ids`, where that earlier request was cut (finished by "length", aborted, its
client gone, struck by a fault mid-stream), goes on with the same completion.

What it returns is the tail of the completion planned for the ORIGINAL prompt and seed with
max_new_tokens = (tokens already generated) + (this request's max_new_tokens), from the offset
already generated: continuing is the same, id for id, as having asked the larger budget at once,
as a real model conditioned on its own prefix would be, statistically. So the reasoning goes on
where it was (a prefix cut inside the reasoning gets its close marker later, as the longer plan
writes it), a looping completion keeps looping, and a continuation can itself be continued.

- The request's own sampling_seed is not used: the completion is the original's.
- `prompt_tokens` is `len(input_ids)`, the prefix included; prefill costs what any prompt does.
- The finish reason is this request's: `{"type": "length", "length": <its max_new_tokens>}`, or
  the stop token when the longer plan reaches it.
- The completion log's line of a continuation says `"continues": <rid it continues>`, and its
  `output_ids` and `text` are the tail only.
- A cut is remembered with the ids its client was sent: everything the response carried, or, for
  a client that left mid-stream, what was written before it left. Continuing from fewer ids (a
  client that lost chunks) is a new prompt. Text prompts count as their tokenizer ids.
- The sim remembers the last `MAX_CUTS` cuts (LRU), keyed by a blake2b digest of the id sequence,
  each as its completion seed, opening and offset (never the prompt itself).
"""
from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import blake2b

from genfleet.sim.completion import CompletionPlan, Layout, assemble_plan
from genfleet.sim.prompts import Opening

MAX_CUTS = 200_000


@dataclass(frozen=True, slots=True)
class Cut:
    """A completion cut after `generated` tokens, by the request `rid`."""

    rid: str
    rng_seed: int
    opening: Opening
    generated: int  # from the completion's very start, earlier continuations included


def continuation_tail(whole: CompletionPlan, offset: int, max_new_tokens: int) -> CompletionPlan:
    """What a continuation `offset` tokens in returns: `whole` (planned with a budget of offset +
    max_new_tokens) from `offset` on, its layout shifted, its finish the continuation's own."""
    ids = whole.output_ids[offset:]
    finish = whole.finish_reason if whole.stopped else {"type": "length", "length": max_new_tokens}
    layout = Layout(
        max(whole.reasoning_start - offset, 0),
        max(whole.reasoning_end - offset, 0),
        max(whole.content_start - offset, 0),
    )
    return assemble_plan(
        ids, finish, layout, opening=whole.opening, reasoning_format=whole.reasoning_format, vocab=whole.vocab,
        rng_seed=whole.rng_seed,
        loop_start=None if whole.loop_start is None else max(whole.loop_start - offset, 0),
        loop_period=whole.loop_period,
    )


def ids_digest(ids: Sequence[int]) -> bytes:
    """The key of an id sequence (ids are u32: checked when the request was parsed)."""
    return blake2b(array("I", ids).tobytes(), digest_size=16).digest()


class CutCompletions:
    """The cut completions a request may continue, least recently used dropped first."""

    def __init__(self, max_entries: int = MAX_CUTS) -> None:
        self._max_entries = max_entries
        self._cuts: OrderedDict[bytes, Cut] = OrderedDict()

    def __len__(self) -> int:
        return len(self._cuts)

    def remember(self, prompt_ids: Sequence[int], output_ids: Sequence[int], cut: Cut) -> None:
        """`prompt_ids + output_ids` continues `cut` from now on."""
        key = ids_digest([*prompt_ids, *output_ids])
        self._cuts[key] = cut
        self._cuts.move_to_end(key)
        if len(self._cuts) > self._max_entries:
            self._cuts.popitem(last=False)

    def find(self, input_ids: Sequence[int]) -> Cut | None:
        """The cut these ids continue, if any (kept: a failed continuation may be asked again)."""
        if not self._cuts:
            return None  # no digest to compute until something was cut
        key = ids_digest(input_ids)
        cut = self._cuts.get(key)
        if cut is not None:
            self._cuts.move_to_end(key)
        return cut
