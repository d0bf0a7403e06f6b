"""Peak memory of `genfleet export` over 1,000,000 small synthetic records: it must stay flat.

Writes a run's shards once (4 datasets, 20 shards, short records), then runs `genfleet export` as a
child process per variant and reads that child's own peak RSS from `wait4` (ru_maxrss). The 100k
variant against the 1M ones shows whether memory grows with the number of records; the reconciled
variant runs against a throwaway redis-server holding the matching run state (when one is installed).

    .venv/bin/python bench/export_memory.py [--records 1000000] [--workdir DIR] [--json]

Not part of the test suite (it writes about 0.5 GB and takes a few minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from genfleet.common.keys import ManifestFields, RunKeys  # noqa: E402

DATASETS = ("alpha", "beta", "gamma", "delta")
SHARDS_PER_DATASET = 5


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_run(root: Path, run: str, records: int) -> int:
    """`records` short completion records spread over the datasets; returns rows per dataset."""
    per_dataset = records // len(DATASETS)
    per_shard = -(-per_dataset // SHARDS_PER_DATASET)
    template = {
        "id": "", "run": run, "dataset": "", "partition": "short", "messages": [], "reasoning": "",
        "content": "", "finish_reason": "stop", "matched_stop": 2,
        "usage": {"prompt_tokens": 12, "completion_tokens": 0, "reasoning_tokens": 0, "cached_tokens": 0},
        "upstream": "http://sim:30000", "model": "bench-model", "sampling": {"temperature": 0.7},
        "timing": {"enqueued_at": 0.0, "started_at": 0.0, "first_token_s": 0.1, "duration_s": 1.0},
        "attempts": 1, "worker": "short-1@bench", "row": 0,
    }
    for dataset in DATASETS:
        directory = root / run / dataset
        directory.mkdir(parents=True)
        for shard in range(SHARDS_PER_DATASET):
            rows = range(shard * per_shard, min((shard + 1) * per_shard, per_dataset))
            with open(directory / f"short-1-{shard:05d}.jsonl", "w") as handle:
                for row in rows:
                    template.update(
                        id=f"{dataset}/{row}", dataset=dataset, row=row,
                        messages=[{"role": "user", "content": f"question number {row} about {dataset}"}],
                        reasoning=f"thinking about {row} step by step", content=f"the answer is {row * 7}",
                        finish_reason="length" if row % 50 == 0 else "stop")
                    template["usage"]["completion_tokens"] = 20 + row % 300
                    template["usage"]["reasoning_tokens"] = 10 + row % 150
                    handle.write(json.dumps(template, separators=(",", ":")) + "\n")
    return per_dataset


def seed_redis(url: str, run: str, rows: int) -> None:
    """The state a finished run leaves: counters, and every row enqueued and done."""
    import redis

    client = redis.Redis.from_url(url)
    keys = RunKeys(run)
    assert rows % 8 == 0
    client.hset(keys.manifest, mapping={ManifestFields.CONFIG_HASH: "bench", ManifestFields.CONFIG: "{}"})
    for dataset in DATASETS:
        client.sadd(keys.datasets, dataset)
        client.hset(keys.counters(dataset), mapping={"total": rows, "done": rows})
        client.set(keys.done(dataset), b"\xff" * (rows // 8))
        client.set(keys.enqueued(dataset), b"\xff" * (rows // 8))


def measure(args: list[str], log: Path) -> tuple[float, int, int]:
    """Runs a child; returns its wall seconds, its peak RSS in bytes and its exit status."""
    started = time.monotonic()
    with open(log, "w") as handle:
        child = subprocess.Popen([sys.executable, "-m", "genfleet", *args], cwd=REPO, stdout=handle,
                                 stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return time.monotonic() - started, usage.ru_maxrss * 1024, child.returncode  # ru_maxrss: KiB on Linux


def main() -> None:
    args = _parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="genfleet-export-bench-"))
    redis_process = None
    try:
        shards = workdir / "shards"
        small = args.records // 10
        t0 = time.monotonic()
        rows_big = write_run(shards, "big", args.records)
        write_run(shards, "small", small)
        if not args.json:
            print(f"wrote {args.records:,} + {small:,} records in {time.monotonic() - t0:.1f} s "
                  f"({sum(f.stat().st_size for f in shards.rglob('*.jsonl')) / 1e6:,.0f} MB) under {shards}")

        common = ["--from", str(shards), "--format", "specforge"]
        variants = _variants(args.records, small, common)
        if shutil.which("redis-server"):
            redis_process, url = _start_redis(workdir)
            seed_redis(url, "big", rows_big)
            variants.append((f"{args.records:,} records, reconciled", args.records,
                             ["export", "--run", "big", "--redis-url", url, *common]))

        results = _measure_variants(variants, workdir)
        if args.json:
            print(json.dumps(results))
            return
        _print_table(results)
    finally:
        if redis_process is not None:
            redis_process.terminate()
            redis_process.wait(timeout=10)
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--workdir", type=Path, help="default: a temporary directory, removed afterwards")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    return parser.parse_args()


def _variants(records: int, small: int, common: list[str]) -> list[tuple[str, int, list[str]]]:
    """(name, records exported, `genfleet` arguments) of each variant that needs no Redis."""
    return [
        ("imports only (export --help)", 0, ["export", "--help"]),
        (f"{small:,} records", small, ["export", "--run", "small", "--no-reconcile", *common]),
        (f"{records:,} records", records, ["export", "--run", "big", "--no-reconcile", *common]),
        (f"{records:,} records, --shuffle", records,
         ["export", "--run", "big", "--no-reconcile", "--shuffle", "--seed", "1", *common]),
    ]


def _start_redis(workdir: Path) -> tuple[subprocess.Popen, str]:
    """A throwaway redis-server for the reconciled variant; returns it and its URL."""
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    return process, f"redis://127.0.0.1:{port}/0"


def _measure_variants(variants: list[tuple[str, int, list[str]]], workdir: Path) -> list[dict]:
    """Runs each variant as a child; exits with its log's tail if one fails."""
    results = []
    for index, (name, records, command) in enumerate(variants):
        out = workdir / f"out-{index}"
        if "--run" in command:
            command = [*command, "--out", str(out)]
        seconds, peak, code = measure(command, workdir / f"log-{index}.txt")
        if code != 0:
            sys.exit(f"{name}: exit {code}\n{(workdir / f'log-{index}.txt').read_text()[-3000:]}")
        results.append({"variant": name, "records": records, "seconds": round(seconds, 1),
                        "records_per_s": round(records / seconds) if records else None,
                        "peak_rss_mb": round(peak / 2**20, 1)})
        shutil.rmtree(out, ignore_errors=True)
    return results


def _print_table(results: list[dict]) -> None:
    print("\n| variant | records | seconds | records/s | peak RSS |\n|---|---:|---:|---:|---:|")
    for row in results:
        rate = f"{row['records_per_s']:,}" if row["records_per_s"] else "-"
        print(f"| {row['variant']} | {row['records']:,} | {row['seconds']} | {rate} | {row['peak_rss_mb']} MB |")


if __name__ == "__main__":
    main()
