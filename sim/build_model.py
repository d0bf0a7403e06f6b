"""Builds the simulated model's tokenizer in sim/model: a small byte-level BPE with a Kimi-like chat
template, loadable with `AutoTokenizer.from_pretrained` like any model directory.

Run `python -m sim.build_model` to rebuild; the result is committed, so nothing is downloaded.
The training text is the docstrings of the Python standard library: English prose, always at hand.
"""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

MODEL_DIR = Path(__file__).parent / "model"
VOCAB_SIZE = 3000

# Kimi-K2.5's markers: the generation prompt opens <think>, so the output starts inside reasoning.
SPECIAL_TOKENS = [
    "[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
    "<|im_middle|>", "<think>", "</think>",
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
    "{%- if thinking is defined and thinking is false -%}<think></think>{%- else -%}<think>{%- endif -%}"
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
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "[BOS]",
        "eos_token": "<|im_end|>",
        "pad_token": "[EOS]",
        "additional_special_tokens": SPECIAL_TOKENS[3:],
        "model_max_length": 32768,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    build()
    print(f"wrote {MODEL_DIR}")
