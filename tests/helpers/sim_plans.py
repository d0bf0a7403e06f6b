"""What the simulator will generate, computed without a server: its planner with the tests'
defaults, the chat prompt the tests ask with, and prompts of every opening."""
from __future__ import annotations

from typing import Any

from genfleet.sim.completion import CompletionPlan, LengthModel, plan_completion
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


def template_ids(tokenizer: Any, messages: list[dict[str, Any]], **chat_template_kwargs: Any) -> list[int]:
    """The ids the chat template renders `messages` to (the prompt the simulator plans for)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **chat_template_kwargs)
    return tokenizer.encode(text, add_special_tokens=False)


def prompts(vocab: SimVocab, count: int) -> list[list[int]]:
    """Prompts of every opening: inside reasoning, thinking off, model opens."""
    tails = ([vocab.think_start_id], [vocab.think_start_id, vocab.think_end_id], [])
    return [[100 + i, 200 + i, *tails[i % 3]] for i in range(count)]
