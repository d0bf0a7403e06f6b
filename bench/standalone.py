"""The benchmarks that are scripts of their own (`bench/enqueue_rate.py`, `bench/export_memory.py`),
run as child processes with `--json` and read back."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.processes import REPO

ENQUEUE_SCRIPT = REPO / "bench" / "enqueue_rate.py"
EXPORT_SCRIPT = REPO / "bench" / "export_memory.py"


class NotMeasured(Exception):
    """The figure could not be measured; the message says why."""


def enqueue_rate(prompts: int, timeout: float = 600.0, *, shape: str | None = None, chat: bool = False) -> dict:
    """`genfleet enqueue` of `prompts` prompts into a throwaway Redis, templating and counting
    included: {end_to_end_per_s (process start included), enqueue_per_s (its own summary), ...}.
    Short prompts and the bundled tokenizer by default; `shape` a family's tokenizer
    (tests/model_shapes), `chat` chat-length prompts."""
    return _run_json(ENQUEUE_SCRIPT, ["--prompts", str(prompts), *(["--shape", shape] if shape else []),
                                      *(["--chat"] if chat else [])], timeout)


def export_memory(records: int, timeout: float = 1200.0) -> dict:
    """`genfleet export` over `records` small records: the variant that exports exactly `records`
    with no option, plus every variant the script ran, {variant, records, seconds, records_per_s,
    peak_rss_mb}."""
    if not EXPORT_SCRIPT.is_file():
        raise NotMeasured(f"{EXPORT_SCRIPT.relative_to(REPO)} is not in this checkout")
    variants = _run_json(EXPORT_SCRIPT, ["--records", str(records)], timeout)
    plain = f"{records:,} records"
    main = next((v for v in variants if v.get("variant") == plain), None)
    if main is None:
        raise NotMeasured(f"{EXPORT_SCRIPT.name} reported no '{plain}' variant: {variants}")
    return {"main": main, "variants": variants}


def _run_json(script: Path, args: list[str], timeout: float):
    try:
        result = subprocess.run([sys.executable, str(script), *args, "--json"], cwd=REPO, capture_output=True,
                                text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise NotMeasured(f"{script.name} ran past {timeout:.0f} s") from None
    if result.returncode != 0:
        raise NotMeasured(f"{script.name} failed ({result.returncode}): {(result.stderr or result.stdout)[-500:]}")
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise NotMeasured(f"{script.name} printed no JSON: {result.stdout[-500:]}") from None
