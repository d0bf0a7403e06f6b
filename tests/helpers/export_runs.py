"""`genfleet export` run in this process, over a finished real run's shards (`SampleRun`) or a
hand-made one with the Redis state a finished run leaves (`synthetic_run`, and `sampled_run` for a
dataset with `--samples` and the config its producer records)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import redis
from typer.testing import CliRunner

from genfleet.cli import app
from genfleet.common.keys import ManifestFields
from genfleet.common.records import CompletionRecord, Timing, Usage
from genfleet.common.run_state import Outcome, RunManifest, RunState
from genfleet.producer.manifest import config_hash, tokenizer_fingerprint
from helpers.fleet import shard_records
from helpers.paths import TOKENIZER

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


def sampled_run(root: Path, client: redis.Redis, run: str, prompts: int, samples: int) -> list[CompletionRecord]:
    """`prompts` prompts of dataset `sampled`, `samples` completions each (`--samples`), in one shard,
    with the Redis state a finished run leaves and the config its producer records (the run's: parser,
    tokenizer fingerprint and directory, config hash; the dataset's: sampling, max_new_tokens, samples).
    Shapes vary line to line as real data does: even prompts open with a system message naming its
    author (`name`), and only sample 0 has reasoning."""
    state = RunState(client, run)
    config = {"sampling": {"temperature": 0.6, "top_p": 0.95}, "max_new_tokens": {"short": 512, "long": 2048},
              "samples": samples, "chat_template_kwargs": {}}
    identity = {"regenerate": "last", "keep_token_ids": False, "reasoning_parser": "kimi_k2",
                "tokenizer": tokenizer_fingerprint(TOKENIZER)}
    RunManifest(client, run).record({
        ManifestFields.CONFIG: json.dumps(identity), ManifestFields.CONFIG_HASH: config_hash(identity),
        ManifestFields.TOKENIZER_DIR: str(TOKENIZER), ManifestFields.source("sampled"): "sampled.jsonl",
        ManifestFields.dataset_config("sampled"): json.dumps(config)}, ["sampled"])
    records = []
    for prompt in range(prompts):
        system = [{"role": "system", "content": "be brief", "name": "ops"}] if prompt % 2 == 0 else []
        for k in range(samples):
            slot = prompt * samples + k
            records.append(CompletionRecord(
                id=f"sampled/{prompt}#{k}", run=run, dataset="sampled", partition="short",
                messages=[*system, {"role": "user", "content": f"pick a number, {prompt}"}],
                reasoning="let me think" if k == 0 else "", content=f"{prompt * 10 + k}", finish_reason="stop",
                matched_stop=None, usage=Usage(prompt_tokens=8, completion_tokens=3 + k, reasoning_tokens=0,
                                               cached_tokens=0),
                upstream="sim", model="sim-model", sampling=config["sampling"], timing=Timing(0.0, 0.0, None, 1.0),
                attempts=1, worker="w", row=slot, sample=k))
            client.setbit(state.keys.enqueued("sampled"), slot, 1)
            state.mark_done("sampled", slot, Outcome(8, 3 + k, 0, False, k > 0, False))
    state.count("sampled", "total", prompts * samples)
    shards = root / run / "sampled"
    shards.mkdir(parents=True)
    (shards / "w-00000.jsonl").write_bytes(b"".join(record.to_json_line() for record in records))
    return records
