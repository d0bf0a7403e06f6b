"""Parsing a `/v1/chat/completions` body (SGLang's ChatCompletionRequest) and rendering its prompt
with the model's own chat template, as SGLang does before it generates."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from genfleet.sim.request import BadRequest, InvalidRequest

DEFAULT_MODEL_NAME = "default"  # SGLang's, when a request names no model

# `reasoning_effort` is turned into both thinking toggles (sglang's serving_chat does the same).
_THINKING_TOGGLES = ("thinking", "enable_thinking")


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, Any]]
    model: str = DEFAULT_MODEL_NAME
    max_tokens: int | None = None  # None: up to the context length
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    continuous_usage_stats: bool = False
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    skip_special_tokens: bool = True
    rid: str | None = None
    # The request's sampling params as SGLang passes them on (`ChatCompletionRequest.
    # to_sampling_params`, sglang 0.5.23 `entrypoints/openai/protocol.py`), for `verify_sampling`.
    sampling: dict[str, Any] = field(default_factory=dict)


def parse_chat_request(body: Any) -> ChatRequest:
    """Raises BadRequest (a field of the wrong type: pydantic's 400) or InvalidRequest (SGLang's
    own checks: 400 BadRequestError). Unknown top-level fields are ignored, as pydantic does."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    messages = _field(body, "messages", list, required=True)
    if not messages:
        raise InvalidRequest("Messages cannot be empty.")
    options = _field(body, "stream_options", dict) or {}
    kwargs = dict(_field(body, "chat_template_kwargs", dict) or {})
    effort = kwargs.pop("reasoning_effort", None) or _field(body, "reasoning_effort", (str, int, float))
    if effort is not None:
        for toggle in _THINKING_TOGGLES:
            kwargs.setdefault(toggle, effort != "none")
    max_completion_tokens = _field(body, "max_completion_tokens", int)
    max_tokens = max_completion_tokens if max_completion_tokens is not None else _field(body, "max_tokens", int)
    sampling = {key: _number(_field(body, source, kind), kind) for key, source, kind in _SAMPLING}
    sampling["max_new_tokens"] = max_tokens
    rid = _field(body, "rid", (str, list))
    if isinstance(rid, list):
        raise InvalidRequest("the simulator does not serve batch requests (a list of rids)")
    return ChatRequest(
        messages=[_message(index, message) for index, message in enumerate(messages)],
        model=_field(body, "model", str) or DEFAULT_MODEL_NAME,
        max_tokens=max_tokens,
        seed=_field(body, "seed", int),
        stream=_field(body, "stream", bool) or False,
        include_usage=_field(options, "include_usage", bool) or False,
        continuous_usage_stats=_field(options, "continuous_usage_stats", bool) or False,
        chat_template_kwargs=kwargs,
        separate_reasoning=_flag(body, "separate_reasoning", True),
        stream_reasoning=_flag(body, "stream_reasoning", True),
        skip_special_tokens=_flag(body, "skip_special_tokens", True),
        rid=rid,
        # max_new_tokens stays when null: no limit (SamplingParams skips its checks then).
        sampling={key: value for key, value in sampling.items() if value is not None or key == "max_new_tokens"},
    )


def _message(index: int, message: Any) -> dict[str, Any]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise BadRequest(f"messages.{index}: a message is an object with a string 'role'")
    content = message.get("content")
    if content is None:
        content = ""
    elif isinstance(content, list):
        # A text-only model's template takes a string: the text parts, joined.
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    elif not isinstance(content, str):
        raise BadRequest(f"messages.{index}.content: Input should be a valid string or a list of parts")
    return {**message, "content": content}


# (sampling param, chat field, type): what `to_sampling_params` takes from the request.
_SAMPLING = (
    ("temperature", "temperature", (int, float)),
    ("top_p", "top_p", (int, float)),
    ("top_k", "top_k", int),
    ("min_p", "min_p", (int, float)),
    ("frequency_penalty", "frequency_penalty", (int, float)),
    ("presence_penalty", "presence_penalty", (int, float)),
    ("repetition_penalty", "repetition_penalty", (int, float)),
    ("min_new_tokens", "min_tokens", int),
    ("n", "n", int),
    ("logit_bias", "logit_bias", dict),
    ("sampling_seed", "seed", int),
)

_TYPE_NAMES = {bool: "boolean", int: "integer", str: "string", list: "list", dict: "dictionary"}


def _field(body: dict[str, Any], key: str, kind: type | tuple[type, ...], *, required: bool = False) -> Any:
    value = body.get(key)
    if value is None:
        if required:
            raise BadRequest(f"{key}: Field required")
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # JSON booleans are Python ints; only a field that wants a boolean takes one.
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
        raise BadRequest(f"{key}: Input should be a valid {names}")
    return value


def _number(value: Any, kind: type | tuple[type, ...]) -> Any:
    """A float field's value as pydantic hands it on: a float (`-1` becomes `-1.0`)."""
    return float(value) if kind == (int, float) and value is not None else value


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = _field(body, key, bool)
    return default if value is None else value


class ChatTemplate:
    """The model's chat template through `transformers`, loaded on the first chat request: the
    import takes a second, which `/generate`-only servers never pay."""

    def __init__(self, tokenizer_dir: Path) -> None:
        self._dir = tokenizer_dir
        self._tokenizer: Any = None
        self._lock = asyncio.Lock()

    async def load(self) -> None:
        if self._tokenizer is None:
            async with self._lock:
                if self._tokenizer is None:
                    from genfleet.common.tokenizer import load_tokenizer

                    # In a thread: running streams keep their pace meanwhile.
                    self._tokenizer = await asyncio.to_thread(load_tokenizer, self._dir)

    def prompt_ids(self, request: ChatRequest) -> list[int]:
        """The template's ids for the messages and the generation prompt (call `load` first)."""
        import jinja2

        try:
            text = self._tokenizer.apply_chat_template(
                request.messages, tokenize=False, add_generation_prompt=True, **request.chat_template_kwargs
            )
        except (jinja2.TemplateError, TypeError, ValueError) as error:
            raise InvalidRequest(str(error)) from error
        return self._tokenizer.encode(text, add_special_tokens=False)
