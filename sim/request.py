"""Parsing a `/generate` body into a typed request, with SGLang 0.5.23's two kinds of rejection."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# SamplingParams in declaration order (the order serde lists them in "expected one of ..."),
# each with the type its schema declares. Keys outside this table are rejected.
SAMPLING_FIELDS: dict[str, str] = {
    "max_new_tokens": "i32",
    "stop": "string or sequence",
    "stop_token_ids": "sequence",
    "stop_regex": "string or sequence",
    "temperature": "f32",
    "top_p": "f32",
    "top_k": "i32",
    "min_p": "f32",
    "frequency_penalty": "f32",
    "presence_penalty": "f32",
    "repetition_penalty": "f32",
    "min_new_tokens": "i32",
    "n": "i32",
    "json_schema": "a string",
    "regex": "a string",
    "ebnf": "a string",
    "structural_tag": "a string",
    "ignore_eos": "a boolean",
    "skip_special_tokens": "a boolean",
    "spaces_between_special_tokens": "a boolean",
    "no_stop_trim": "a boolean",
    "stream_interval": "i32",
    "logit_bias": "any",
    "sampling_seed": "i64",
    "custom_params": "any",
}

DEFAULT_MAX_NEW_TOKENS = 128
NO_PROMPT = "Either text, input_ids or input_embeds should be provided."


class SchemaError(Exception):
    """Rejected by the schema gate before anything runs: HTTP 400 `{"error": "<message>"}`."""


class InvalidRequest(ValueError):
    """SGLang's ValueError: HTTP 400 for a plain request, an error chunk inside a stream."""


class BadRequest(Exception):
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
        max_new_tokens=_max_new_tokens(sampling),
        skip_special_tokens=_or_default(sampling.get("skip_special_tokens"), True),
        stream_interval=sampling.get("stream_interval"),
        sampling_seed=sampling.get("sampling_seed"),
    )


def _check_sampling_schema(sampling: dict[str, Any]) -> None:
    for key, value in sampling.items():
        if key not in SAMPLING_FIELDS:
            expected = ", ".join(f"`{name}`" for name in SAMPLING_FIELDS)
            raise SchemaError(f"unknown field `{key}`, expected one of {expected}")
        if value is not None:
            _expect(SAMPLING_FIELDS[key], value)
    if sampling.get("n") not in (None, 1):
        raise InvalidRequest("the simulator serves n=1 only")


def _prompt(body: dict[str, Any]) -> list[int] | str:
    text, input_ids = body.get("text"), body.get("input_ids")
    if body.get("input_embeds") is not None:
        raise InvalidRequest("the simulator does not accept input_embeds")
    if (text is None) == (input_ids is None):
        raise InvalidRequest(NO_PROMPT)
    if text is not None:
        if isinstance(text, list):
            raise InvalidRequest("the simulator does not serve batch requests (a list of texts)")
        _expect("a string", text)
        return text
    _expect("sequence", input_ids)
    if input_ids and isinstance(input_ids[0], list):
        raise InvalidRequest("the simulator does not serve batch requests (a list of input_ids lists)")
    # Checked in bulk: prompts run to tens of thousands of ids.
    if not all(type(token_id) is int for token_id in input_ids):
        _expect("u32", next(token_id for token_id in input_ids if type(token_id) is not int))
    if input_ids:
        _expect("u32", min(input_ids))
        _expect("u32", max(input_ids))
    return input_ids


def _max_new_tokens(sampling: dict[str, Any]) -> int:
    value = _or_default(sampling.get("max_new_tokens"), DEFAULT_MAX_NEW_TOKENS)
    if value < 0:
        raise InvalidRequest(f"max_new_tokens must be at least 0, got {value}.")
    return value


def _or_default(value: Any, default: Any) -> Any:
    return default if value is None else value


_INTEGER_RANGES = {"i32": (-(2**31), 2**31 - 1), "u32": (0, 2**32 - 1), "i64": (-(2**63), 2**63 - 1)}


def _expect(kind: str, value: Any) -> None:
    """Type-check like serde and word the failure the same way."""
    if kind == "any" or _matches(kind, value):
        if kind in _INTEGER_RANGES:
            low, high = _INTEGER_RANGES[kind]
            if not low <= value <= high:
                raise SchemaError(f"invalid value: integer `{value}`, expected {kind}")
        return
    raise SchemaError(f"invalid type: {_serde_value(value)}, expected {kind}")


def _matches(kind: str, value: Any) -> bool:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if kind in _INTEGER_RANGES:
        return is_int
    if kind == "f32":
        return is_int or isinstance(value, float)
    if kind == "a boolean":
        return isinstance(value, bool)
    if kind == "a string":
        return isinstance(value, str)
    if kind == "sequence":
        return isinstance(value, list)
    if kind == "string or sequence":
        return isinstance(value, (str, list))
    raise AssertionError(f"unknown schema type {kind}")


def _serde_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value!r}`"
    if isinstance(value, str):
        return f'string "{value}"'
    return "sequence" if isinstance(value, list) else "map"
