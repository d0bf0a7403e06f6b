"""The bundled sample datasets, named like the seeds' (B1_glaive … B8_sweagent), in the shapes those
datasets really have, plus two rows the producer must reject.

Deterministic: the same seed and scale give the same files, byte for byte, so a demo or a test
that re-runs on them enqueues the same prompt ids. It lives in the package, not beside the
repository's scripts, because `genfleet demo` runs from an installed wheel; its words come from the
simulator's vocabulary, which is package data (`sim/model/`).

    python -m genfleet.sample_data OUT_DIR [--scale 1.0]
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from genfleet.sim.vocab import DEFAULT_TOKENIZER_DIR

SEED = 20261129


def load_words() -> list[str]:
    vocab = json.loads((DEFAULT_TOKENIZER_DIR / "tokenizer.json").read_text())["model"]["vocab"]
    return sorted(token[1:] for token in vocab if token.startswith("Ġ") and token[1:].isalpha()
                  and token[1:].islower() and len(token) > 3)


class TextMaker:
    def __init__(self, rng: random.Random, words: list[str]) -> None:
        self.rng, self.words = rng, words

    def sentence(self, low: int = 6, high: int = 16) -> str:
        picked = self.rng.choices(self.words, k=self.rng.randint(low, high))
        return " ".join(picked).capitalize() + "."

    def paragraph(self, sentences: int) -> str:
        return " ".join(self.sentence() for _ in range(sentences))


def glaive(t: TextMaker, i: int) -> dict:
    tools = json.dumps({"name": f"get_{t.rng.choice(t.words)}", "parameters": {"type": "object"}})
    return {"id": f"glaive-{i:05d}", "messages": [
        {"role": "system", "content": f"You can call functions. {tools}"},
        {"role": "user", "content": t.paragraph(2)},
        {"role": "assistant", "content": t.paragraph(1)},
    ]}


def opencodeinstruct(t: TextMaker, i: int) -> dict:
    return {"id": f"oci-{i:05d}", "prompt": "Write a function. " + t.paragraph(t.rng.randint(2, 5))}


def magicoder(t: TextMaker, i: int) -> dict:
    return {"conversations": [{"role": "user", "content": t.paragraph(t.rng.randint(3, 8))}]}


def mixture_of_thoughts(t: TextMaker, i: int) -> dict:
    return {"messages": [{"role": "user", "content": t.paragraph(t.rng.randint(1, 4))},
                         {"role": "assistant", "content": "<think>" + t.paragraph(3) + "</think>" + t.sentence()}]}


def openthoughts(t: TextMaker, i: int) -> dict:
    return {"system": "Think step by step.", "conversations": [
        {"from": "system", "value": "Think step by step."},
        {"from": "human", "value": t.paragraph(t.rng.randint(2, 6))},
        {"from": "gpt", "value": t.paragraph(4)},
    ]}


def ultrachat(t: TextMaker, i: int) -> dict:
    turns = []
    for _ in range(t.rng.randint(1, 3)):
        turns += [{"role": "user", "content": t.paragraph(2)}, {"role": "assistant", "content": t.paragraph(2)}]
    return {"id": f"ultrachat-{i:05d}", "messages": turns}


def sharegpt(t: TextMaker, i: int) -> dict:
    turns = []
    for _ in range(t.rng.randint(1, 4)):
        turns += [{"from": "human", "value": t.paragraph(2)}, {"from": "gpt", "value": t.paragraph(2)}]
    return {"id": f"sharegpt-{i:05d}", "conversations": turns}


def sweagent(t: TextMaker, i: int) -> dict:
    """A long agent trajectory: many tool observations; pinned to the long queue."""
    turns = [{"role": "system", "content": "You are an autonomous software engineer. " + t.paragraph(3)},
             {"role": "user", "content": "Fix the issue. " + t.paragraph(6)}]
    for _ in range(t.rng.randint(6, 14)):
        turns += [{"role": "assistant", "content": t.paragraph(2)},
                  {"role": "tool", "content": t.paragraph(t.rng.randint(10, 30))},
                  {"role": "user", "content": "Observation noted. " + t.sentence()}]
    return {"instance_id": f"swe-{i:05d}", "messages": turns}


# name, maker, rows at scale 1, pinned partition
DATASETS = [
    ("B1_glaive", glaive, 200, None),
    ("B2_opencodeinstruct", opencodeinstruct, 250, None),
    ("B3_magicoder", magicoder, 150, None),
    ("B4_mixture_of_thoughts", mixture_of_thoughts, 200, None),
    ("B5_openthoughts", openthoughts, 150, None),
    ("B6_ultrachat", ultrachat, 200, None),
    ("B7_sharegpt", sharegpt, 200, None),
    ("B8_sweagent", sweagent, 100, "long"),
]

# Two rows the producer must reject, to show how it reports them (file and line, reason).
BAD_LINES = {"B7_sharegpt": ['{"conversations": [{"from": "human", "value": "unterminated',
                             '{"conversations": [{"from": "gpt", "value": "an answer with no question"}]}']}


def rows_at(rows: int, scale: float) -> int:
    """A dataset's good rows at `scale`: never none, so every dataset shows up in a small demo."""
    return max(1, int(rows * scale))


def good_rows(scale: float) -> int:
    """How many prompts the datasets written at `scale` hold (the rejected rows not counted)."""
    return sum(rows_at(rows, scale) for _, _, rows, _ in DATASETS)


def write_datasets(out: Path, *, scale: float = 1.0, seed: int = SEED) -> list[tuple[str, Path, str | None]]:
    """Writes one `{name}.jsonl` per dataset into `out`; returns (name, path, pinned partition)."""
    words = load_words()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, maker, rows, pinned in DATASETS:
        maker_text = TextMaker(random.Random(f"{seed}:{name}"), words)
        lines = [json.dumps(maker(maker_text, i)) for i in range(rows_at(rows, scale))]
        for offset, bad in enumerate(BAD_LINES.get(name, [])):
            lines.insert(7 + 5 * offset, bad)
        path = out / f"{name}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        written.append((name, path, pinned))
    return written


def dataset_args(written: list[tuple[str, Path, str | None]]) -> list[str]:
    """`NAME=PATH[:long]` arguments for `genfleet enqueue`."""
    return [f"{name}={path}" + (f":{pinned}" if pinned else "") for name, path, pinned in written]


def main(default_out: Path = Path("sample-data")) -> None:
    """Writes the datasets and prints their `genfleet enqueue` arguments."""
    parser = argparse.ArgumentParser(description="Write the bundled sample datasets; print their enqueue arguments.")
    parser.add_argument("out", nargs="?", type=Path, default=default_out, help=f"directory (default: {default_out})")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every dataset's row count")
    args = parser.parse_args()
    written = write_datasets(args.out, scale=args.scale)
    print(" ".join(dataset_args(written)))


if __name__ == "__main__":
    main()
