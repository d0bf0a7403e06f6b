"""What the simulator will generate, computed without a server: its planner with the tests'
defaults, what a request continuing a cut completion gets, the tokens each chunk of a stream
carries, the chat prompt the tests ask with, and prompts of every opening."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from genfleet.sim.completion import CompletionPlan, LengthModel, continuation_tail, plan_completion
from genfleet.sim.requests import DEFAULT_MAX_NEW_TOKENS
from genfleet.sim.settings import SimSettings
from genfleet.sim.vocab import SimVocab

LENGTHS = LengthModel(scale=0.05)
QUESTION = [{"role": "user", "content": "What is two plus two?"}]
# What QUESTION renders to with the model's chat template: the prompt opens <think>.
CHAT_PROMPT = (
    "<|im_user|>user<|im_middle|>What is two plus two?<|im_end|>"
    "<|im_assistant|>assistant<|im_middle|><think>"
)
# SGLang's --reasoning-parser names, as the simulator lists them.
FORMATS = ["kimi_k2", "deepseek-r1", "qwen3", "qwen3-thinking", "glm45", "kimi", "gpt-oss", "none"]
THINK_FORMATS = ["kimi_k2", "deepseek-r1", "qwen3", "qwen3-thinking", "glm45"]


def plan(
    prompt: list[int] | str,
    vocab: SimVocab,
    *,
    seed: int = 0,
    max_new_tokens: int = 128,  # the server's default
    lengths: LengthModel = LENGTHS,
    reasoning_format: str = "kimi_k2",
) -> CompletionPlan:
    return plan_completion(
        prompt, seed=seed, max_new_tokens=max_new_tokens, lengths=lengths, vocab=vocab,
        reasoning_format=reasoning_format,
    )


def plan_continuation(
    settings: SimSettings,
    prompt: Sequence[int] | str,
    *,
    vocab: SimVocab,
    generated: int,
    seed: int | None = None,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
) -> CompletionPlan:
    """What a server with `settings` gives a request continuing `prompt`'s completion after its first
    `generated` output ids (sim.completion): `prompt` and `seed` are the ORIGINAL request's,
    `max_new_tokens` the continuation's. `settings.plan(prompt, max_new_tokens=generated)` and this,
    joined, are `settings.plan(prompt, max_new_tokens=generated + max_new_tokens)`. The server plans
    the same tail from the cut it remembers (`SimSettings.plan_cut_continuation`)."""
    whole = settings.plan(prompt, vocab=vocab, seed=seed, max_new_tokens=generated + max_new_tokens)
    return continuation_tail(whole, generated, max_new_tokens)


def chunk_sizes(counts: list[int]) -> list[int]:
    """The tokens each chunk carries, from the counts the chunks report."""
    return [b - a for a, b in zip([0, *counts[:-1]], counts, strict=True)]


def template_ids(tokenizer: Any, messages: list[dict[str, Any]], **chat_template_kwargs: Any) -> list[int]:
    """The ids the chat template renders `messages` to (the prompt the simulator plans for)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **chat_template_kwargs)
    return tokenizer.encode(text, add_special_tokens=False)


def prompts(vocab: SimVocab, count: int) -> list[list[int]]:
    """Prompts of every opening: inside reasoning, thinking off, model opens."""
    tails = ([vocab.think_start_id], [vocab.think_start_id, vocab.think_end_id], [])
    return [[100 + i, 200 + i, *tails[i % 3]] for i in range(count)]
