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
    # Corruptions for clients' integrity checks, drawn apart from the faults above and on top of
    # them (a request can both lose a chunk and be aborted).
    drop_chunk_rate: float = 0.0  # one non-final chunk of a stream is silently not sent
    miscount_rate: float = 0.0  # the last completion_tokens reported is one too many

    def rates(self) -> dict[FaultKind, float]:
        return {
            FaultKind.HTTP_500: self.http_500_rate,
            FaultKind.ABORT: self.abort_rate,
            FaultKind.ERROR_CHUNK: self.error_chunk_rate,
            FaultKind.STALL: self.stall_rate,
        }

    def corruption_rates(self) -> dict[str, float]:
        return {"drop_chunk": self.drop_chunk_rate, "miscount": self.miscount_rate}

    def describe(self) -> str:
        active = [f"{kind.value} {rate:g}" for kind, rate in self.rates().items() if rate > 0]
        active += [f"{name} {rate:g}" for name, rate in self.corruption_rates().items() if rate > 0]
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


@dataclass(frozen=True)
class Corruption:
    """How a request's stream is corrupted, for clients' integrity checks."""

    # Where the dropped chunk sits among the stream's non-final chunks, in [0, 1); None: none is.
    drop_chunk: float | None = None
    # The last completion_tokens reported (final chunk's meta_info, or usage) is one too many.
    miscount: bool = False

    def dropped_chunk(self, counts: list[int]) -> int | None:
        """Which of a stream's non-final chunk counts is not sent: None unless there are two."""
        if self.drop_chunk is None or len(counts) < 2:
            return None
        return counts[min(len(counts) - 1, int(self.drop_chunk * len(counts)))]

    @property
    def count_bias(self) -> int:
        return 1 if self.miscount else 0


class FaultInjector:
    """Draws each request's fault, in arrival order, from one RNG seeded by `--fault-seed`; its
    corruption from a second one, so that adding corruptions leaves every fault where it was."""

    def __init__(self, settings: FaultSettings) -> None:
        self.settings = settings
        self._rng = random.Random(settings.seed)
        self._corruption_rng = random.Random(f"sim-corruption:{settings.seed}")

    def draw(self) -> Fault | None:
        # Always the same number of draws per request, so request k's fate depends only on the
        # seed and k, not on which rates happen to be zero.
        rolls = [(kind, rate, self._rng.random()) for kind, rate in self.settings.rates().items()]
        position = self._rng.random()
        for kind, rate, roll in rolls:
            if roll < rate:
                return Fault(kind, position)
        return None

    def draw_corruption(self) -> Corruption | None:
        # Three draws per request whatever the rates, like `draw`.
        drop_roll, position, miscount_roll = (self._corruption_rng.random() for _ in range(3))
        drop = position if drop_roll < self.settings.drop_chunk_rate else None
        miscount = miscount_roll < self.settings.miscount_rate
        return Corruption(drop, miscount) if drop is not None or miscount else None
