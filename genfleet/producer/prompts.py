"""Dataset rows into prompts: chat messages, stable ids, the chat template, the partition and the
samples of each.

Normalises a dataset row to OpenAI chat messages and cuts it to the prompt to generate from.

Row formats: OpenAI `messages`; ShareGPT `conversations` (`from`/`value` or `role`/`content`); a plain
prompt string (field `prompt` unless told otherwise); an OpenAI Batch request line (`custom_id`,
`body.messages`, `body.max_tokens`). `auto` picks by the fields present, in that order of checks.

Prompt ids (each record's `id`: docs/ARCHITECTURE.md, "The record contract"): `{dataset}/{key}`,
the key being the row's own `id` (or OpenAI Batch `custom_id`), else its 0-based row index. The
same input always yields the same ids.

Which queue a prompt goes to: a pinned dataset decides, else its total token need.

Applies the model's chat template and counts prompt tokens, a batch at a time: a fast tokenizer's
Rust encode over the whole batch, a Python (custom-code) one's in several processes.

`--samples N`: N independent completions of each prompt, each its own task.

Sample k of the prompt in row r takes the row slot `r * N + k` in the run's enqueued and done
bitmaps, so every sample is enqueued, retried, dead-lettered, requeued and settled on its own, and a
re-run of `enqueue` publishes exactly the samples not yet claimed. Its id is `{prompt id}#{k}`.

Its `sampling_seed` is derived from the prompt id, the sample index and the run's `--seed` (0 when
none), so the same run file asks the same seeds again. SGLang honours a per-request seed only under
`--enable-deterministic-inference` (0.5.23 `sampling/sampling_batch_info.py` builds the seed tensor
only `if enable_deterministic`); without it the samples are still independent draws (sampling is
random at temperature > 0), just not reproducible.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal, NamedTuple, TypeVar, get_args

from genfleet.common.queues import LONG, SHORT
from genfleet.common.records import TaskPayload
from genfleet.common.tokenizer import load_tokenizer, render_prompts
from genfleet.producer import ProducerError
from genfleet.producer.templating_processes import POOLED_BATCH, TemplatingProcesses

Message = dict[str, Any]
RowFormat = Literal["auto", "messages", "sharegpt", "prompt", "openai_batch"]
ROW_FORMATS: tuple[str, ...] = get_args(RowFormat)

SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
    "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "model": "assistant",
    "system": "system", "tool": "tool", "function": "tool", "observation": "tool",
    "function_call": "assistant",
}


class RowRejected(ProducerError, ValueError):
    """The row cannot become a prompt; the message says why."""


class RowPrompt(NamedTuple):
    messages: list[Message]
    # The row's own cap on new tokens (OpenAI Batch `max_tokens`), None when it has none.
    max_tokens: int | None = None


def read_row(data: dict[str, Any], row_format: str = "auto", prompt_field: str = "prompt") -> RowPrompt:
    if row_format == "auto":
        row_format = _detect(data, prompt_field)
    if row_format == "messages":
        return RowPrompt(_openai_messages(_field(data, "messages")))
    if row_format == "sharegpt":
        return RowPrompt(_sharegpt_messages(_field(data, "conversations")))
    if row_format == "prompt":
        prompt = _field(data, prompt_field)
        if not isinstance(prompt, str):
            raise RowRejected(f"'{prompt_field}' must be a string, got {type(prompt).__name__}")
        return RowPrompt([{"role": "user", "content": prompt}])
    if row_format == "openai_batch":
        return _batch_request(data)
    raise ValueError(f"unknown row format {row_format!r} (one of {', '.join(ROW_FORMATS)})")


def prompt_messages(messages: list[Message]) -> list[Message]:
    """The conversation up to its last user turn: the assistant reply after it is regenerated."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        raise RowRejected("no user turn")
    return messages[: last_user + 1]


def _detect(data: dict[str, Any], prompt_field: str) -> str:
    if "messages" in data:
        return "messages"
    if "conversations" in data:
        return "sharegpt"
    if isinstance(data.get("body"), dict):
        return "openai_batch"
    if prompt_field in data:
        return "prompt"
    raise RowRejected(f"no 'messages', 'conversations', 'body' or '{prompt_field}' field")


