"""The tokenizer and its chat template, against the reasoning parser the workers split with.

The classic silent failure: a template that closes reasoning in the prompt (`<think></think>`: thinking
off) under a parser that expects the output to start inside reasoning (`kimi_k2`, `deepseek-r1`,
...): the model answers straight away and every answer is filed as reasoning. Or the reverse, a
template that opens reasoning under a parser that waits for the model to open it (`kimi`): every
thought lands in the content. Which of the two a template does is read from the generation prompt
it appends to a one-line conversation; the test generation (`generation_check`) then shows what the
model does with it.
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genfleet.common.reasoning import ReasoningFormat
from genfleet.common.tokenizer import load_tokenizer, render_prompts
from genfleet.doctor.checks import Check, fail, ok
from genfleet.doctor.plan import TemplateVariant

PROBE_MESSAGES = [{"role": "user", "content": "What is 2 + 2? Answer in one word."}]
# The parts of a reasoning marker that must be single special tokens (as in sim/completion.py).
SPECIAL_PIECE = re.compile(r"<\|[^|<>]+\|>|</?think>|◁/?think▷")
MODEL_TOKENIZER_FIX = "pass --tokenizer the model's own directory (the one the server loaded)"


class Opening(enum.Enum):
    TEMPLATE_OPENS = "opens"  # the generation prompt ends inside reasoning (Kimi-K2.5, DeepSeek-R1)
    TEMPLATE_CLOSES = "closes"  # it opens and closes reasoning: thinking off
    MODEL_OPENS = "leaves"  # no start marker: the model writes it (or not)


@dataclass(frozen=True)
class TemplateProbe:
    variant: TemplateVariant
    input_ids: list[int]
    generation_prompt: str  # what `add_generation_prompt` appended to the conversation
    expects_reasoning: bool
    opening: Opening | None  # None: a format without think markers (Harmony) or no parser


def tokenizer_check(path: Path | None, fmt: ReasoningFormat | None) -> tuple[Any | None, Check]:
    """The tokenizer (None when unusable) and its row: vocabulary, and the parser's markers."""
    if path is None:
        return None, fail("tokenizer", "no tokenizer given", "pass --tokenizer DIR (or `tokenizer` in the run file)")
    try:
        tokenizer = load_tokenizer(path)
    except Exception as error:  # noqa: BLE001 - transformers and tokenizers raise many kinds for a bad dir
        text = str(error) if str(path) in str(error) else f"{path}: {error}"
        return None, fail("tokenizer", text, MODEL_TOKENIZER_FIX)
    markers = [piece for marker in (fmt.start, fmt.end) for piece in SPECIAL_PIECE.findall(marker)] if fmt else []
    found = []
    for piece in dict.fromkeys(markers):
        ids = tokenizer.encode(piece, add_special_tokens=False)
        if len(ids) != 1:
            return None, fail("tokenizer", f"{path}: {piece!r}, a marker of parser {fmt.name}, is {len(ids)} tokens, "
                                           "not one: not this parser's model", MODEL_TOKENIZER_FIX + " or the right "
                                           "--reasoning-parser")
        found.append(f"{piece} = {ids[0]}")
    markers_text = f"; {', '.join(found)}" if found else ""
    return tokenizer, ok("tokenizer", f"{path}: vocab {len(tokenizer):,}, EOS {tokenizer.eos_token}{markers_text}")


def probe_template(tokenizer: Any, variant: TemplateVariant, fmt: ReasoningFormat | None) -> TemplateProbe:
    """Renders the probe conversation as the producer does (`render_prompts`); raises what the
    template raises."""
    kwargs = variant.kwargs
    ids = render_prompts(tokenizer, [PROBE_MESSAGES], kwargs)[0]
    bare = tokenizer.apply_chat_template(PROBE_MESSAGES, tokenize=False, add_generation_prompt=False, **kwargs)
    full = tokenizer.apply_chat_template(PROBE_MESSAGES, tokenize=False, add_generation_prompt=True, **kwargs)
    generation_prompt = full[len(bare):] if full.startswith(bare) else full
    expects = fmt is not None and not (fmt.toggle and kwargs.get(fmt.toggle) is False)
    opening = None
    if fmt is not None and not fmt.harmony:
        at = generation_prompt.rfind(fmt.start)
        opening = (Opening.MODEL_OPENS if at == -1 else
                   Opening.TEMPLATE_CLOSES if fmt.end in generation_prompt[at:] else Opening.TEMPLATE_OPENS)
    return TemplateProbe(variant, ids, generation_prompt, expects, opening)


def template_check(probe: TemplateProbe, fmt: ReasoningFormat | None) -> Check:
    name = "chat template" + variant_label(probe.variant)
    shown = f"generation prompt {probe.generation_prompt[-60:]!r}"
    if fmt is None:
        return ok(name, f"{shown}; parser none: no reasoning expected")
    if not probe.expects_reasoning:
        return ok(name, f"{shown}; thinking off ({fmt.toggle}=false): no reasoning expected")
    if probe.opening is Opening.TEMPLATE_CLOSES:
        return fail(name, f"{shown} closes reasoning ({fmt.start}...{fmt.end}) before the model starts: it answers "
                          f"without reasoning, and parser {fmt.name} files each answer as reasoning",
                    f"use the model's own chat template, one whose generation prompt ends in {fmt.start} "
                    "(or leaves it to the model)")
    if probe.opening is Opening.TEMPLATE_OPENS and not fmt.forced:
        return fail(name, f"{shown} opens {fmt.start}, but parser {fmt.name} waits for the model to write it: "
                          "every thought would land in the content",
                    "set --reasoning-parser / GENFLEET_REASONING_PARSER to the parser of this model")
    if probe.opening is Opening.TEMPLATE_OPENS:
        return ok(name, f"{shown}: opens {fmt.start}, the output starts inside reasoning (parser {fmt.name})")
    return ok(name, f"{shown}: the model opens its reasoning itself (parser {fmt.name})")


def variant_label(variant: TemplateVariant) -> str:
    if not variant.kwargs:
        return ""
    kwargs = ", ".join(f"{key}={value}" for key, value in variant.kwargs.items())
    return f" ({kwargs}{': ' + ', '.join(variant.datasets) if variant.datasets else ''})"
