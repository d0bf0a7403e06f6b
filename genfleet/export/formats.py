"""The export formats: the registry, and the tokenized format beside the text ones.

The `tokenized` export format: `{"id", "input_ids", "loss_mask"}`, built with the run's tokenizer.

The mask rule: `loss_mask` is 1 on exactly the tokens the model generated, 0 on everything the chat
template wrote. The template itself draws the line: for each generated turn, the text the template
renders for the prompt with the generation prompt (`add_generation_prompt=True`) is the prompt, and
what the conversation with that turn added after it, up to and including the end-of-turn token, is
the model's. For the sim's model (Kimi-like template) a turn is

    <|im_assistant|>assistant<|im_middle|><think>  {reasoning}</think>{content}<|im_end|>
    └────────── prompt, mask 0 ───────────────────┘└───────────── mask 1 ─────────────────┘

so reasoning, the `</think>` marker, the content and `<|im_end|>` are 1; the role header and the
`<think>` the template opened are 0. With thinking off the template writes `<think></think>` itself
and only `{content}<|im_end|>` is 1. A turn cut at max_new_tokens (finish_reason "length") ends at
its last generated token: the markers the template would have closed it with were never generated,
so they are left out, and the sequence ends there. Earlier turns the model did not generate (the
prompt's own assistant turns) are prompt, mask 0. With `--regenerate all` every generated turn is 1
and the template text between them 0; the sequence ends with the last generated token.

Where `output_ids` were kept, a turn's tokens are those ids as the model produced them, never
re-tokenized: token-exact. SGLang 0.5.23 keeps the matched stop token in `output_ids` (only the
text drops it: `managers/detokenizer_manager.py::trim_matched_stop`); records whose ids lack it
(written by genfleet before it checked this) get it put back. Without
them, each stretch of text is tokenized on its own (no special tokens added: the template holds
them all), which is exactly how the producer tokenized the prompt.

A template that renders an earlier turn differently once a later one follows (one that drops past
reasoning, say) has no single token sequence holding every turn; such records are refused with an
error naming them, as are turns whose reasoning or content the template does not render.

Export formats: a completion record becomes one line of training or batch-result data, and
`FORMATS`, the one registry of them that the command and the exporter dispatch through.

Every format starts from the same `Conversation` (`records.py`): the prompt messages with the
generated assistant turn(s) in place.

Line shapes (one JSON object per line):
- specforge:    {"id", "conversations": [{"role", "content", "reasoning_content"?}, ...]}
- openai:       {"id", "messages": [{"role", "content", "reasoning_content"?}, ...]}
- sharegpt:     {"id", "conversations": [{"from": "system"|"human"|"gpt"|"tool", "value"}, ...]},
                a generated turn's value being `{start}{reasoning}{end}{content}` with the run's
                reasoning markers (`<think>…</think>` for kimi_k2), its content alone if it has no reasoning
- openai-batch: {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}, the
                body a `chat.completion` of the last generated turn (see `openai_batch_line`)
- tokenized:    {"id", "input_ids", "loss_mask"} (genfleet/export/formats.py)
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from genfleet.common.keys import ManifestFields
from genfleet.common.reasoning import ReasoningFormat, get_format
from genfleet.common.run_state import PERMANENT
from genfleet.export.records import Conversation, FormatError, GeneratedTurn, Record, conversation_of, generated_turns


class TokenizedFormat:
    def __init__(self, tokenizer: Any, chat_template_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
                 *, default_kwargs: Mapping[str, Any] | None = None) -> None:
        """`chat_template_kwargs`: per dataset, as the run was enqueued; `default_kwargs` for the
        rest (and over every dataset's when given on the command line)."""
        self.tokenizer = tokenizer
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.default_kwargs = default_kwargs
        backend = getattr(tokenizer, "backend_tokenizer", None)
        # The Rust tokenizer's batch encode, skipping the offsets nobody here reads.
        self._encode_batch = getattr(backend, "encode_batch_fast", None) or getattr(backend, "encode_batch", None)

    def __call__(self, record: Record) -> dict[str, Any]:
        conversation = conversation_of(record)
        input_ids, loss_mask = self.tokens(conversation)
        return {"id": record["id"], "input_ids": input_ids, "loss_mask": loss_mask}

    def tokens(self, conversation: Conversation) -> tuple[list[int], list[int]]:
        kwargs = dict(self._kwargs(conversation.dataset))
        full = self._render(conversation.messages, generation_prompt=False, kwargs=kwargs)
        # (text or ids, mask) pieces in order; text pieces are tokenized together at the end.
        pieces: list[tuple[str | list[int], int]] = []
        cursor = 0
        for index, turn in zip(conversation.generated, conversation.turns, strict=True):
            prompt = self._render(conversation.messages[:index], generation_prompt=True, kwargs=kwargs)
            with_turn = full if index == len(conversation.messages) - 1 else self._render(
                conversation.messages[: index + 1], generation_prompt=False, kwargs=kwargs)
            if len(prompt) < cursor or not full.startswith(prompt) or not full.startswith(with_turn):
                raise FormatError(f"{conversation.id}: the chat template renders earlier turns differently "
                                  "once later ones follow, so no single token sequence holds every turn")
            start = len(prompt)
            end = start + self._generated_length(conversation.id, turn, full[start:len(with_turn)])
            pieces.append((full[cursor:start], 0))
            pieces.append((self._turn_ids(turn) if turn.output_ids is not None else full[start:end], 1))
            cursor = end
        return self._assemble(pieces)

    def _kwargs(self, dataset: str) -> Mapping[str, Any]:
        if self.default_kwargs is not None:
            return self.default_kwargs
        return self.chat_template_kwargs.get(dataset, {})

    def _render(self, messages: list[dict[str, Any]], *, generation_prompt: bool, kwargs: dict[str, Any]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                                  **kwargs)

    def _generated_length(self, record_id: str, turn: GeneratedTurn, rendered: str) -> int:
        """How much of the template's rendering of a turn (after its generation prompt) the model
        generated: through the end-of-turn token if it stopped, through its last text if cut off."""
        for part, name in ((turn.reasoning, "reasoning"), (turn.content, "content")):
            if part and part not in rendered:
                raise FormatError(f"{record_id}: the chat template does not render the turn's {name} "
                                  "(reasoning_content / content), so its tokens cannot be masked")
        if turn.finish_reason == "stop":
            for marker in self._stop_markers(turn):
                position = rendered.rfind(marker)
                if position >= 0:
                    return position + len(marker)
            return len(rendered)
        if turn.content:
            return rendered.rfind(turn.content) + len(turn.content)
        if turn.reasoning:
            return rendered.find(turn.reasoning) + len(turn.reasoning)
        return 0

    def _stop_markers(self, turn: GeneratedTurn) -> list[str]:
        """The end-of-turn text to look for: the stop SGLang matched, else the tokenizer's EOS."""
        markers = []
        stop = turn.matched_stop
        if isinstance(stop, int):
            markers.append(self.tokenizer.decode([stop], skip_special_tokens=False))
        elif isinstance(stop, str):
            markers.append(stop)
        if self.tokenizer.eos_token:
            markers.append(self.tokenizer.eos_token)
        return [marker for marker in markers if marker]

    def _turn_ids(self, turn: GeneratedTurn) -> list[int]:
        """The turn's own token ids, the stop token the model generated included."""
        ids = list(turn.output_ids or [])
        if turn.finish_reason == "stop":
            stop = turn.matched_stop
            if isinstance(stop, int):
                if ids[-1:] != [stop]:
                    ids.append(stop)
            elif isinstance(stop, list):
                if ids[-len(stop):] != stop:
                    ids += stop
            elif isinstance(stop, str):
                ids += self._encode([stop])[0]
        return ids

    def _assemble(self, pieces: list[tuple[str | list[int], int]]) -> tuple[list[int], list[int]]:
        texts = [piece for piece, _ in pieces if isinstance(piece, str)]
        encoded = iter(self._encode(texts))
        input_ids: list[int] = []
        loss_mask: list[int] = []
        for piece, mask in pieces:
            ids = next(encoded) if isinstance(piece, str) else piece
            input_ids += ids
            loss_mask += [mask] * len(ids)
        return input_ids, loss_mask

    def _encode(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        if self._encode_batch is not None:
            return [encoding.ids for encoding in self._encode_batch(texts, add_special_tokens=False)]
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]


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
    trust_remote_code: bool = False  # --trust-remote-code, or the run's as enqueued


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
    trusted = inputs.trust_remote_code or (
        ledger is not None and ledger.manifest.get(ManifestFields.TRUST_REMOTE_CODE) == "1")
    tokenizer = load_tokenizer(directory, trust_remote_code=trusted)
    return BuiltFormat(TokenizedFormat(tokenizer, per_dataset, default_kwargs=default_kwargs),
                       directory)


FORMATS: dict[str, ExportFormat] = {spec.name: spec for spec in (
    ExportFormat("specforge", _fixed(specforge_line),
                 samples=SampleGrouping(sample_part, grouped_formatter("conversations"))),
    ExportFormat("sharegpt", _build_sharegpt),
    ExportFormat("openai", _fixed(openai_line), samples=SampleGrouping(sample_part, grouped_formatter("messages"))),
    ExportFormat("openai-batch", _fixed(openai_batch_line), error_line=openai_batch_error_line),
    ExportFormat("tokenized", _build_tokenized, expansion=3.0),
)}
