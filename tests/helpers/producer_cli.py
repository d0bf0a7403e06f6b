"""`genfleet enqueue` run in this process, and what it leaves on the queues, decoded."""
from __future__ import annotations

import base64
import json
from collections import Counter

import msgpack
import redis
from typer.testing import CliRunner, Result

from genfleet.cli import app
from helpers.paths import TOKENIZER


def enqueue(redis_url: str, *args: str, run: str = "t", expect_exit: int = 0) -> Result:
    """`genfleet enqueue` in this process (no interpreter start-up per call): stdout, stderr, exit code."""
    argv = ["enqueue", "--redis-url", redis_url, "--tokenizer", str(TOKENIZER), *(["--run", run] if run else []),
            *args]
    result = CliRunner().invoke(app, argv, catch_exceptions=False)
    assert result.exit_code == expect_exit, f"exit {result.exit_code}:\n{result.stdout}\n{result.stderr}"
    return result


def decode_message(raw: bytes) -> dict:
    """The task payload of one queued kombu message (a JSON envelope around a msgpack body)."""
    args, _kwargs, _embed = msgpack.unpackb(base64.b64decode(json.loads(raw)["body"]), raw=False)
    return args[0]


def queued_payloads(client: redis.Redis, queue: str) -> list[dict]:
    """The task payloads waiting in a Celery queue, decoded from kombu's envelope."""
    payloads = []
    for raw in client.lrange(queue, 0, -1):
        assert json.loads(raw)["content-type"] == "application/x-msgpack"
        payloads.append(decode_message(raw))
    return payloads


def all_payloads(client: redis.Redis) -> dict[str, dict]:
    """Prompt id -> payload, over both queues."""
    return {p["id"]: p for queue in ("short", "long") for p in queued_payloads(client, queue)}


def queued_ids(client: redis.Redis, queue: str = "short") -> Counter:
    """How many times each prompt id is queued."""
    return Counter(decode_message(raw)["id"] for raw in client.lrange(queue, 0, -1))


def table_rows(text: str) -> list[list[str]]:
    """The cells of each body row of the rich tables in `text`."""
    return [[cell.strip() for cell in line.strip().strip("│").split("│")]
            for line in text.splitlines() if line.startswith("│")]
