"""The text every stand-in tokenizer is trained on, and the conversations the tier templates: ASCII
prose and code, Han and kana runs, accented Latin, emoji (four-byte characters, split across tokens
by a byte-level BPE), digits and whitespace runs; enough that the trained merges cover words the
conversations use and leave others to bytes, as a real vocabulary does for rare text."""
from __future__ import annotations

import random

WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there been one all we their has would when if so no will what up out about who "
    "model token server prompt reasoning content answer question think step first then because number "
    "function return value list string print import class self data train draft speculative decoding "
    "naïve café résumé Zürich façade coöperate"
).split()
HAN = ("日本語", "中文", "模型", "推理", "答案", "问题", "数据", "東京", "学习", "语言")
KANA = ("ひらがな", "カタカナ", "ありがとう", "こんにちは")
EMOJI = ("😀", "🚀", "🧠", "👍🏽", "🇯🇵")
CODE = ("def f(x):\n    return x * 2\n", "for i in range(10):\n    print(i)\n", "if (a && b) { return 0; }\n",
        "    indented  two  spaces\n", "\t\ttabs\tand\ttext\n")


def corpus(lines: int = 4000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        pieces = []
        for _ in range(rng.randint(4, 24)):
            roll = rng.random()
            if roll < 0.8:
                word = rng.choice(WORDS)
                pieces.append(word.capitalize() if rng.random() < 0.1 else word)
            elif roll < 0.88:
                pieces.append(rng.choice(HAN))
            elif roll < 0.92:
                pieces.append(rng.choice(KANA))
            elif roll < 0.95:
                pieces.append(rng.choice(EMOJI))
            else:
                pieces.append(str(rng.randint(0, 99999)))
        line = " ".join(pieces) + rng.choice((".", "?", "!", ",", ""))
        out.append(line + ("\n" + rng.choice(CODE) if rng.random() < 0.05 else ""))
    return out


# Conversations each shape is templated with: system or not, multi-turn, non-ASCII, whitespace.
CONVERSATIONS = [
    [{"role": "user", "content": "What is the answer to question 42?"}],
    [{"role": "system", "content": "You are a careful model."},
     {"role": "user", "content": "Explain speculative decoding in one step."}],
    [{"role": "user", "content": "日本語で答えて: 東京は?"},
     {"role": "assistant", "content": "東京は日本の首都です。"},
     {"role": "user", "content": "ありがとう 😀 and naïve café?"}],
    [{"role": "user", "content": "def f(x):\n    return x * 2\n\nWhat does  f(21)  return?"}],
    [{"role": "system", "content": "Answer tersely."},
     {"role": "user", "content": "first"}, {"role": "assistant", "content": "1"},
     {"role": "user", "content": "then the number after it"}],
]
