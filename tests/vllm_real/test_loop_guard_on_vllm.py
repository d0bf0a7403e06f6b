"""The loop guard on vLLM's own server: a completion that repeats itself is cut where the guard
finds the loop, written with `finish_reason: "loop"` as a prefix of vLLM's own output, and the
server stops generating it: closing the stream aborts the request (vllm 0.32.0: the completions
route is `@with_cancellation`, `serve/utils/api_utils.py`; a cancelled `AsyncLLM.generate` aborts
its request, `v1/engine/async_llm.py`).

The looping model: vLLM's `--load-format dummy` weights make a model repeat two tokens from its
first step (model_dir.py `build_looping`)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from answers import Oracle
from helpers.data import write_jsonl
from helpers.waits import wait_until
from model_dir import build_looping
from server import VllmProcess

MAX_NEW_TOKENS = 3000  # what each loop would cost unguarded
PROMPTS = 6


@pytest.fixture(scope="module")
def looping(venv: Path, model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmProcess]:
    looping_model = build_looping(model, tmp_path_factory.mktemp("looping") / "looping-qwen3")
    server = VllmProcess(venv, looping_model, "--load-format", "dummy", name="vllm-dummy")
    try:
        yield server.start()
    finally:
        server.stop()


def generated_tokens(server: VllmProcess) -> float:
    page = httpx.get(f"{server.url}/metrics", timeout=10).raise_for_status().text
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
               if line.startswith("vllm:generation_tokens_total{"))


def test_a_loop_is_cut_and_the_server_stops_generating_it(looping, real_fleet, model, tmp_path):
    real_fleet.configure(reasoning_parser="qwen3")
    data = write_jsonl(tmp_path / "q.jsonl", [{"prompt": f"loop {i}"} for i in range(PROMPTS)])
    before = generated_tokens(looping)
    real_fleet.start_worker("short", looping.url, concurrency=8)
    real_fleet.genfleet("enqueue", "--run", "loops", "--tokenizer", str(model), "--keep-token-ids",
                        "--temperature", "0", "--max-new-tokens", str(MAX_NEW_TOKENS), f"q={data}")
    progress = real_fleet.wait_finished("loops", timeout=300)
    assert progress.totals().done == PROMPTS and progress.totals().failed == 0

    # Every stream's request was dropped where it was cut: none runs on, and the server generated a
    # fraction of what the caps allowed.
    wait_until(lambda: looping.running() == 0, 30, 0.2, "vLLM still runs a request of a finished run")
    generated = generated_tokens(looping) - before
    assert generated < PROMPTS * MAX_NEW_TOKENS / 2, generated

    records = real_fleet.records("loops")
    assert len(records) == PROMPTS and {record["finish_reason"] for record in records} == {"loop"}
    oracle = Oracle(looping, model, "qwen3")
    for record in records[:2]:  # the oracle's own answers run to the cap: two are enough
        answer = oracle.answer(record, 800)
        kept = record["output_ids"]
        assert 0 < len(kept) < 800 and answer["token_ids"][:len(kept)] == kept, record["id"]
