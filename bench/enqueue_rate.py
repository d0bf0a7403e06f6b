"""Producer enqueue rate: N short prompts (default 100,000) end to end through `genfleet enqueue`:
read JSONL, template with the bundled model's chat template, count tokens, partition, encode the
Celery messages and publish them into a throwaway redis-server this script starts and stops.

    .venv/bin/python bench/enqueue_rate.py [--prompts 100000] [--batch-size N] [--json]

Prints prompts/s twice: for the whole command (process start, imports and tokenizer load included)
and for the enqueue itself (what the command's own summary reports). The target is >= 5,000/s.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO / "sim" / "model"
TARGET_PER_S = 5000
WORDS = ("what", "is", "the", "capital", "of", "france", "explain", "why", "sky", "blue", "write", "a",
         "poem", "about", "rain", "sum", "two", "numbers", "in", "python", "list", "three", "facts", "on",
         "cats", "translate", "hello", "to", "german", "short", "story", "robot", "learns", "paint")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_prompts(path: Path, count: int) -> None:
    rng = random.Random(0)
    with open(path, "w") as handle:
        for i in range(count):
            words = " ".join(rng.choices(WORDS, k=rng.randint(6, 20)))
            handle.write(json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": words}]}) + "\n")


def start_redis(workdir: Path) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is missing: `sudo apt-get install redis-server`")
    port = free_port()
    process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
                                "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    import redis

    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            return process, f"redis://127.0.0.1:{port}/0"
        except redis.ConnectionError:
            time.sleep(0.05)
    process.kill()
    sys.exit("redis-server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=None, help="rows per batch (default: the producer's)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="genfleet-bench-") as tmp:
        workdir = Path(tmp)
        data = workdir / "prompts.jsonl"
        write_prompts(data, args.prompts)
        redis_process, url = start_redis(workdir)
        try:
            # No workers drain the queue here: the default depth limit would hold the producer forever.
            command = [sys.executable, "-m", "genfleet", "enqueue", "--run", "bench", "--tokenizer",
                       str(TOKENIZER), "--redis-url", url, "--max-queue-depth", "0", f"bench={data}"]
            if args.batch_size:
                command += ["--batch-size", str(args.batch_size)]
            env = {**os.environ, "COLUMNS": "200"}
            started = time.perf_counter()
            result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
            wall = time.perf_counter() - started
            if result.returncode != 0:
                sys.exit(f"enqueue failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
            import redis

            queued = redis.Redis.from_url(url).llen("short")
        finally:
            redis_process.terminate()
            redis_process.wait(timeout=10)

    match = re.search(r"in ([\d.]+) s", result.stdout)
    enqueue_s = float(match.group(1)) if match else wall
    outcome = {"prompts": args.prompts, "queued": queued, "wall_s": round(wall, 2),
               "end_to_end_per_s": round(args.prompts / wall), "enqueue_s": enqueue_s,
               "enqueue_per_s": round(args.prompts / enqueue_s), "target_per_s": TARGET_PER_S,
               "cpus": os.cpu_count()}
    if queued != args.prompts:
        sys.exit(f"expected {args.prompts} queued messages, found {queued}")
    if args.json:
        print(json.dumps(outcome))
        return
    print(f"{args.prompts:,} short prompts on {os.cpu_count()} CPUs:")
    print(f"  end to end (process start included): {outcome['end_to_end_per_s']:,} prompts/s ({wall:.1f} s)")
    print(f"  enqueue (read → template → publish): {outcome['enqueue_per_s']:,} prompts/s ({enqueue_s:.1f} s)")
    print(f"  target: >= {TARGET_PER_S:,} prompts/s: "
          + ("met" if outcome["end_to_end_per_s"] >= TARGET_PER_S else "NOT met"))


if __name__ == "__main__":
    main()
