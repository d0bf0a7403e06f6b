"""The families' tokenizer shapes (tests/model_shapes/shapes.py) on SGLang 0.5.23's own server: one
server per shape, its tokenizer and template served from `--tokenizer-path` (and
`--trust-remote-code` for Kimi's custom code) over a model config of that vocabulary, the forward
pass hashed (forward_patch.py, `GENFLEET_PLAN_HASHED`): every id of the vocabulary can come out, so
SGLang's own detokenizer meets byte-fallback bytes, special tokens and a space-joining decoder's
first space.

- prompt ids: what `genfleet enqueue` publishes equals SGLang's own tokenization of the same
  messages and kwargs (`POST /v1/tokenize` with `messages`, `add_generation_prompt` and
  `chat_template_kwargs`: 0.5.23 `entrypoints/openai/serving_tokenize.py`, `protocol.py`
  `TokenizeRequest`), for every conversation, thinking on and off;
- records: a real worker's records equal SGLang's own non-streamed `/generate` for those ids, token
  for token and text for text, none dead-lettered, the text split by the shape's parser."""
from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers.data import write_jsonl
from helpers.model_shapes import CONVERSATIONS, NAMES, facts, shape_dir, thinking_variants
from model_dir import qwen3_config
from server import RealServer

from genfleet.common.reasoning import split_reasoning
from genfleet.producer.prompts import PromptTemplater

MAX_NEW_TOKENS = 24


@pytest.fixture(scope="module", params=NAMES)
def shape(request, venv: Path, tmp_path_factory) -> Iterator[tuple[str, Path, RealServer]]:
    name = request.param
    known = facts(name)
    tokenizer, model = (tmp_path_factory.mktemp("shape") / part for part in (name, "model"))
    shutil.copytree(shape_dir(name), tokenizer)
    model.mkdir()
    # A config only: `--load-format dummy`, and the hashed forward reads no weight.
    (model / "config.json").write_text(json.dumps(qwen3_config(known["vocab_size"], known["eos"], known["bos"])))
    flags = ["--tokenizer-path", str(tokenizer), *(["--trust-remote-code"] if known["trust_remote_code"] else [])]
    server = RealServer(venv, model, *flags, name=f"sglang-{name}", env={"GENFLEET_PLAN_HASHED": "1"})
    try:
        yield name, tokenizer, server.start()
    finally:
        server.stop()


def _templater(name: str, tokenizer: Path) -> PromptTemplater:
    return PromptTemplater(str(tokenizer), trust_remote_code=facts(name)["trust_remote_code"])


def test_prompt_ids_equal_sglangs_own_tokenization(shape):
    name, tokenizer, server = shape
    templater = _templater(name, tokenizer)
    for kwargs in thinking_variants(name):
        for conversation, ids in zip(CONVERSATIONS, templater.render(CONVERSATIONS, kwargs), strict=True):
            body = {"messages": conversation, "add_generation_prompt": True, "chat_template_kwargs": kwargs}
            answer = httpx.post(f"{server.url}/v1/tokenize", json=body, timeout=60)
            assert answer.status_code == 200, answer.text
            assert ids == answer.json()["tokens"], (name, kwargs, conversation)


def test_records_equal_sglangs_own_output_with_none_dead_lettered(shape, fleet, tmp_path):
    name, tokenizer, server = shape
    trusted = facts(name)["trust_remote_code"]
    parser = facts(name)["parser"]
    fleet.configure(tokenizer=tokenizer, reasoning_parser=parser, stream_interval=4,
                    trust_remote_code=str(trusted).lower())
    rows = [{"id": f"c{i}", "messages": conversation} for i, conversation in enumerate(CONVERSATIONS)]
    data = write_jsonl(tmp_path / "c.jsonl", rows)
    fleet.start_worker("short", server.url, concurrency=4)
    fleet.genfleet("enqueue", "--run", "shape", "--tokenizer", str(tokenizer), "--keep-token-ids", "--temperature",
                   "0", "--max-new-tokens", str(MAX_NEW_TOKENS), *(["--trust-remote-code"] if trusted else []),
                   f"c={data}")
    progress = fleet.wait_finished("shape", timeout=300)
    dead = fleet.genfleet("failures", "--run", "shape").stdout if progress.totals().failed else ""
    assert progress.totals().failed == 0, dead
    assert progress.totals().done == len(rows)

    templater = _templater(name, tokenizer)
    records = {record["id"]: record for record in fleet.records("shape")}
    for row in rows:
        record = records[f"c/{row['id']}"]
        ids = templater.render([record["messages"]])[0]
        # As the worker asks (workers/servers/sglang.py `generate_body`), not streamed.
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0,
                                                      "skip_special_tokens": False}}
        answer = httpx.post(f"{server.url}/generate", json=body, timeout=60).raise_for_status().json()
        assert record["output_ids"] == answer["output_ids"], (name, row["id"])
        assert len(answer["output_ids"]) > 1  # the hashed forward wrote a completion, not a lone EOS
        split = split_reasoning(answer["text"], parser, None)
        assert (record["reasoning"], record["content"]) == (split.reasoning, split.content), (name, row["id"])
        assert record["usage"]["prompt_tokens"] == len(ids)
