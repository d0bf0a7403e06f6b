"""The families' tokenizer shapes (tests/model_shapes/shapes.py) on vLLM 0.32.0's own server: one
server per shape, its tokenizer and template served with `--tokenizer`'s directory (and
`--trust-remote-code` for Kimi's custom code) over a tiny random model of that vocabulary
(tests/model_shapes/model.py) in a directory of its own.

- prompt ids: what `genfleet enqueue` publishes equals vLLM's own tokenization of the same messages
  and kwargs (`POST /tokenize` with `messages`, `add_generation_prompt` and `chat_template_kwargs`:
  0.32.0 `entrypoints/serve/tokenize/protocol.py`), for every conversation, thinking on and off;
- records: a real worker's records equal vLLM's own non-streamed output for those ids, token for
  token and text for text, none dead-lettered, the text split by the shape's parser."""
from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers.data import write_jsonl
from helpers.model_shapes import CONVERSATIONS, NAMES, SHAPES_DIR, facts, shape_dir, thinking_variants
from server import VllmProcess

from genfleet.common.reasoning import split_reasoning
from genfleet.producer.prompts import PromptTemplater

MAX_NEW_TOKENS = 24


@pytest.fixture(scope="module", params=NAMES)
def shape(request, venv: Path, tmp_path_factory) -> Iterator[tuple[str, Path, VllmProcess]]:
    name = request.param
    # The tokenizer directory as the shape is (a family's config.json in it where it matters), the
    # tiny model in its own directory, served with `--tokenizer` as a user serves a model whose
    # tokenizer lives elsewhere.
    tokenizer, model = (tmp_path_factory.mktemp("shape") / part for part in (name, "model"))
    shutil.copytree(shape_dir(name), tokenizer)
    model.mkdir()
    shutil.copy(tokenizer / "shape.json", model / "shape.json")
    subprocess.run([str(venv / "bin" / "python"), str(SHAPES_DIR / "model.py"), str(model)], check=True,
                   capture_output=True, text=True)
    flags = ["--tokenizer", str(tokenizer), *(["--trust-remote-code"] if facts(name)["trust_remote_code"] else [])]
    server = VllmProcess(venv, model, *flags, name=f"vllm-{name}")
    try:
        yield name, tokenizer, server.start()
    finally:
        server.stop()


def _templater(name: str, model: Path) -> PromptTemplater:
    return PromptTemplater(str(model), trust_remote_code=facts(name)["trust_remote_code"])


def test_prompt_ids_equal_vllms_own_tokenization(shape):
    name, model, server = shape
    templater = _templater(name, model)
    for kwargs in thinking_variants(name):
        for conversation, ids in zip(CONVERSATIONS, templater.render(CONVERSATIONS, kwargs), strict=True):
            body = {"model": "tiny-qwen3", "messages": conversation, "add_generation_prompt": True,
                    "chat_template_kwargs": kwargs}
            answer = httpx.post(f"{server.url}/tokenize", json=body, timeout=60)
            assert answer.status_code == 200, answer.text
            assert ids == answer.json()["tokens"], (name, kwargs, conversation)


def test_records_equal_vllms_own_output_with_none_dead_lettered(shape, fleet, tmp_path):
    name, model, server = shape
    trusted = facts(name)["trust_remote_code"]
    parser = facts(name)["parser"]
    fleet.configure(tokenizer=model, reasoning_parser=parser, stream_interval=4,
                    trust_remote_code=str(trusted).lower())
    rows = [{"id": f"c{i}", "messages": conversation} for i, conversation in enumerate(CONVERSATIONS)]
    data = write_jsonl(tmp_path / "c.jsonl", rows)
    fleet.start_worker("short", server.url, concurrency=4)
    fleet.genfleet("enqueue", "--run", "shape", "--tokenizer", str(model), "--keep-token-ids", "--temperature", "0",
                   "--max-new-tokens", str(MAX_NEW_TOKENS), *(["--trust-remote-code"] if trusted else []),
                   f"c={data}")
    progress = fleet.wait_finished("shape", timeout=300)
    dead = fleet.genfleet("failures", "--run", "shape").stdout if progress.totals().failed else ""
    assert progress.totals().failed == 0, dead
    assert progress.totals().done == len(rows)

    templater = _templater(name, model)
    records = {record["id"]: record for record in fleet.records("shape")}
    for row in rows:
        record = records[f"c/{row['id']}"]
        ids = templater.render([record["messages"]])[0]
        # As the worker asks (workers/servers/vllm.py `completion_body`): no space put before added tokens.
        answer = server.complete(ids, MAX_NEW_TOKENS, spaces_between_special_tokens=False)
        assert record["output_ids"] == answer["token_ids"], (name, row["id"])
        split = split_reasoning(answer["text"], parser, None)
        assert (record["reasoning"], record["content"]) == (split.reasoning, split.content), (name, row["id"])
        assert record["usage"]["prompt_tokens"] == len(ids)
