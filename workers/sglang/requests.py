"""The request bodies genfleet sends to SGLang, built from a task's payload.

Field names and defaults: sglang 0.5.23 `sampling/sampling_params.py` (`/generate`'s
`sampling_params`) and `entrypoints/openai/protocol.py` (`ChatCompletionRequest`). SGLang rejects an
unknown key inside `sampling_params` (HTTP 400), so only its own names are sent.
"""
from __future__ import annotations

from typing import Any

from common.records import TaskPayload


def generate_body(payload: TaskPayload, input_ids: list[int] | None, *, skip_special_tokens: bool,
                  stream_interval: int) -> dict[str, Any]:
    """`/generate`, streamed: the producer's token ids (or the text when there are none)."""
    sampling = {
        **payload.sampling,
        "max_new_tokens": payload.max_new_tokens,
        # Keep </think> in the text: with it skipped, reasoning silently merges into content.
        "skip_special_tokens": skip_special_tokens,
        # Per request: SGLang's server default of 1 makes cumulative streams quadratic in bytes.
        "stream_interval": stream_interval,
    }
    prompt = {"input_ids": input_ids} if input_ids is not None else {"text": payload.text}
    return {**prompt, "stream": True, "sampling_params": sampling}


def chat_body(payload: TaskPayload, messages: list[dict]) -> dict[str, Any]:
    """`/v1/chat/completions`: the server templates the messages and splits reasoning itself."""
    sampling = dict(payload.sampling)
    if "sampling_seed" in sampling:
        sampling["seed"] = sampling.pop("sampling_seed")  # the OpenAI API's name for it
    return {
        "model": "default", "messages": messages, "max_tokens": payload.max_new_tokens, **sampling,
        "chat_template_kwargs": payload.chat_template_kwargs, "separate_reasoning": True,
    }
