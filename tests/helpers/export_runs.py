"""`genfleet export` run in this process, over a finished real run's shards (`SampleRun`) or a
hand-made one with the Redis state a finished run leaves (`synthetic_run`)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import redis
from typer.testing import CliRunner

from common.records import CompletionRecord, Timing, Usage
from common.run_state import Outcome, RunState
from genfleet.cli import app
from helpers.fleet import shard_records

EXIT_INCOMPLETE, EXIT_ABORTED = 1, 3


def run_export(run: str, sources: tuple[Path, ...], out: Path, *args: str,
               redis_url: str | None = None) -> tuple[int, str, dict]:
    """Runs `genfleet export` in-process; returns the exit code, the output and the manifest."""
    argv = ["export", "--run", run, "--out", str(out), *args]
    for source in sources:
        argv += ["--from", str(source)]
    if redis_url is not None:
        argv += ["--redis-url", redis_url]
    result = CliRunner().invoke(app, argv, catch_exceptions=False)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    return result.exit_code, result.output, manifest


class SampleRun:
    """A finished real run (sample data, token ids kept); tests export copies of its shards."""

    RUN = "exp"

    def __init__(self, redis_url: str, output: Path) -> None:
        self.redis_url, self.output = redis_url, output

    def records(self) -> list[dict]:
        return shard_records(self.output, self.RUN)

    def copy(self, to: Path) -> Path:
        shutil.copytree(self.output, to)
        return to

    def export(self, out: Path, *args: str, sources: tuple[Path, ...] | None = None) -> tuple[int, str, dict]:
        return run_export(self.RUN, sources or (self.output,), out, *args, redis_url=self.redis_url)


def synthetic_run(root: Path, client: redis.Redis, run: str, count: int) -> list[CompletionRecord]:
    """`count` records of dataset `syn` in two shards, with the Redis state a finished run leaves:
    record i has 10 * (i + 1) completion tokens, every fifth is truncated, every seventh has no
    reasoning, and content of i characters."""
    state = RunState(client, run)
    state.register_dataset("syn", "synthetic.jsonl")
    records = []
    for row in range(count):
        record = CompletionRecord(
            id=f"syn/{row}", run=run, dataset="syn", partition="short",
            messages=[{"role": "user", "content": f"question {row}"}],
            reasoning="" if row % 7 == 0 else f"thinking about {row}", content="x" * row,
            finish_reason="length" if row % 5 == 0 else "stop", matched_stop=None,
            usage=Usage(prompt_tokens=5, completion_tokens=10 * (row + 1), reasoning_tokens=4 * (row + 1),
                        cached_tokens=0),
            upstream="sim", model="sim-model", sampling={}, timing=Timing(0.0, 0.0, None, 1.0),
            attempts=1, worker="w", row=row)
        records.append(record)
        client.setbit(state.keys.enqueued("syn"), row, 1)
        state.mark_done("syn", row, Outcome(5, 10 * (row + 1), 4 * (row + 1), row % 5 == 0, False, False))
    state.count("syn", "total", count)
    shards = root / run / "syn"
    shards.mkdir(parents=True)
    half = count // 2
    (shards / "w-00000.jsonl").write_bytes(b"".join(r.to_json_line() for r in records[:half]))
    (shards / "w-00001.jsonl.open").write_bytes(b"".join(r.to_json_line() for r in records[half:]))
    return records
