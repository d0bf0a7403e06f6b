"""How long a completion is: lognormal in words, or (`--length-tokens`) exactly N tokens."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class LengthModel:
    """Lognormal completion length (reasoning plus content words), fitted by its median and mean."""

    median: float = 646.0
    mean: float = 1416.0
    scale: float = 1.0
    reasoning_share: float = 0.7
    # `--length-tokens LO:HI`: each completion is exactly this many tokens long (markers and the
    # stop token included), uniform over [LO, HI]; the lognormal above is then unused.
    tokens: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.tokens is not None and not 1 <= self.tokens[0] <= self.tokens[1]:
            raise ValueError(f"length tokens need 1 <= LO <= HI, got {self.tokens[0]}:{self.tokens[1]}")

    def draw_tokens(self, rng: random.Random) -> int:
        """The exact completion length in tokens (only with `tokens` set)."""
        assert self.tokens is not None
        low, high = self.tokens
        return rng.randint(low, high)

    def draw_words(self, rng: random.Random) -> int:
        # For a lognormal, mean / median = exp(sigma^2 / 2).
        sigma = math.sqrt(2.0 * math.log(self.mean / self.median)) if self.mean > self.median else 0.0
        return max(2, round(rng.lognormvariate(math.log(self.median), sigma) * self.scale))

    def split(self, words: int) -> tuple[int, int]:
        """Reasoning and content word counts, each at least one; a share of exactly 0 models a
        reasoning model that closes its thought at once (empty reasoning, the alarm's case)."""
        reasoning = max(1, round(words * self.reasoning_share)) if self.reasoning_share > 0 else 0
        return reasoning, max(1, words - reasoning)

    def split_exact(self, words: int) -> tuple[int, int]:
        """Reasoning and content word counts that add up to exactly `words` (for exact lengths):
        content gets the first word, reasoning (with a share above 0) the second."""
        if words <= 0:
            return 0, 0
        reasoning = max(1, round(words * self.reasoning_share)) if self.reasoning_share > 0 else 0
        reasoning = min(reasoning, words - 1)
        return reasoning, words - reasoning
