"""Export formats: a completion record becomes one line of training or batch-result data, and
`FORMATS`, the one registry of them that the command and the exporter dispatch through.

Every format starts from the same `Conversation` (conversation.py): the prompt messages with the
generated assistant turn(s) in place.

Line shapes (one JSON object per line):
- specforge:    {"id", "conversations": [{"role", "content", "reasoning_content"?}, ...]}
- openai:       {"id", "messages": [{"role", "content", "reasoning_content"?}, ...]}
- sharegpt:     {"id", "conversations": [{"from": "system"|"human"|"gpt"|"tool", "value"}, ...]},
                a generated turn's value being `{start}{reasoning}{end}{content}` with the run's
                reasoning markers (`<think>…</think>` for kimi_k2), its content alone if it has no reasoning
- openai-batch: {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}, the
                body a `chat.completion` of the last generated turn (see `openai_batch_line`)
- tokenized:    {"id", "input_ids", "loss_mask"} (genfleet/export/tokenized.py)
`reasoning_content` is present on generated turns with non-empty reasoning; prompt messages are
passed through as they are.

Samples (`--samples N`, records carrying `sample` k and the id `{prompt id}#{k}`): specforge and
openai write ONE line per prompt, gathered across shards by `samples.SampleGroups`:
- specforge:    {"id": prompt id, "conversations": [prompt messages], "samples": [[assistant message,
                ...] per sample], "sample_indices": [k, ...]}
- openai:       {"id": prompt id, "messages": [prompt messages], "samples": [...], "sample_indices": [...]}
`samples` holds, in sample order, each sample's generated assistant message(s) (one, or every
generated turn in order with `--regenerate all`); `sample_indices` holds each one's k, parallel to it
(samples that were filtered out leave gaps). The prompt messages are the record's `messages`, no reply
appended (with `--regenerate all`: as the lowest sample kept saw them, its earlier replies in place).
openai-batch, sharegpt and tokenized keep one line per sample, under the sample's own id (openai-
batch's `custom_id` is that id without `{dataset}/`, e.g. `req-7#2`). Records without `sample` are
written exactly as above.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from genfleet.common.keys import ManifestFields
from genfleet.common.reasoning import ReasoningFormat, get_format
from genfleet.common.run_state import PERMANENT
from genfleet.export.conversation import Record, conversation_of, generated_turns
from genfleet.export.tokenized import TokenizedFormat

if TYPE_CHECKING:
    from genfleet.export.reconcile import RunLedger

# A format turns a record into the JSON object of its output line.
RecordFormatter = Callable[[Record], dict[str, Any]]
# A dead letter (prompt id, dataset, error class, message) as a line of a format's error file.
ErrorLine = Callable[[str, str, str, str], dict[str, Any]]
# A prompt id and its samples' parts, (k, part) in sample order, as one line's JSON object.
GroupFormatter = Callable[[str, list[tuple[int, Any]]], dict[str, Any]]

SHAREGPT_ROLES = {"system": "system", "user": "human", "assistant": "gpt", "tool": "tool"}


def specforge_line(record: Record) -> dict[str, Any]:
    return {"id": record["id"], "conversations": conversation_of(record).messages}


def openai_line(record: Record) -> dict[str, Any]:
    return {"id": record["id"], "messages": conversation_of(record).messages}


def sharegpt_formatter(reasoning: ReasoningFormat | None) -> RecordFormatter:
    """ShareGPT has no reasoning field: a generated turn carries its reasoning inline, between the
    run's reasoning markers, as the model wrote it."""
    start, end = (reasoning.start, reasoning.end) if reasoning is not None else ("<think>", "</think>")

    def sharegpt_line(record: Record) -> dict[str, Any]:
        conversation = conversation_of(record)
        generated = dict(zip(conversation.generated, conversation.turns, strict=True))
        lines = []
        for index, message in enumerate(conversation.messages):
            turn = generated.get(index)
            if turn is not None:
                value = f"{start}{turn.reasoning}{end}{turn.content}" if turn.reasoning else turn.content
            else:
                value = message.get("content") or ""
            role = message.get("role", "")
            lines.append({"from": SHAREGPT_ROLES.get(role, role), "value": value})
        return {"id": record["id"], "conversations": lines}

    return sharegpt_line


def custom_id(record_id: str, dataset: str) -> str:
    """The row's own key: the prompt id without its `{dataset}/` prefix (the OpenAI Batch
    `custom_id` the user came with, when the input was a batch file)."""
    return record_id.removeprefix(f"{dataset}/")


def _stable_id(kind: str, record_id: str) -> str:
    """Deterministic ids: exporting the same run twice gives byte-identical files."""
    return hashlib.sha256(f"{kind}:{record_id}".encode()).hexdigest()[:24]


def openai_batch_line(record: Record) -> dict[str, Any]:
    """An OpenAI Batch output line (as `vllm run-batch` writes it) for the last generated turn."""
    turn = generated_turns(record)[-1]
    usage = record["usage"]
    record_id = record["id"]
    body = {
        "id": f"chatcmpl-{_stable_id('completion', record_id)}",
        "object": "chat.completion",
        "created": int((record.get("timing") or {}).get("started_at") or 0),
        "model": record.get("model", ""),
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": turn.content, "reasoning_content": turn.reasoning or None},
            "finish_reason": turn.finish_reason,
            "logprobs": None,
        }],
        "usage": {
            "prompt_tokens": usage.get("prompt_tokens", 0),
            "completion_tokens": usage.get("completion_tokens", 0),
            "total_tokens": usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0),
            "prompt_tokens_details": {"cached_tokens": usage.get("cached_tokens", 0)},
            "completion_tokens_details": {"reasoning_tokens": usage.get("reasoning_tokens", 0)},
        },
    }
    return {
        "id": f"batch_req_{_stable_id('batch', record_id)}",
        "custom_id": custom_id(record_id, record["dataset"]),
        "response": {"status_code": 200, "request_id": _stable_id("request", record_id), "body": body},
        "error": None,
    }


