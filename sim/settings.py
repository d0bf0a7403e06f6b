"""Everything a simulated server is configured with, as one typed object."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sim.capacity import CapacitySettings
from sim.completion import LengthModel
from sim.faults import FaultSettings
from sim.reasoning_formats import DEFAULT_REASONING_FORMAT
from sim.vocab import DEFAULT_TOKENIZER_DIR

DEFAULT_CONTEXT_LENGTH = 32768


@dataclass(frozen=True)
class SimSettings:
    port: int
    host: str = "127.0.0.1"
    tokenizer_dir: Path = DEFAULT_TOKENIZER_DIR
    capacity: CapacitySettings = field(default_factory=CapacitySettings)
    lengths: LengthModel = field(default_factory=LengthModel)
    stream_interval: int = 1  # SGLang's --stream-interval default
    incremental: bool = False  # SGLang's --incremental-streaming-output
    seed: int = 0
    context_length: int = DEFAULT_CONTEXT_LENGTH
    tick: float = 0.02
    faults: FaultSettings = field(default_factory=FaultSettings)
    reasoning_format: str = DEFAULT_REASONING_FORMAT  # an SGLang --reasoning-parser name

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def describe(self) -> str:
        capacity, lengths = self.capacity, self.lengths
        running = f", max running {capacity.max_running}" if capacity.max_running is not None else ""
        return (
            f"rate {capacity.rate:g} tok/s, knee {capacity.knee:g}{running}, "
            f"length median {lengths.median:g} mean {lengths.mean:g} x{lengths.scale:g}, "
            f"{'incremental' if self.incremental else 'cumulative'} stream every {self.stream_interval}, "
            f"reasoning {self.reasoning_format}, seed {self.seed}, context {self.context_length}, "
            f"faults: {self.faults.describe()}"
        )
