"""Request validation as SGLang 0.5.23 does it: `/generate` bodies and chat requests.

Parsing a `/generate` body into a typed request, with SGLang 0.5.23's kinds of rejection: the
schema gate's (`sglang/api/v1/api_types.py`, checked by `entrypoints/api_contract.py` before
anything runs) and the ValueErrors the TokenizerManager raises later (`SamplingParams.verify`,
`sampling/sampling_params.py`; the context checks, `managers/tokenizer_manager.py`).

Parsing a `/v1/chat/completions` body (SGLang's ChatCompletionRequest) and rendering its prompt
with the model's own chat template, as SGLang does before it generates.
"""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from genfleet.sim import SimError

# SamplingParams in declaration order (the order the schema lists them in "expected one of ..."),
# each with the type its decoder expects (sglang 0.5.23 `api/v1/api_types.py`
# `decode_SamplingParams`). Keys outside this table are rejected.
SAMPLING_FIELDS: dict[str, str] = {
    "max_new_tokens": "i64",
    "stop": "string or list",
    "stop_token_ids": "i64 list",
    "stop_regex": "string or list",
    "temperature": "f64",
    "top_p": "f64",
    "top_k": "i64",
    "min_p": "f64",
    "frequency_penalty": "f64",
    "presence_penalty": "f64",
    "repetition_penalty": "f64",
    "min_new_tokens": "i64",
    "n": "i64",
    "json_schema": "a string",
    "regex": "a string",
    "ebnf": "a string",
    "structural_tag": "a string",
    "ignore_eos": "a boolean",
    "skip_special_tokens": "a boolean",
    "spaces_between_special_tokens": "a boolean",
    "no_stop_trim": "a boolean",
    "stream_interval": "i64",
    "logit_bias": "f64 map",
    "sampling_seed": "i64",
    "custom_params": "any",
    "beam_width": "i64",
    "watermark": "watermark",
    "choice": "string list",
}
WATERMARK_FIELDS = {"enabled": "a boolean", "key": "a string", "context_window": "i64"}

DEFAULT_MAX_NEW_TOKENS = 128
NO_PROMPT = "Either text, input_ids or input_embeds should be provided."
_SAMPLING_EPS = 1e-6  # `sampling_params.py`: a temperature below it is greedy


class SchemaError(SimError):
    """Rejected by the schema gate before anything runs: HTTP 400 `{"error": "<message>"}`."""


class InvalidRequest(SimError, ValueError):
    """SGLang's ValueError: HTTP 400 for a plain request, an error chunk inside a stream."""


class BadRequest(SimError):
    """Not a JSON object at all: FastAPI's request validation answers this one."""


@dataclass(frozen=True)
class GenerateRequest:
    prompt: list[int] | str
    rid: str | None = None
    stream: bool = False
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    skip_special_tokens: bool = True
    stream_interval: int | None = None
    sampling_seed: int | None = None
    # The sampling_params as sent, for `verify_sampling` (run after the context checks, as SGLang does).
    sampling: dict[str, Any] = field(default_factory=dict)


