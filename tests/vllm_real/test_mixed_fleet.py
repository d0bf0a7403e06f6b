"""One worker over an SGLang host and a vLLM host, given nothing but their URLs: each upstream's kind
is found by asking it (workers/servers/kinds.py), and each record is exact against its own host:
SGLang's (its forward pass replaced by the SGLang tier's plan: tests/sglang_real/) token for token
as the plan says, vLLM's as vLLM's own non-streamed output. Both models read the same tokenizer,
so one producer's ids serve both. Needs the SGLang tier's venv too (`make test-sglang` builds it)."""
from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from answers import Oracle

SGLANG_TIER = Path(__file__).resolve().parents[1] / "sglang_real"
MAX_NEW_TOKENS = 10240  # the plans stop by themselves well before; vLLM's answers stop at their cap
VLLM_CAP = 32
PROMPTS = 40


def sglang_tier(name: str) -> ModuleType:
    """A module of the SGLang tier, imported under its own name (both tiers have a `server.py`)."""
    if str(SGLANG_TIER) not in sys.path:
        sys.path.append(str(SGLANG_TIER))  # after this tier's folder: its `plan` and `tier` import from it
    spec = importlib.util.spec_from_file_location(f"sglang_tier_{name}", SGLANG_TIER / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sglang(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, Path]]:
    server_module, model_module = sglang_tier("server"), sglang_tier("model_dir")
    model = model_module.build(tmp_path_factory.mktemp("sglang-model") / "tiny-qwen3")
    server = server_module.RealServer(server_module.sglang_venv(), model, "--reasoning-parser", "qwen3",
                                      name="sglang-mixed")
    try:
        yield server.start(), model
    finally:
        server.stop()


def test_one_worker_over_an_sglang_and_a_vllm_host_writes_each_hosts_own_output(sglang, vllm, real_fleet,
                                                                                 model, tmp_path):
    sglang_server, sglang_model = sglang
    tier = sglang_tier("tier")
    vocab = sglang_tier("plan").PlanVocab.from_dir(sglang_model)
    real_fleet.configure(reasoning_parser="qwen3", stream_interval=4)
    data = tier.write_plan_prompts(tmp_path / "q.jsonl", PROMPTS)
    real_fleet.start_worker("short", sglang_server.url, vllm.url, concurrency=16)
    real_fleet.genfleet("enqueue", "--run", "mixed", "--tokenizer", str(model), "--keep-token-ids",
                        "--temperature", "0", "--max-new-tokens", str(VLLM_CAP), f"q={data}")
    progress = real_fleet.wait_finished("mixed", timeout=300)
    assert progress.totals().done == PROMPTS and progress.totals().failed == 0

    records = real_fleet.records("mixed")
    assert sorted(record["id"] for record in records) == sorted(f"q/{i}" for i in range(PROMPTS))
    by_host = {sglang_server.url: [], vllm.url: []}
    for record in records:
        by_host[record["upstream"]].append(record)
    assert by_host[sglang_server.url] and by_host[vllm.url], {url: len(r) for url, r in by_host.items()}
    expect = tier.Expectations(sglang_model, vocab)
    for record in by_host[sglang_server.url]:
        assert record["output_ids"] == expect.output_ids(record, VLLM_CAP), record["id"]
    oracle = Oracle(vllm, model, "qwen3")
    for record in by_host[vllm.url]:
        answer = oracle.answer(record, VLLM_CAP)
        assert record["output_ids"] == answer["token_ids"], record["id"]
        assert (record["reasoning"], record["content"]) == oracle.split(answer["text"]), record["id"]
