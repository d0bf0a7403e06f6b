"""What a prompt decides about its completion: the completion's RNG seed and who opens the reasoning."""
from __future__ import annotations

import enum
import hashlib
import sys
from array import array
from collections.abc import Sequence

from genfleet.sim.vocab import THINK_END, THINK_START, SimVocab


class Opening(enum.Enum):
    """Where the prompt leaves the model: the chat template decides who writes `<think>`."""

    INSIDE_REASONING = "inside"  # prompt ends with <think> (Kimi-K2.5): output holds only </think>
    THINKING_OFF = "off"  # prompt ends with <think></think>: output is the answer alone
    MODEL_OPENS = "model"  # the model writes <think> itself (DeepSeek-R1 old, Qwen3)
    # Formats with other markers (kimi's ◁think▷, gpt-oss's channels) always open them
    # themselves; THINKING_OFF still means content only, for every format.


def completion_seed(prompt: Sequence[int] | str, seed: int) -> int:
    """A process-independent RNG seed (never Python's salted `hash()`)."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(prompt_bytes(prompt))
    digest.update((seed & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "little"))
    return int.from_bytes(digest.digest(), "little")


def prompt_opening(prompt: Sequence[int] | str, vocab: SimVocab) -> Opening:
    if isinstance(prompt, str):
        if prompt.endswith(THINK_START + THINK_END):
            return Opening.THINKING_OFF
        return Opening.INSIDE_REASONING if prompt.endswith(THINK_START) else Opening.MODEL_OPENS
    tail = list(prompt[-2:])
    if tail == [vocab.think_start_id, vocab.think_end_id]:
        return Opening.THINKING_OFF
    return Opening.INSIDE_REASONING if tail[-1:] == [vocab.think_start_id] else Opening.MODEL_OPENS


def prompt_bytes(prompt: Sequence[int] | str) -> bytes:
    """A text's UTF-8, or the ids as little-endian uint32 (OverflowError outside that range)."""
    if isinstance(prompt, str):
        return prompt.encode("utf-8")
    ids = array("I", prompt)
    if sys.byteorder == "big":
        ids.byteswap()
    return ids.tobytes()