def _field(data: dict[str, Any], name: str) -> Any:
    if name not in data:
        raise RowRejected(f"no '{name}' field")
    return data[name]


def _batch_request(data: dict[str, Any]) -> RowPrompt:
    body = data.get("body")
    if not isinstance(body, dict):
        raise RowRejected("OpenAI batch line without a 'body' object")
    messages = _openai_messages(_field(body, "messages"))
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or max_tokens < 1):
        raise RowRejected(f"body.max_tokens must be a positive integer, got {max_tokens!r}")
    return RowPrompt(messages, max_tokens)


def _openai_messages(raw: Any) -> list[Message]:
    if not isinstance(raw, list) or not raw:
        raise RowRejected("'messages' must be a non-empty list")
    messages = []
    for index, message in enumerate(raw):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RowRejected(f"messages[{index}] has no 'role'")
        content = message.get("content")
        if content is None and message["role"] == "assistant":
            content = ""  # a tool-calling turn
        if not isinstance(content, str):
            raise RowRejected(f"messages[{index}] content must be a string, got {type(content).__name__}")
        if content is not message.get("content") or None in message.values():
            # Columnar sources give every message every field of the column's schema, mostly None.
            message = {key: value for key, value in message.items() if value is not None}
            message["content"] = content
        messages.append(message)
    return messages


def _sharegpt_messages(raw: Any) -> list[Message]:
    if not isinstance(raw, list) or not raw:
        raise RowRejected("'conversations' must be a non-empty list")
    messages = []
    for index, turn in enumerate(raw):
        if not isinstance(turn, dict):
            raise RowRejected(f"conversations[{index}] is not an object")
        # Either naming; a columnar source has both keys, one of them None.
        speaker = turn.get("from") if turn.get("from") is not None else turn.get("role")
        text = turn.get("value") if turn.get("value") is not None else turn.get("content")
        role = SHAREGPT_ROLES.get(str(speaker).lower())
        if role is None:
            raise RowRejected(f"conversations[{index}] has unknown speaker {speaker!r}")
        if not isinstance(text, str):
            raise RowRejected(f"conversations[{index}] text must be a string, got {type(text).__name__}")
        messages.append({"role": role, "content": text})
    return messages


class RowKey(NamedTuple):
    text: str
    own: bool  # the row brought it (`id` / `custom_id`), rather than its index


def row_key(data: dict[str, Any], row: int) -> RowKey:
    key = data.get("id")
    if key is None:
        key = data.get("custom_id")
    if key is None:
        return RowKey(str(row), False)
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise RowRejected(f"id must be a string or an integer, got {type(key).__name__}")
    return RowKey(str(key), True)


def prompt_id(dataset: str, data: dict[str, Any], row: int) -> str:
    return f"{dataset}/{row_key(data, row).text}"


class DuplicateIds:
    """Remembers the keys seen in one pass over a dataset; the first row with a key wins.

    Every (re-)run reads the dataset from its start, so the same rows lose every time. Only the keys
    rows bring themselves are kept (index keys are unique by construction), so ids cost memory only
    when the dataset has its own.
    """

    def __init__(self) -> None:
        self._own_keys: set[str] = set()

    def is_duplicate(self, key: RowKey) -> bool:
        if not key.own:
            # An index key collides only with an earlier row whose own id is that number.
            return key.text in self._own_keys
        if key.text in self._own_keys:
            return True
        self._own_keys.add(key.text)
        return False


def choose_partition(prompt_tokens: int, *, pinned: str | None, max_new_tokens_short: int,
                     long_threshold: int) -> str:
    if pinned is not None:
        return pinned
    return LONG if prompt_tokens + max_new_tokens_short > long_threshold else SHORT




