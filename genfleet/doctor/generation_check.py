"""A test generation through each upstream, sent and split as a worker would: the probe prompt's
ids from the chat template (`template_checks.probe_template`), `workers/generation/client.py`'s body
with a few `max_new_tokens`, streamed by the workers' `SglangClient` and split by their
`CompletionSplitter` with the configured parser and the tokenizer.

It shows what no setting can: that the tokenizer is the server's model's (its ids decode to the
server's text, else `IntegrityError`, as a worker would fail every prompt), and that reasoning comes
out as reasoning. Where the parser expects reasoning, something must open it, the prompt or the
model; when neither does, the split files the whole answer as reasoning (a forced parser) or finds
none, and the run's records would be wrong from the first one.
"""
from __future__ import annotations

import time
from typing import Any

from genfleet.common.reasoning import ReasoningFormat
from genfleet.common.records import TaskPayload
from genfleet.common.settings import Settings
from genfleet.doctor.checks import Check, fail, ok, warn
from genfleet.doctor.template_checks import MODEL_TOKENIZER_FIX, PROBE_MESSAGES, Opening, TemplateProbe, variant_label
from genfleet.workers.errors import GenerationError, IntegrityError
from genfleet.workers.generation.client import SglangClient, generate_body
from genfleet.workers.generation.split import CompletionSplitter

PROBE_MAX_NEW_TOKENS = 64
PROBE_DEADLINE_S = 60.0


def generation_check(client: SglangClient, url: str, model: str, tokenizer: Any, probe: TemplateProbe,
                     settings: Settings, fmt: ReasoningFormat | None) -> Check:
    name = f"test generation {url}{variant_label(probe.variant)}"
    payload = TaskPayload(run="doctor", id="doctor/0", dataset="doctor", row=0, partition="short",
                          prompt_tokens=len(probe.input_ids), max_new_tokens=PROBE_MAX_NEW_TOKENS,
                          messages=PROBE_MESSAGES, input_ids=probe.input_ids,
                          chat_template_kwargs=probe.variant.kwargs)
    body = generate_body(payload, probe.input_ids, skip_special_tokens=settings.skip_special_tokens,
                         stream_interval=settings.stream_interval)
    try:
        generation = client.generate(url, body, deadline=time.monotonic() + PROBE_DEADLINE_S)
    except GenerationError as error:
        return fail(name, f"POST /generate failed: {error}", "see the server's log; retry once it answers")
    mismatch = f"not the tokenizer of the server's model ({model})"
    if generation.prompt_tokens != len(probe.input_ids):
        return fail(name, f"the server counted {generation.prompt_tokens} prompt tokens for "
                          f"{len(probe.input_ids)} ids sent: {mismatch}", MODEL_TOKENIZER_FIX)
    if generation.output_ids and max(generation.output_ids) >= len(tokenizer):
        return fail(name, f"the server generated id {max(generation.output_ids)}, beyond the tokenizer's "
                          f"{len(tokenizer):,}: {mismatch}", MODEL_TOKENIZER_FIX)
    splitter = CompletionSplitter(settings.reasoning_parser, tokenizer,
                                  skip_special_tokens=settings.skip_special_tokens)
    try:
        # A server that streams no ids leaves only the text to split (and nothing to compare it with).
        text = splitter.checked_text(generation) if generation.output_ids else generation.text
    except IntegrityError as error:
        return fail(name, f"{error}: {mismatch}", MODEL_TOKENIZER_FIX)
    split = splitter.split(generation, probe.variant.kwargs)
    seen = (f"{generation.completion_tokens} tokens ({generation.finish_reason.get('type')}): reasoning "
            f"{len(split.reasoning)} chars{', closed' if split.closed else ''}, content {len(split.content)} chars")
    if fmt is None or not probe.expects_reasoning:
        return ok(name, f"{seen}; no reasoning expected")
    opened_by = ("the template" if probe.opening is Opening.TEMPLATE_OPENS else
                 "the model" if fmt.harmony or text.lstrip().startswith(fmt.start) else None)
    if opened_by is None:
        return fail(name, f"{seen}: neither the prompt nor the model opened reasoning ({fmt.start}), so parser "
                          f"{fmt.name} {'filed the answer as reasoning' if fmt.forced else 'found none'}",
                    "use the model's own chat template and its --reasoning-parser (GENFLEET_REASONING_PARSER)")
    if not split.reasoning.strip():
        return fail(name, f"{seen}: empty reasoning with parser {fmt.name}",
                    "use the model's own chat template and its --reasoning-parser (GENFLEET_REASONING_PARSER)")
    if not split.closed and generation.finish_reason.get("type") == "stop":
        return warn(name, f"{seen}: the model stopped without closing its reasoning ({fmt.end})",
                    f"check that {fmt.name} is this model's reasoning parser")
    return ok(name, f"{seen}; reasoning opened by {opened_by}")