def openai_batch_error_line(prompt_id: str, dataset: str, error_class: str, message: str) -> dict[str, Any]:
    """An error-file line for a dead letter: 400 for a permanent failure (the request itself is
    bad), 500 for a transient one that ran out of attempts."""
    return {
        "id": f"batch_req_{_stable_id('batch', prompt_id)}",
        "custom_id": custom_id(prompt_id, dataset),
        "response": {"status_code": 400 if error_class == PERMANENT else 500,
                     "request_id": _stable_id("request", prompt_id), "body": None},
        "error": {"code": error_class, "message": message},
    }


def sample_part(record: Record) -> dict[str, Any]:
    """What a grouped line needs of one sample: its prompt and its generated assistant message(s)."""
    conversation = conversation_of(record)  # checks the record as the one-line formats do
    return {"prompt": record["messages"], "reply": [turn.message() for turn in conversation.turns]}


def grouped_formatter(messages_key: str) -> GroupFormatter:
    """One line for a prompt's samples, the prompt under `messages_key` (see the module docstring)."""
    def grouped_line(prompt_id: str, samples: list[tuple[int, Any]]) -> dict[str, Any]:
        return {"id": prompt_id, messages_key: samples[0][1]["prompt"],
                "samples": [part["reply"] for _, part in samples], "sample_indices": [k for k, _ in samples]}

    return grouped_line


@dataclass(frozen=True)
class SampleGrouping:
    """How a per-conversation format writes a prompt's samples as one line: `part` keeps what the
    line needs of one sample record (JSON-able: it waits on disk), `line` joins a prompt's parts,
    given in sample order."""
    part: Callable[[Record], Any]
    line: GroupFormatter


@dataclass(frozen=True)
class FormatInputs:
    """What building a formatter may use besides the records: the run as Redis holds it (None with
    `--no-reconcile`) and the command's tokenizer options."""
    ledger: RunLedger | None = None
    tokenizer: Path | None = None  # --tokenizer
    chat_template_kwargs: str | None = None  # --chat-template-kwargs, JSON


class BuiltFormat(NamedTuple):
    formatter: RecordFormatter
    tokenizer_dir: str | None = None  # the tokenizer it uses, for the manifest


@dataclass(frozen=True)
class ExportFormat:
    name: str
    build: Callable[[FormatInputs], BuiltFormat]
    # Output bytes per input byte, for sizing the shuffle's buckets (token ids take more room than text).
    expansion: float = 1.0
    # The error file's line for a dead letter, where the format has one (`all.errors.jsonl`).
    error_line: ErrorLine | None = None
    # One line per prompt for its samples, where the format groups them; None: a line per sample.
    samples: SampleGrouping | None = None


def _fixed(formatter: RecordFormatter) -> Callable[[FormatInputs], BuiltFormat]:
    return lambda inputs: BuiltFormat(formatter)


def _build_sharegpt(inputs: FormatInputs) -> BuiltFormat:
    """The run's reasoning markers: its parser as enqueued, else the settings'."""
    from genfleet.common.settings import Settings

    ledger = inputs.ledger
    parser = (ledger.config.get("reasoning_parser") if ledger is not None else None) \
        or Settings().reasoning_parser
    return BuiltFormat(sharegpt_formatter(get_format(parser)))


def _build_tokenized(inputs: FormatInputs) -> BuiltFormat:
    """The tokenizer: --tokenizer, else the run's; chat-template kwargs: --chat-template-kwargs for
    every dataset, else each dataset's as enqueued."""
    from genfleet.common.tokenizer import load_tokenizer

    ledger = inputs.ledger
    directory = str(inputs.tokenizer) if inputs.tokenizer is not None else (
        ledger.manifest.get(ManifestFields.TOKENIZER_DIR) if ledger is not None else None)
    if not directory:
        raise ValueError("--format tokenized needs --tokenizer DIR (the run in Redis records none)")
    default_kwargs = None
    if inputs.chat_template_kwargs is not None:
        default_kwargs = json.loads(inputs.chat_template_kwargs)
        if not isinstance(default_kwargs, dict):
            raise ValueError("--chat-template-kwargs must be a JSON object")
    per_dataset = ledger.chat_template_kwargs() if ledger is not None else {}
    return BuiltFormat(TokenizedFormat(load_tokenizer(directory), per_dataset, default_kwargs=default_kwargs),
                       directory)


FORMATS: dict[str, ExportFormat] = {spec.name: spec for spec in (
    ExportFormat("specforge", _fixed(specforge_line),
                 samples=SampleGrouping(sample_part, grouped_formatter("conversations"))),
    ExportFormat("sharegpt", _build_sharegpt),
    ExportFormat("openai", _fixed(openai_line), samples=SampleGrouping(sample_part, grouped_formatter("messages"))),
    ExportFormat("openai-batch", _fixed(openai_batch_line), error_line=openai_batch_error_line),
    ExportFormat("tokenized", _build_tokenized, expansion=3.0),
)}
