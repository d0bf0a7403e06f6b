"""The real server's own reasoning split: the oracle genfleet's records are judged against.

SGLang 0.5.23's `/v1/chat/completions` templates the messages with the model's chat template, runs
the plan, and splits the text with the parser it was launched with (`--reasoning-parser`); both
halves come back as `reasoning_content` and `content` (0.5.23 `entrypoints/openai/serving_chat.py`:
non-streamed through `ReasoningParser.parse_non_stream`, streamed through `parse_stream_chunk` per
delta and `parse_stream_end` on the finishing chunk). A record genfleet wrote from `/generate` for
the same messages and `chat_template_kwargs` must hold the same two halves.

Asked with plain httpx, not genfleet's client: the oracle must not share the code it judges.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from tier import enqueue, write_plan_prompts


@dataclass(frozen=True)
class ChatAnswer:
    reasoning: str
    content: str
    finish_reason: str | None
    completion_tokens: int | None
    # Counted by the scheduler up to and including `</think>` where the request asked it
    # (`require_reasoning`, which the chat endpoint sets when it deems thinking on).
    reasoning_tokens: int | None

    @property
    def split(self) -> tuple[str, str]:
        return self.reasoning, self.content


def chat(url: str, messages: list[dict], *, max_tokens: int, chat_template_kwargs: dict | None = None,
         stream: bool = False) -> ChatAnswer:
    """One chat completion: the whole answer, or the sum of a stream's deltas."""
    body: dict[str, Any] = {"model": "default", "messages": messages, "max_tokens": max_tokens,
                            "separate_reasoning": True, "stream": stream}
    if chat_template_kwargs:
        body["chat_template_kwargs"] = chat_template_kwargs
    if not stream:
        answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).raise_for_status().json()
        choice = answer["choices"][0]
        message = choice["message"]
        usage = answer["usage"]
        return ChatAnswer(message.get("reasoning_content") or "", message.get("content") or "",
                          choice.get("finish_reason"), usage["completion_tokens"], usage["reasoning_tokens"])
    body["stream_options"] = {"include_usage": True}
    reasoning, content, finish_reason, usage = [], [], None, {}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                reasoning.append(delta.get("reasoning_content") or "")
                content.append(delta.get("content") or "")
                finish_reason = choice.get("finish_reason") or finish_reason
    return ChatAnswer("".join(reasoning), "".join(content), finish_reason, usage.get("completion_tokens"),
                      usage.get("reasoning_tokens"))


def chat_many(url: str, conversations: Iterable[list[dict]], *, max_tokens: int,
              chat_template_kwargs: dict | None = None, stream: bool = False) -> list[ChatAnswer]:
    """`chat` for each conversation, 16 at a time (the server batches them), in order."""
    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(lambda messages: chat(url, messages, max_tokens=max_tokens,
                                                   chat_template_kwargs=chat_template_kwargs, stream=stream),
                             conversations))


# What `genfleet enqueue --no-thinking` puts in every payload's chat_template_kwargs (both names:
# producer/run_config.py `_thinking`); the tier's template reads either.
NO_THINKING = {"thinking": False, "enable_thinking": False}


@dataclass(frozen=True)
class Case:
    """One dataset the fleet generates (in its run, with the run's enqueue flags), and how the
    oracle is asked for the same completions."""

    name: str
    run: str
    directives: tuple[str, ...]
    flags: tuple[str, ...] = ()  # the run's `genfleet enqueue` flags
    chat_template_kwargs: dict | None = None  # what those flags send
    max_new_tokens: int = 10240  # the short partition's default; another is set in the run file
    count: int = 6


CASES = (
    # Thinking on (the template opens `<think>`): reasoning, `</think>`, content; multi-byte words in both.
    Case("on", "thinking", ("[plan len=12 think=8]", "[plan len=40 think=30]", "", "[plan len=3 think=50]"), count=8),
    # Cut by max_new_tokens inside the reasoning (no `</think>` at all) or inside the content; rows
    # 0, 3 and 4 are cut inside a multi-byte character (SGLang then ends the text with U+FFFD).
    Case("cut", "thinking", ("[plan think=40]", "[plan think=4 len=40]", "[plan think=9 len=40]"), max_new_tokens=13),
    # Thinking off (the template writes `<think></think>`): the plan answers with content only.
    Case("off", "no-thinking", ("[plan len=12]", "[plan len=40]", ""), ("--no-thinking",), NO_THINKING),
)


def generate(fleet, model: Path, url: str, directory: Path, cases: tuple[Case, ...] = CASES,
             concurrency: int = 16) -> dict[str, list[dict]]:
    """Each run enqueued once (`genfleet enqueue --run-file`, its cases as datasets) and generated
    by one `genfleet worker` streaming from `url`; the records on disk, by case."""
    fleet.start_worker("short", url, concurrency=concurrency)
    runs = {case.run: case.flags for case in cases}
    for run, flags in runs.items():
        run_file = directory / f"{run}.toml"
        lines = []
        for case in (case for case in cases if case.run == run):
            assert case.flags == flags, f"the cases of run {run} differ in their enqueue flags"
            data = write_plan_prompts(directory / f"{case.name}.jsonl", case.count, case.directives, stem=case.name)
            lines += [f"[datasets.{case.name}]", f'path = "{data}"']
            if case.max_new_tokens != Case.max_new_tokens:
                lines.append(f"max_new_tokens = {case.max_new_tokens}")
        run_file.write_text("\n".join(lines) + "\n")
        enqueue(fleet, model, run, extra=(*flags, "--run-file", str(run_file)))
    records = {}
    for run in runs:
        progress = fleet.wait_finished(run, timeout=120)
        assert progress.totals().failed == 0, (run, progress)
        for record in fleet.records(run):
            records.setdefault(record["dataset"], []).append(record)
    for case in cases:
        records[case.name] = sorted(records.get(case.name, []), key=lambda record: record["row"])
        assert len(records[case.name]) == case.count, case.name
    return records


def ask(url: str, case: Case, records: list[dict], *, stream: bool) -> list[ChatAnswer]:
    """The oracle's answer for each record's messages, asked as the case's run asked."""
    return chat_many(url, [record["messages"] for record in records], max_tokens=case.max_new_tokens,
                     chat_template_kwargs=case.chat_template_kwargs, stream=stream)
