"""`genfleet run` against SGLang 0.5.23's own server, as a user runs it: one command, no Redis set up
by hand. It takes the server's reasoning parser and context from `/server_info`, and every record
equals the plan token for token, with reasoning and content split as the plan's text splits."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tier import Expectations, write_plan_prompts

MAX_NEW_TOKENS = 10240  # the short partition's default: every plan stops by itself well before
PROMPTS = 30


def test_genfleet_run_makes_every_record_exact_with_the_servers_parser(cumulative, model, plan_vocab, tmp_path):
    data = write_plan_prompts(tmp_path / "q.jsonl", PROMPTS)
    out = tmp_path / "output"
    env = {key: value for key, value in os.environ.items() if not key.startswith("GENFLEET_")}
    command = [sys.executable, "-m", "genfleet", "run", "--run", "onebox", "--upstream", cumulative.url,
               "--tokenizer", str(model), "--out", str(out), "--keep-token-ids", "--short-concurrency", "16",
               "--progress-every", "5"]
    result = subprocess.run([*command, f"q={data}"], capture_output=True, text=True, timeout=300,
                            env={**env, "GENFLEET_METRICS_PORT": "0"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "reasoning parser: kimi_k2 (the server's)" in result.stdout
    assert f"q: {PROMPTS}/{PROMPTS} done (100.0%)" in result.stdout

    records = [json.loads(line) for path in sorted((out / "onebox").rglob("*.jsonl"))
               for line in path.read_text().splitlines()]
    assert sorted(record["id"] for record in records) == sorted(f"q/{i}" for i in range(PROMPTS))
    expect = Expectations(model, plan_vocab)
    for record in records:
        ids = expect.output_ids(record, MAX_NEW_TOKENS)
        assert record["output_ids"] == ids, record["id"]
        assert (record["reasoning"], record["content"]) == expect.split(record, MAX_NEW_TOKENS), record["id"]
        assert record["finish_reason"] == "stop"
