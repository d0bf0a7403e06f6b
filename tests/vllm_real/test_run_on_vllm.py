"""`genfleet run` and `genfleet doctor` against vLLM's own server, with nothing but its URL: the kind
is found by asking it, `doctor` names it (kind, version, context, where its load is read), and every
record equals vLLM's own non-streamed output. vLLM does not say which reasoning parser it runs, so
the user names it (GENFLEET_REASONING_PARSER), as `doctor` says."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from answers import Oracle
from helpers.data import write_jsonl

MAX_NEW_TOKENS = 32
PROMPTS = 20


def _clean_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("GENFLEET_")}
    return {**env, "GENFLEET_METRICS_PORT": "0", "GENFLEET_REASONING_PARSER": "qwen3"}


def test_genfleet_run_against_vllm_writes_vllms_own_output(vllm, model, tmp_path):
    data = write_jsonl(tmp_path / "q.jsonl", [{"prompt": f"run {i}: what is {i} squared?"} for i in range(PROMPTS)])
    out = tmp_path / "output"
    command = [sys.executable, "-m", "genfleet", "run", "--run", "onebox", "--upstream", vllm.url,
               "--tokenizer", str(model), "--out", str(out), "--keep-token-ids", "--short-concurrency", "16",
               "--temperature", "0", "--max-new-tokens", str(MAX_NEW_TOKENS), "--progress-every", "5", f"q={data}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=_clean_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"q: {PROMPTS}/{PROMPTS} done (100.0%)" in result.stdout

    records = [json.loads(line) for path in sorted((out / "onebox").rglob("*.jsonl"))
               for line in path.read_text().splitlines()]
    assert sorted(record["id"] for record in records) == sorted(f"q/{i}" for i in range(PROMPTS))
    oracle = Oracle(vllm, model, "qwen3")
    for record in records:
        answer = oracle.answer(record, MAX_NEW_TOKENS)
        assert record["output_ids"] == answer["token_ids"], record["id"]
        assert (record["reasoning"], record["content"]) == oracle.split(answer["text"]), record["id"]


def test_doctor_names_the_server_kind_version_context_and_load_source(vllm, model, redis_url, tmp_path):
    env = {**_clean_env(), "GENFLEET_REDIS_URL": redis_url, "GENFLEET_OUTPUT_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "genfleet", "doctor", "--upstream", vllm.url,
                             "--tokenizer", str(model)], capture_output=True, text=True, timeout=300, env=env)
    report = " ".join(result.stdout.split())  # the table wraps its cells
    assert "vllm 0.32.0" in report, result.stdout
    assert "context 4,096" in report, result.stdout
    assert "load 0 running, 0 waiting" in report, result.stdout
