"""Differential test: genfleet's reasoning splitter against SGLang 0.5.23's own parsers.

    .oracle-venv/bin/python oracle/compare.py [--cases N] [--seed S] [--out oracle/results.md]

For each of genfleet's eight parser names, N generated outputs (see cases.py), each with a
request's chat_template_kwargs and a chunking, are split four ways:

* genfleet: `split_reasoning(text)` and `ReasoningStream` fed the same chunks (they must agree:
  checked, a failure is a genfleet bug);
* SGLang non-stream: what `/v1/chat/completions` returns as `reasoning_content` / `content`;
* SGLang stream: the concatenated `reasoning_content` / `content` deltas of the streamed response
  (see sglang_side.py for how the server drives the parser).

Each SGLang result is `agree` (equal strings), `agree-ws` (equal after .strip() of each field,
SGLang's traditional normalisation) or `differ`. Every result that is not `agree` must be
explained by a known difference class (CLASSES, documented in docs/reasoning-formats.md): a class
names a mechanism and a repair, the smallest edit of the text or of its chunking that removes that
mechanism; a result is explained when its classes' repairs, applied in turn, make both sides
agree exactly. Anything left over is UNEXPLAINED and fails the run (exit 1).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# oracle/ is not a package: its modules import each other by name, and common/ from the repository.
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import report  # noqa: E402
import sglang_side as sg  # noqa: E402
from outcomes import Outcome, run_cases  # noqa: E402

from genfleet.common.reasoning import PARSER_NAMES  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=4000, help="generated texts per parser")
    ap.add_argument("--seed", type=int, default=20250523)
    ap.add_argument("--out", type=Path, default=HERE / "results.md")
    args = ap.parse_args(argv)

    import sglang

    missing = [p for p in PARSER_NAMES if p != "none" and p not in sg.REASONING_PARSER_NAMES]
    if missing:
        print(f"SGLang {sglang.__version__} has no parser named {missing}", file=sys.stderr)
        return 1
    began = time.monotonic()
    outcomes = run_cases(args.cases, args.seed)
    took = time.monotonic() - began
    unexplained = [o for o in outcomes if "UNEXPLAINED" in o.classes]
    text = report.render(outcomes, sglang_version=sglang.__version__, cases=args.cases, seed=args.seed)
    args.out.write_text(text)
    print(text)
    print(f"{len(outcomes)} comparisons in {took:.0f} s; written to {args.out}")
    if unexplained:
        _print_unexplained(unexplained)
        return 1
    return 0


def _print_unexplained(unexplained: list[Outcome]) -> None:
    print(f"{len(unexplained)} results not explained by a known class, e.g.:", file=sys.stderr)
    for o in unexplained[:10]:
        print(f"  {o.parser} {o.mode} kwargs={o.case.kwargs} text={o.case.text!r} chunks={o.case.chunks!r}\n"
              f"    genfleet={o.ours!r}\n    sglang  ={o.sglang!r}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
