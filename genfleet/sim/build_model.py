"""Builds the simulated model's tokenizer in sim/model: a small byte-level BPE with a Kimi-like chat
template, loadable with `AutoTokenizer.from_pretrained` like any model directory.

Run `python -m genfleet.sim.build_model` to rebuild; the result is committed, so nothing is downloaded.
The training text is the docstrings of the Python standard library: English prose, always at hand.
That text changes with the Python version, so `python -m genfleet.sim.build_model --add-special-tokens`
only appends missing markers to the committed tokenizer, without retraining: no id moves.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

MODEL_DIR = Path(__file__).parent / "model"
VOCAB_SIZE = 3000

# Kimi-K2.5's markers: the generation prompt opens <think>, so the output starts inside reasoning.
SPECIAL_TOKENS = [
    "[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
    "<|im_middle|>", "<think>", "</think>",
]

# The markers of the other reasoning formats (Kimi-VL, gpt-oss Harmony) and of tool calls. They
# come after the trained vocabulary (ids 3000 and up), so adding them moves no earlier id.
EXTRA_SPECIAL_TOKENS = [
    "◁think▷", "◁/think▷",
    "<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>",
    "<tool_call>", "</tool_call>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
]

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' -%}<|im_system|>system<|im_middle|>{{ message.content }}<|im_end|>"
    "{%- elif message.role == 'user' -%}<|im_user|>user<|im_middle|>{{ message.content }}<|im_end|>"
    "{%- elif message.role == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "<think>{{ message.reasoning_content or '' }}</think>{{ message.content }}<|im_end|>"
    "{%- else -%}<|im_system|>{{ message.role }}<|im_middle|>{{ message.content }}<|im_end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>"
    # Either toggle turns thinking off: Kimi's `thinking`, Qwen3's and GLM's `enable_thinking`.
    "{%- if (thinking is defined and thinking is false)"
    " or (enable_thinking is defined and enable_thinking is false) -%}"
    "<think></think>{%- else -%}<think>{%- endif -%}"
    "{%- endif -%}"
)


# Modules whose import does something visible (opens a browser, prints, starts a GUI).
NOISY_MODULES = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "pydoc_data"}


def stdlib_prose() -> list[str]:
    texts = []
    names = sorted(n for n in sys.stdlib_module_names if not n.startswith("_"))
    for name in (n for n in names if n not in NOISY_MODULES):
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - any module that cannot import just gives no text
            continue
        for obj in [module, *vars(module).values()]:
            doc = getattr(obj, "__doc__", None)
            if isinstance(doc, str) and len(doc) > 40:
                texts.append(doc)
    return texts


def build(model_dir: Path = MODEL_DIR) -> None:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(stdlib_prose(), trainer=trainer)
    model_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(model_dir / "tokenizer.json"))
    write_config(model_dir)
    add_extra_special_tokens(model_dir)


def add_extra_special_tokens(model_dir: Path = MODEL_DIR) -> list[str]:
    """Append the EXTRA_SPECIAL_TOKENS a committed tokenizer lacks; returns those added."""
    path = model_dir / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    known = tokenizer.get_vocab(with_added_tokens=True)
    missing = [token for token in EXTRA_SPECIAL_TOKENS if token not in known]
    if missing:
        tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in missing])
        tokenizer.save(str(path))
    write_config(model_dir)
    return missing


def write_config(model_dir: Path = MODEL_DIR) -> None:
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "[BOS]",
        "eos_token": "<|im_end|>",
        "pad_token": "[EOS]",
        "additional_special_tokens": [*SPECIAL_TOKENS[3:], *EXTRA_SPECIAL_TOKENS],
        "model_max_length": 32768,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--add-special-tokens", action="store_true",
        help="only append missing special tokens to the committed tokenizer (no retraining)",
    )
    if parser.parse_args().add_special_tokens:
        added = add_extra_special_tokens()
        print(f"added {len(added)} special tokens to {MODEL_DIR}: {' '.join(added) or '(none missing)'}")
    else:
        build()
        print(f"wrote {MODEL_DIR}")


if __name__ == "__main__":
    main()
