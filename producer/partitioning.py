"""Which queue a prompt goes to: a pinned dataset decides, else its total token need."""
from __future__ import annotations

from genfleet.common.queues import LONG, SHORT


def choose_partition(prompt_tokens: int, *, pinned: str | None, max_new_tokens_short: int,
                     long_threshold: int) -> str:
    if pinned is not None:
        return pinned
    return LONG if prompt_tokens + max_new_tokens_short > long_threshold else SHORT
