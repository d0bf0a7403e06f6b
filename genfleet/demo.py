"""`genfleet demo`: the whole pipeline on one box, on the bundled sample datasets.

The bundled sample datasets, named like the seeds' (B1_glaive … B8_sweagent), in the shapes those
datasets really have, plus two rows the producer must reject.

Deterministic: the same seed and scale give the same files, byte for byte, so a demo or a test
that re-runs on them enqueues the same prompt ids. It lives in the package, not beside the
repository's scripts, because `genfleet demo` runs from an installed wheel; its words come from the
simulator's vocabulary, which is package data (`sim/model/`).

    python -m genfleet.demo OUT_DIR [--scale 1.0]

`genfleet demo` (and `make demo`): the whole pipeline on one box against the simulator.

It is `genfleet run` (`onebox/job.py`) with the simulator as its server and the bundled sample
data as its datasets: an embedded redis-server under `{workdir}/output/`, the short and long pools,
the producer and (unless `--no-flower`) Flower; live progress and a summary; Ctrl-C stops every
process it started. What is the demo's own is here: the sample data and the simulator's flags.

It runs from an installed package as well as from the repository: everything it needs is package
data (the simulator's model in `sim/model/`, the Lua scripts in `common/`) or a child process of
this same interpreter (`python -m genfleet ...`); the working directory is the user's (`--workdir`,
`./.demo` by default). redis-server is the one program it needs from outside.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from genfleet.onebox.embedded_redis import EmbeddedRedisError
from genfleet.onebox.processes import free_port, genfleet
from genfleet.sim.vocab import DEFAULT_TOKENIZER_DIR

SEED = 20261129


def load_words() -> list[str]:
    vocab = json.loads((DEFAULT_TOKENIZER_DIR / "tokenizer.json").read_text())["model"]["vocab"]
    return sorted(token[1:] for token in vocab if token.startswith("Ġ") and token[1:].isalpha()
                  and token[1:].islower() and len(token) > 3)


class TextMaker:
    def __init__(self, rng: random.Random, words: list[str]) -> None:
        self.rng, self.words = rng, words

    def sentence(self, low: int = 6, high: int = 16) -> str:
        picked = self.rng.choices(self.words, k=self.rng.randint(low, high))
        return " ".join(picked).capitalize() + "."

    def paragraph(self, sentences: int) -> str:
        return " ".join(self.sentence() for _ in range(sentences))


def glaive(t: TextMaker, i: int) -> dict:
    tools = json.dumps({"name": f"get_{t.rng.choice(t.words)}", "parameters": {"type": "object"}})
    return {"id": f"glaive-{i:05d}", "messages": [
        {"role": "system", "content": f"You can call functions. {tools}"},
        {"role": "user", "content": t.paragraph(2)},
        {"role": "assistant", "content": t.paragraph(1)},
    ]}


def opencodeinstruct(t: TextMaker, i: int) -> dict:
    return {"id": f"oci-{i:05d}", "prompt": "Write a function. " + t.paragraph(t.rng.randint(2, 5))}


def magicoder(t: TextMaker, i: int) -> dict:
    return {"conversations": [{"role": "user", "content": t.paragraph(t.rng.randint(3, 8))}]}


def mixture_of_thoughts(t: TextMaker, i: int) -> dict:
    return {"messages": [{"role": "user", "content": t.paragraph(t.rng.randint(1, 4))},
                         {"role": "assistant", "content": "<think>" + t.paragraph(3) + "</think>" + t.sentence()}]}


def openthoughts(t: TextMaker, i: int) -> dict:
    return {"system": "Think step by step.", "conversations": [
        {"from": "system", "value": "Think step by step."},
        {"from": "human", "value": t.paragraph(t.rng.randint(2, 6))},
        {"from": "gpt", "value": t.paragraph(4)},
    ]}


def ultrachat(t: TextMaker, i: int) -> dict:
    turns = []
    for _ in range(t.rng.randint(1, 3)):
        turns += [{"role": "user", "content": t.paragraph(2)}, {"role": "assistant", "content": t.paragraph(2)}]
    return {"id": f"ultrachat-{i:05d}", "messages": turns}


def sharegpt(t: TextMaker, i: int) -> dict:
    turns = []
    for _ in range(t.rng.randint(1, 4)):
        turns += [{"from": "human", "value": t.paragraph(2)}, {"from": "gpt", "value": t.paragraph(2)}]
    return {"id": f"sharegpt-{i:05d}", "conversations": turns}


def sweagent(t: TextMaker, i: int) -> dict:
    """A long agent trajectory: many tool observations; pinned to the long queue."""
    turns = [{"role": "system", "content": "You are an autonomous software engineer. " + t.paragraph(3)},
             {"role": "user", "content": "Fix the issue. " + t.paragraph(6)}]
    for _ in range(t.rng.randint(6, 14)):
        turns += [{"role": "assistant", "content": t.paragraph(2)},
                  {"role": "tool", "content": t.paragraph(t.rng.randint(10, 30))},
                  {"role": "user", "content": "Observation noted. " + t.sentence()}]
    return {"instance_id": f"swe-{i:05d}", "messages": turns}


# name, maker, rows at scale 1, pinned partition
DATASETS = [
    ("B1_glaive", glaive, 200, None),
    ("B2_opencodeinstruct", opencodeinstruct, 250, None),
    ("B3_magicoder", magicoder, 150, None),
    ("B4_mixture_of_thoughts", mixture_of_thoughts, 200, None),
    ("B5_openthoughts", openthoughts, 150, None),
    ("B6_ultrachat", ultrachat, 200, None),
    ("B7_sharegpt", sharegpt, 200, None),
    ("B8_sweagent", sweagent, 100, "long"),
]

# Two rows the producer must reject, to show how it reports them (file and line, reason).
BAD_LINES = {"B7_sharegpt": ['{"conversations": [{"from": "human", "value": "unterminated',
                             '{"conversations": [{"from": "gpt", "value": "an answer with no question"}]}']}


def rows_at(rows: int, scale: float) -> int:
    """A dataset's good rows at `scale`: never none, so every dataset shows up in a small demo."""
    return max(1, int(rows * scale))


