"""The benchmark's prompt set: short chat prompts in OpenAI `messages` rows, the same every time."""
from __future__ import annotations

import json
import random
from pathlib import Path

from bench.processes import TOKENIZER


def _words() -> list[str]:
    vocab = json.loads((TOKENIZER / "tokenizer.json").read_text())["model"]["vocab"]
    return sorted(token[1:] for token in vocab if token.startswith("Ġ") and token[1:].isalpha()
                  and token[1:].islower() and len(token) > 3)


def write_prompts(path: Path, count: int, seed: int = 0, prefix: str = "p") -> Path:
    """`count` rows `{"id", "messages": [{"role": "user", ...}]}` of 8-40 words each."""
    rng = random.Random(seed)
    words = _words()
    with open(path, "w") as handle:
        for i in range(count):
            text = " ".join(rng.choices(words, k=rng.randint(8, 40))).capitalize() + "?"
            handle.write(json.dumps({"id": f"{prefix}{i:06d}", "messages": [{"role": "user", "content": text}]})
                         + "\n")
    return path