def parse_generate_request(body: Any) -> GenerateRequest:
    """Raises BadRequest, SchemaError, or (for requests that stream) InvalidRequest."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    sampling = body.get("sampling_params") or {}
    if isinstance(sampling, list):
        raise InvalidRequest("the simulator does not serve batch requests (a list of sampling_params)")
    if not isinstance(sampling, dict):
        raise SchemaError(f"invalid type: {_serde_value(sampling)}, expected a map")
    _check_sampling_schema(sampling)
    stream = body.get("stream") or False
    _expect("a boolean", stream)
    rid = body.get("rid")
    if isinstance(rid, list):
        raise InvalidRequest("the simulator does not serve batch requests (a list of rids)")
    if rid is not None:
        _expect("a string", rid)
    return GenerateRequest(
        prompt=_prompt(body),
        rid=rid,
        stream=stream,
        max_new_tokens=_or_default(sampling.get("max_new_tokens"), DEFAULT_MAX_NEW_TOKENS),
        skip_special_tokens=_or_default(sampling.get("skip_special_tokens"), True),
        stream_interval=sampling.get("stream_interval"),
        sampling_seed=sampling.get("sampling_seed"),
        sampling=sampling,
    )


def verify_sampling(sampling: dict[str, Any], vocab_size: int) -> None:
    """`SamplingParams.__post_init__` then `verify` (sglang 0.5.23 `sampling/sampling_params.py`):
    the same checks in the same order, the same words; InvalidRequest for the first that fails.
    Values as sent: /generate passes its JSON numbers on as they are (`-1`, not `-1.0`), the chat
    API its pydantic floats.
    Also what the simulator cannot serve (n > 1, beam search, watermarks)."""
    def value(key: str, default: Any) -> Any:
        return _or_default(sampling.get(key), default)

    beam_width = sampling.get("beam_width")
    if beam_width is not None and beam_width < 1:
        raise InvalidRequest(f"beam_width must be at least 1, got {beam_width}.")
    temperature, top_k = value("temperature", 1.0), value("top_k", -1)
    if 0 <= temperature < _SAMPLING_EPS:
        temperature, top_k = 1.0, 1  # greedy
    if top_k == -1:
        top_k = 1 << 30  # the whole vocabulary
    if not math.isfinite(temperature) or temperature < 0.0:
        raise InvalidRequest(f"temperature must be a non-negative finite number, got {temperature}.")
    top_p, min_p = value("top_p", 1.0), value("min_p", 0.0)
    if not 0.0 < top_p <= 1.0:
        raise InvalidRequest(f"top_p must be in (0, 1], got {top_p}.")
    if not 0.0 <= min_p <= 1.0:
        raise InvalidRequest(f"min_p must be in [0, 1], got {min_p}.")
    if top_k < 1:
        raise InvalidRequest(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    frequency, presence = value("frequency_penalty", 0.0), value("presence_penalty", 0.0)
    if not -2.0 <= frequency <= 2.0:
        raise InvalidRequest(f"frequency_penalty must be in [-2, 2], got {frequency}.")
    if not -2.0 <= presence <= 2.0:
        raise InvalidRequest(f"presence_penalty must be in [-2, 2], got {presence}.")
    repetition = value("repetition_penalty", 1.0)
    if not 0.0 < repetition <= 2.0:
        raise InvalidRequest(f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {repetition}.")
    # An explicit null (the chat API without max_tokens) is no limit, and not checked.
    min_new_tokens, max_new_tokens = value("min_new_tokens", 0), sampling.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if not 0 <= min_new_tokens:
        raise InvalidRequest(f"min_new_tokens must be in [0, max_new_tokens], got {min_new_tokens}.")
    if max_new_tokens is not None and max_new_tokens < 0:
        raise InvalidRequest(f"max_new_tokens must be at least 0, got {max_new_tokens}.")
    if max_new_tokens is not None and not min_new_tokens <= max_new_tokens:
        raise InvalidRequest(f"min_new_tokens must be in [0, max_new_tokens({max_new_tokens})], got {min_new_tokens}.")
    for token_id in sampling.get("logit_bias") or {}:
        if not _is_int_text(token_id) or not 0 <= int(token_id) < vocab_size:
            raise InvalidRequest(f"logit_bias must has keys in [0, {vocab_size - 1}], got {token_id}.")
    seed = sampling.get("sampling_seed")
    if seed is not None and not -(2**63) <= seed <= 2**63 - 1:
        raise InvalidRequest(f"sampling_seed must be in [-2**63, 2**63 - 1], got {seed}.")
    if value("n", 1) != 1:
        raise InvalidRequest("the simulator serves n=1 only")
    if beam_width not in (None, 1):
        raise InvalidRequest("the simulator does not serve beam search")
    if sampling.get("watermark") is not None:
        raise InvalidRequest("the simulator does not watermark")


def _is_int_text(key: str) -> bool:
    try:
        int(key)
    except ValueError:
        return False
    return True


def _check_sampling_schema(sampling: dict[str, Any]) -> None:
    for key, value in sampling.items():
        if key not in SAMPLING_FIELDS:
            expected = ", ".join(f"`{name}`" for name in SAMPLING_FIELDS)
            raise SchemaError(f"unknown field `{key}`, expected one of {expected}")
        if value is not None:
            _expect(SAMPLING_FIELDS[key], value)


def _prompt(body: dict[str, Any]) -> list[int] | str:
    text, input_ids = body.get("text"), body.get("input_ids")
    if body.get("input_embeds") is not None:
        raise InvalidRequest("the simulator does not accept input_embeds")
    if text is None and input_ids is None:
        raise InvalidRequest(NO_PROMPT)
    if input_ids is None:  # with both, SGLang tokenizes nothing and serves the ids
        if isinstance(text, list):
            raise InvalidRequest("the simulator does not serve batch requests (a list of texts)")
        _expect("a string", text)
        assert isinstance(text, str)  # _expect raised otherwise
        return text
    _expect("sequence", input_ids)
    if not input_ids:
        raise InvalidRequest("input_ids cannot be empty.")  # `io_struct.py` `_determine_batch_size`
    if isinstance(input_ids[0], list):
        raise InvalidRequest("the simulator does not serve batch requests (a list of input_ids lists)")
    # Checked in bulk: prompts run to tens of thousands of ids.
    if not all(type(token_id) is int for token_id in input_ids):
        _expect("u32", next(token_id for token_id in input_ids if type(token_id) is not int))
    _expect("u32", min(input_ids))
    _expect("u32", max(input_ids))
    return input_ids


def _or_default(value: Any, default: Any) -> Any:
    return default if value is None else value


_INTEGER_RANGES = {"u32": (0, 2**32 - 1)}  # the simulator's own limit on token ids
_SCALARS = {"i64", "u32", "f64", "a boolean", "a string", "sequence"}


def _expect(kind: str, value: Any) -> None:
    """Type-check like the schema's decoder and word the failure the same way."""
    if kind == "any":
        return
    if kind == "string or list":  # `decode_StringOrList`
        if isinstance(value, list):
            _expect_each("a string", value)
        elif not isinstance(value, str):
            _fail(value, "a value or an array of values for StringOrList")
        return
    if kind in ("i64 list", "string list"):  # `decode_Int64List`, `choice`
        _expect_each("i64" if kind == "i64 list" else "a string", value)
        return
    if kind == "f64 map":  # logit_bias
        if not isinstance(value, dict):
            _fail(value, "a map")
        for bias in value.values():
            _expect("f64", bias)
        return
    if kind == "watermark":  # `decode_WatermarkRequestConfig`
        if not isinstance(value, dict):
            _fail(value, "struct WatermarkRequestConfig")
        for key, setting in value.items():
            if key not in WATERMARK_FIELDS:
                expected = ", ".join(f"`{name}`" for name in WATERMARK_FIELDS)
                raise SchemaError(f"unknown field `{key}`, expected one of {expected}")
            if setting is not None:
                _expect(WATERMARK_FIELDS[key], setting)
        return
    assert kind in _SCALARS, f"unknown schema type {kind}"
    if not _matches(kind, value):
        _fail(value, kind)
    if kind in _INTEGER_RANGES:
        low, high = _INTEGER_RANGES[kind]
        if not low <= value <= high:
            raise SchemaError(f"invalid value: integer `{value}`, expected {kind}")


def _expect_each(kind: str, value: Any) -> None:
    if not isinstance(value, list):
        _fail(value, "a sequence")
    for item in value:
        _expect(kind, item)


def _fail(value: Any, expected: str) -> None:
    raise SchemaError(f"invalid type: {_serde_value(value)}, expected {expected}")


def _matches(kind: str, value: Any) -> bool:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if kind in ("i64", "u32"):
        return is_int
    if kind == "f64":
        return is_int or isinstance(value, float)
    if kind == "a boolean":
        return isinstance(value, bool)
    if kind == "a string":
        return isinstance(value, str)
    return isinstance(value, list)  # "sequence"


def _serde_value(value: Any) -> str:
    """`_unexpected` of the schema's decoder: serde's wording."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    return "sequence" if isinstance(value, list) else "map"


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