class PromptTemplater:
    def __init__(self, tokenizer_dir: str, chat_template_kwargs: dict[str, Any] | None = None, *,
                 trust_remote_code: bool = False, processes: int = 1) -> None:
        """`processes`: how many interpreters may template with a Python (custom-code) tokenizer
        (producer/templating_processes.py); a fast tokenizer's Rust encode needs none."""
        self.tokenizer_dir = tokenizer_dir
        self.tokenizer = load_tokenizer(tokenizer_dir, trust_remote_code=trust_remote_code)
        self.chat_template_kwargs = chat_template_kwargs or {}
        # The Rust tokenizer behind a fast tokenizer: its batch encode runs on every core and
        # `encode_batch_fast` skips the offsets nobody here reads.
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        self._encode = getattr(backend, "encode_batch_fast", None) or getattr(backend, "encode_batch", None)
        self._trust_remote_code = trust_remote_code
        # Started at the first batch worth splitting (a few prompts never spawn an interpreter).
        self._pool_size = processes if self._encode is None and processes > 1 else 1
        self._processes: TemplatingProcesses | None = None

    def close(self) -> None:
        if self._processes is not None:
            self._processes.close()

    def __enter__(self) -> PromptTemplater:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def context_length(self) -> int | None:
        """The tokenizer's `model_max_length`, unless it is transformers' "unset" sentinel."""
        value = getattr(self.tokenizer, "model_max_length", None)
        return value if isinstance(value, int) and value < 10**8 else None

    def render(self, conversations: list[list[Message]],
               chat_template_kwargs: dict[str, Any] | None = None) -> list[list[int]]:
        """Token ids of each conversation's prompt, generation prompt included."""
        if not conversations:
            return []
        kwargs = self.chat_template_kwargs if chat_template_kwargs is None else chat_template_kwargs
        if self._encode is None:
            if self._processes is not None and len(conversations) >= POOLED_BATCH:
                return self._processes.render(conversations, kwargs)
            if self._processes is None and self._pool_size > 1 and len(conversations) >= POOLED_BATCH:
                # They load the tokenizer while this batch is templated here.
                self._processes = TemplatingProcesses(self.tokenizer_dir, trust_remote_code=self._trust_remote_code,
                                                      processes=self._pool_size)
            return render_prompts(self.tokenizer, conversations, kwargs)
        texts = self.tokenizer.apply_chat_template(conversations, tokenize=False, add_generation_prompt=True,
                                                   **kwargs)
        # The template holds every special token it wants: add none (no double BOS).
        return [encoding.ids for encoding in self._encode(texts, add_special_tokens=False)]


T = TypeVar("T")
# Prompts whose samples are interleaved in the queue: sample k of a prompt follows sample k-1 by
# this many tasks, long enough for the first one's prefill to be cached on its host before the next
# arrives, short enough that the cache still holds it.
SPREAD_GROUP = 256


def sample_slots(row: int, samples: int) -> list[int]:
    """The bitmap slots of a prompt's samples (the row itself without `--samples`)."""
    return [row * samples + k for k in range(samples)]


def sample_seed(prompt_id: str, sample: int, base_seed: int = 0) -> int:
    """A seed in SGLang's accepted range ([-2**63, 2**63 - 1], `SamplingParams.verify`), stable
    across processes and machines (never Python's salted hash)."""
    digest = hashlib.blake2b(f"{base_seed}\0{prompt_id}\0{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def sample_payload(base: TaskPayload, slot: int, samples: int) -> TaskPayload:
    sample = slot % samples
    sampling = {**base.sampling,
                "sampling_seed": sample_seed(base.id, sample, int(base.sampling.get("sampling_seed") or 0))}
    return replace(base, id=f"{base.id}#{sample}", row=slot, sample=sample, sampling=sampling)


def spread_samples(per_prompt: Sequence[Sequence[T]], group: int = SPREAD_GROUP) -> list[T]:
    """The queue order of a batch's tasks: within each group of prompts, every prompt's sample 0,
    then every sample 1, ... SGLang's default FCFS scheduler prefills requests that arrive together
    in one batch, so samples of one prompt sent back to back would all miss its prefix cache
    (in-batch prefix caching only applies to the cache-aware policies: 0.5.23
    `managers/schedule_policy.py::_compute_prefix_matches`; the default is "fcfs",
    `arg_groups/fields/schedule.py`). Spread out, each later sample finds the prompt cached on the
    host its affinity key routes it to (workers/upstreams.py)."""
    ordered: list[T] = []
    for start in range(0, len(per_prompt), group):
        chunk = per_prompt[start:start + group]
        for k in range(max((len(tasks) for tasks in chunk), default=0)):
            ordered += [tasks[k] for tasks in chunk if k < len(tasks)]
    return ordered
