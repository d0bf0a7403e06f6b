"""Producer enqueue rate: N prompts (default 100,000) end to end through `genfleet enqueue`: read
JSONL, template with a chat template, count tokens, partition, encode the Celery messages and
publish them into a throwaway redis-server this script starts and stops.

    .venv/bin/python bench/enqueue_rate.py [--prompts 100000] [--shape NAME --chat] [--batch-size N] [--json]

By default the prompts are short and the tokenizer is the bundled model's (fast, byte-level).
`--shape` templates with one of the families' tokenizer directories instead (tests/model_shapes:
`kimi-k2.5` is Kimi's custom-code tiktoken tokenizer, a Python `PreTrainedTokenizer`; `qwen3` a fast
one), and `--chat` makes the prompts chat-length (a system prompt and a user turn of 60-400 words,
~500 tokens).

Prints prompts/s twice: for the whole command (process start, imports and tokenizer load included)
and for the enqueue itself (what the command's own summary reports).
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
# Chat-length prompts with a custom-code tokenizer: 83,000 prompts in under 90 s.
CHAT_TARGET_PER_S = 1000
WORDS = ("what", "is", "the", "capital", "of", "france", "explain", "why", "sky", "blue", "write", "a",
         "poem", "about", "rain", "sum", "two", "numbers", "in", "python", "list", "three", "facts", "on",
         "cats", "translate", "hello", "to", "german", "short", "story", "robot", "learns", "paint")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


CHAT_WORDS = (60, 400)  # a chat-length user turn, in words


def write_prompts(path: Path, count: int, *, chat: bool = False) -> None:
    rng = random.Random(0)
    low, high = CHAT_WORDS if chat else (6, 20)
    with open(path, "w") as handle:
        for i in range(count):
            words = " ".join(rng.choices(WORDS, k=rng.randint(low, high)))
            messages = [{"role": "user", "content": words}]
            if chat:
                messages = [{"role": "system", "content": "You are a careful assistant. Answer in full."},
                            {"role": "user", "content": f"{words} (Zürich, 東京?)"}]
            handle.write(json.dumps({"id": f"q{i}", "messages": messages}) + "\n")


def shape_directory(name: str, into: Path) -> tuple[Path, bool]:
    """A family's tokenizer directory built by tests/model_shapes/shapes.py, and whether it needs
    --trust-remote-code."""
    sys.path.insert(0, str(REPO / "tests" / "model_shapes"))
    import shapes

    facts = shapes.build(name, into / name)
    return into / name, bool(facts["trust_remote_code"])


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


def mean_prompt_tokens(data: Path, tokenizer: Path, trusted: bool, sample: int = 200) -> float:
    """The mean prompt length in tokens over the first `sample` prompts, templated as the producer does."""
    sys.path.insert(0, str(REPO))
    from genfleet.producer.prompts import PromptTemplater

    with open(data) as handle:
        conversations = [json.loads(line)["messages"] for line, _ in zip(handle, range(sample), strict=False)]
    ids = PromptTemplater(str(tokenizer), trust_remote_code=trusted).render(conversations)
    return sum(map(len, ids)) / len(ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=None, help="rows per batch (default: the producer's)")
    parser.add_argument("--shape", default=None, help="a family's tokenizer (tests/model_shapes), e.g. kimi-k2.5")
    parser.add_argument("--chat", action="store_true", help="chat-length prompts (~500 tokens)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="genfleet-bench-") as tmp:
        workdir = Path(tmp)
        data = workdir / "prompts.jsonl"
        write_prompts(data, args.prompts, chat=args.chat)
        tokenizer, trusted = shape_directory(args.shape, workdir) if args.shape else (TOKENIZER, False)
        redis_process, url = start_redis(workdir)
        try:
            # No workers drain the queue here: the default depth limit would hold the producer forever.
            command = [sys.executable, "-m", "genfleet", "enqueue", "--run", "bench", "--tokenizer",
                       str(tokenizer), "--redis-url", url, "--max-queue-depth", "0", f"bench={data}"]
            if trusted:
                command.append("--trust-remote-code")
            if args.shape:  # the shapes' 4,096-token context: the default caps would reject every prompt
                command += ["--context-length", "131072"]
            if args.batch_size:
                command += ["--batch-size", str(args.batch_size)]
            env = {**os.environ, "COLUMNS": "200"}
            started = time.perf_counter()
            result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
            wall = time.perf_counter() - started
            if result.returncode != 0:
                sys.exit(f"enqueue failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
            import redis

            client = redis.Redis.from_url(url)
            queued = client.llen("short") + client.llen("long")
            mean_tokens = round(mean_prompt_tokens(data, tokenizer, trusted))
        finally:
            redis_process.terminate()
            redis_process.wait(timeout=10)

    match = re.search(r"in ([\d.]+) s", result.stdout)
    enqueue_s = float(match.group(1)) if match else wall
    outcome = {"prompts": args.prompts, "queued": queued, "wall_s": round(wall, 2),
               "end_to_end_per_s": round(args.prompts / wall), "enqueue_s": enqueue_s,
               "enqueue_per_s": round(args.prompts / enqueue_s),
               "target_per_s": CHAT_TARGET_PER_S if args.chat else TARGET_PER_S,
               "cpus": os.cpu_count(), "shape": args.shape, "chat": args.chat,
               "mean_prompt_tokens": mean_tokens}
    if queued != args.prompts:
        sys.exit(f"expected {args.prompts} queued messages, found {queued}")
    if args.json:
        print(json.dumps(outcome))
        return
    kind = "chat-length" if args.chat else "short"
    print(f"{args.prompts:,} {kind} prompts ({args.shape or 'the bundled tokenizer'}) on {os.cpu_count()} CPUs:")
    print(f"  end to end (process start included): {outcome['end_to_end_per_s']:,} prompts/s ({wall:.1f} s)")
    print(f"  enqueue (read → template → publish): {outcome['enqueue_per_s']:,} prompts/s ({enqueue_s:.1f} s)")
    target = CHAT_TARGET_PER_S if args.chat else TARGET_PER_S
    print(f"  target: >= {target:,} prompts/s: " + ("met" if outcome["end_to_end_per_s"] >= target else "NOT met"))


if __name__ == "__main__":
    main()