def write_datasets(out: Path, *, scale: float = 1.0, seed: int = SEED) -> list[tuple[str, Path, str | None]]:
    """Writes one `{name}.jsonl` per dataset into `out`; returns (name, path, pinned partition)."""
    words = load_words()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, maker, rows, pinned in DATASETS:
        maker_text = TextMaker(random.Random(f"{seed}:{name}"), words)
        lines = [json.dumps(maker(maker_text, i)) for i in range(rows_at(rows, scale))]
        for offset, bad in enumerate(BAD_LINES.get(name, [])):
            lines.insert(7 + 5 * offset, bad)
        path = out / f"{name}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        written.append((name, path, pinned))
    return written


def dataset_args(written: list[tuple[str, Path, str | None]]) -> list[str]:
    """`NAME=PATH[:long]` arguments for `genfleet enqueue`."""
    return [f"{name}={path}" + (f":{pinned}" if pinned else "") for name, path, pinned in written]


def main(default_out: Path = Path("sample-data")) -> None:
    """Writes the datasets and prints their `genfleet enqueue` arguments."""
    parser = argparse.ArgumentParser(description="Write the bundled sample datasets; print their enqueue arguments.")
    parser.add_argument("out", nargs="?", type=Path, default=default_out, help=f"directory (default: {default_out})")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every dataset's row count")
    args = parser.parse_args()
    written = write_datasets(args.out, scale=args.scale)
    print(" ".join(dataset_args(written)))


if __name__ == "__main__":
    main()


# Without a terminal (a pipe, CI), a progress line this often: the demo's whole run is a minute or two.
PROGRESS_EVERY_S = 5.0
REDIS_MISSING = ("genfleet demo: redis-server is not on PATH; install it (Debian/Ubuntu: "
                 "`sudo apt-get install redis-server`, macOS: `brew install redis`) and retry")


@dataclass(frozen=True)
class DemoOptions:
    workdir: Path
    scale: float
    flower_port: int | None  # None: no Flower
    hold: bool
    sim_rate: float = 100.0


def demo_command(
    workdir: Annotated[Path, typer.Option(help="Sample data, shards and logs")] = Path(".demo"),
    scale: Annotated[float, typer.Option(
        min=0.0, help="Sample data size: 1.0 is 1,450 prompts (~1.5 min on 2 cores); 0.02 is 29")] = 1.0,
    flower: Annotated[bool, typer.Option(help="Start Flower (behind basic auth) beside the fleet")] = True,
    flower_port: Annotated[int, typer.Option(help="Flower's port")] = 5555,
    hold: Annotated[bool, typer.Option(help="Keep everything running after the run, until Ctrl-C")] = False,
    sim_rate: Annotated[float, typer.Option(
        min=0.001, help="The simulator's decode tokens/s of a lone request; 2000 makes a quick run")] = 100.0,
) -> None:
    """`genfleet run` on the bundled sample data against the simulator: an embedded redis-server, a short
    and a long worker and Flower; live progress, then a summary. Needs redis-server on PATH."""
    if shutil.which("redis-server") is None:
        typer.echo(REDIS_MISSING, err=True)
        raise typer.Exit(1)
    options = DemoOptions(workdir, scale, flower_port if flower else None, hold, sim_rate)
    try:
        status = run_demo(options)
    except EmbeddedRedisError as error:
        typer.echo(f"genfleet demo: {error}", err=True)
        raise typer.Exit(1) from None
    raise typer.Exit(status)


def run_demo(options: DemoOptions) -> int:
    """`genfleet run` on the simulator and the sample data: the same job, the same code path, a
    user's first command against a real server would run. Returns the job's exit status."""
    from genfleet.onebox.job import JobPlan, run_job

    workdir = options.workdir.resolve()
    datasets = dataset_args(write_datasets(workdir / "data", scale=options.scale))
    sim_port = free_port()
    sim_url = f"http://127.0.0.1:{sim_port}"
    run = time.strftime("demo-%Y%m%d-%H%M%S")
    # The demo's records are small: a laptop with little free disk still runs it.
    os.environ.setdefault("GENFLEET_MIN_FREE_DISK_MB", "16")
    plan = JobPlan(
        run=run, upstreams=(sim_url,), out=workdir / "output",
        enqueue_args=("--run", run, "--tokenizer", str(DEFAULT_TOKENIZER_DIR), *datasets),
        redis_url=None,  # always the job's own, embedded under the demo's output: never a Redis of the user's
        servers=(("sim", tuple(genfleet("sim", "--port", str(sim_port), "--length-scale", "0.1",
                                         "--rate", str(options.sim_rate)))),),
        flower_port=options.flower_port, progress_every_s=PROGRESS_EVERY_S, hold=options.hold)
    return run_job(plan)
