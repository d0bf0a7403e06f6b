"""Fault injection: which requests fail, how, and how far into their output."""
from __future__ import annotations

import enum
import random
from dataclasses import dataclass


class ErrorFormat(str, enum.Enum):
    """Which SGLang release's error chunks to imitate."""

    V0_5_23 = "0.5.23"  # {"error": {"message", "type", "code", "retryable"}}
    V0_5_2 = "0.5.2"  # {"error": {"message"}}


class FaultKind(enum.Enum):
    HTTP_500 = "http_500"  # HTTP 500 before any byte of the response
    ABORT = "abort"  # a scheduler abort: 503 "The request queue is full."
    ERROR_CHUNK = "error_chunk"  # an internal error chunk mid-stream
    STALL = "stall"  # the stream goes silent and never finishes


@dataclass(frozen=True)
class FaultSettings:
    """Per-request probabilities (0..1) of each fault; the first that fires wins, in this order."""

    http_500_rate: float = 0.0
    abort_rate: float = 0.0
    error_chunk_rate: float = 0.0
    stall_rate: float = 0.0
    die_after: float | None = None
    seed: int = 0
    error_format: ErrorFormat = ErrorFormat.V0_5_23

    def rates(self) -> dict[FaultKind, float]:
        return {
            FaultKind.HTTP_500: self.http_500_rate,
            FaultKind.ABORT: self.abort_rate,
            FaultKind.ERROR_CHUNK: self.error_chunk_rate,
            FaultKind.STALL: self.stall_rate,
        }

    def describe(self) -> str:
        active = [f"{kind.value} {rate:g}" for kind, rate in self.rates().items() if rate > 0]
        if self.die_after is not None:
            active.append(f"die after {self.die_after:g}s")
        return ", ".join(active) or "none"


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    position: float  # how far into the output it strikes, in [0, 1)

    def at_token(self, completion_tokens: int) -> int:
        """The generated-token count at which it strikes: at least one token in, before the last."""
        return min(completion_tokens, 1 + int(self.position * max(completion_tokens - 1, 1)))


class FaultInjector:
    """Draws each request's fault, in arrival order, from one RNG seeded by `--fault-seed`."""

    def __init__(self, settings: FaultSettings) -> None:
        self.settings = settings
        self._rng = random.Random(settings.seed)

    def draw(self) -> Fault | None:
        # Always the same number of draws per request, so request k's fate depends only on the
        # seed and k, not on which rates happen to be zero.
        rolls = [(kind, rate, self._rng.random()) for kind, rate in self.settings.rates().items()]
        position = self._rng.random()
        for kind, rate, roll in rolls:
            if roll < rate:
                return Fault(kind, position)
        return None
