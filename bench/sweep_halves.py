"""The sweep's halves by name (bench/sweep.py: SGLang's; bench/sweep_vllm.py: vLLM's), for `make
bench` and on their own: the figures of one half as JSON.

    .venv/bin/python -m bench.sweep_halves [--quick] [--repeats 2] [--server sglang|vllm]
"""
from __future__ import annotations

import json
from dataclasses import replace

from bench import sweep
from bench.sweep_vllm import VllmHalf

HALVES: dict[str, type[sweep.Half]] = {"sglang": sweep.SGLangHalf, "vllm": VllmHalf}


def half_named(key: str) -> sweep.Half:
    return HALVES[key]()


def main() -> None:
    import argparse

    from bench.processes import interrupt_on_signals

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--server", choices=sorted(HALVES), default="sglang")
    args = parser.parse_args()
    interrupt_on_signals()
    profile = sweep.QUICK if args.quick else sweep.FULL
    if args.repeats:
        profile = replace(profile, repeats=args.repeats)
    print(json.dumps(sweep.measure(profile, half_named(args.server)), indent=1, default=str))


if __name__ == "__main__":
    main()
