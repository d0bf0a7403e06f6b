"""The request bodies genfleet sends to SGLang, built from a task's payload.

Field names and defaults: sglang 0.5.23 `sampling/sampling_params.py` (`/generate`'s
`sampling_params`) and `entrypoints/openai/protocol.py` (`ChatCompletionRequest`). SGLang rejects an
unknown key inside `sampling_params` (HTTP 400), so only its own names are sent.
"""
from __future__ import annotations

from typing import Any

from genfleet.common.records import TaskPayload


def generate_body(payload: TaskPayload, input_ids: list[int] | None, *, skip_special_tokens: bool,
                  stream_interval: int, require_reasoning: bool = False) -> dict[str, Any]:
    """`/generate`, streamed: the producer's token ids (or the text when there are none).

    `require_reasoning`: the output starts inside the reasoning (the template opened it). SGLang
    counts `meta_info.reasoning_tokens` (up to and including the end marker) only for a request
    that says so (0.5.23 `managers/io_struct.py` `GenerateReqInput.require_reasoning`, read by
    `scheduler_components/batch_result_processor.py::_maybe_update_reasoning_tokens`; its chat
    endpoint sets it itself): without it every /generate record counted 0 reasoning tokens. The
    count needs the server's `--reasoning-parser` (its end marker's ids); without one it stays 0."""
    sampling = {
        **payload.sampling,
        "max_new_tokens": payload.max_new_tokens,
        # Keep </think> in the text: with it skipped, reasoning silently merges into content.
        "skip_special_tokens": skip_special_tokens,
        # Per request: SGLang's server default of 1 makes cumulative streams quadratic in bytes.
        "stream_interval": stream_interval,
    }
    prompt = {"input_ids": input_ids} if input_ids is not None else {"text": payload.text}
    body = {**prompt, "stream": True, "sampling_params": sampling}
    if require_reasoning:
        body["require_reasoning"] = True
    return body


def chat_body(payload: TaskPayload, messages: list[dict]) -> dict[str, Any]:
    """`/v1/chat/completions`: the server templates the messages and splits reasoning itself."""
    sampling = dict(payload.sampling)
    if "sampling_seed" in sampling:
        sampling["seed"] = sampling.pop("sampling_seed")  # the OpenAI API's name for it
    return {
        "model": "default", "messages": messages, "max_tokens": payload.max_new_tokens, **sampling,
        "chat_template_kwargs": payload.chat_template_kwargs, "separate_reasoning": True,
    }
