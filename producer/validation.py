"""Values `genfleet enqueue` refuses before it reads a row: counts that must be positive, sampling
parameters SGLang would reject on every request (`SamplingParams.verify`, sglang 0.5.23), names that
break `common/names.py`'s rule. Each problem is one line naming the flag; the command exits 2 and
enqueues nothing."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from genfleet.common.names import name_problem

# Flag -> the least value it takes (counts of tokens, prompts, rows; 0 for "no limit" where it means that).
MINIMUMS = {
    "--long-threshold": 1, "--max-new-tokens-short": 1, "--max-new-tokens-long": 1, "--max-new-tokens": 1,
    "--context-length": 1, "--max-prompts": 1, "--max-tokens-per-dataset": 1, "--max-queue-depth": 0,
    "--batch-size": 1, "--max-new-tokens-total": 1, "--samples": 1,
}
# The sampling keys with a dedicated flag; any other goes through --sampling KEY=VALUE.
SAMPLING_FLAGS = {"temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k", "min_p": "--min-p",
                  "sampling_seed": "--seed"}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _in(low: float, high: float, *, open_low: bool = False) -> Callable[[Any], bool]:
    return lambda v: _number(v) and (low < v if open_low else low <= v) and v <= high


# key -> (what it must be, the check)
SAMPLING_RULES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "temperature": ("a number >= 0", lambda v: _number(v) and v >= 0),
    "top_p": ("a number in (0, 1]", _in(0, 1, open_low=True)),
    "min_p": ("a number in [0, 1]", _in(0, 1)),
    "top_k": ("an integer, -1 (off) or at least 1", lambda v: _integer(v) and (v == -1 or v >= 1)),
    "frequency_penalty": ("a number in [-2, 2]", _in(-2, 2)),
    "presence_penalty": ("a number in [-2, 2]", _in(-2, 2)),
    "repetition_penalty": ("a number in (0, 2]", _in(0, 2, open_low=True)),
    "min_new_tokens": ("an integer >= 0", lambda v: _integer(v) and v >= 0),
    "sampling_seed": ("an integer", lambda v: _integer(v) and -(2**63) <= v < 2**63),
    "ignore_eos": ("true or false", lambda v: isinstance(v, bool)),
    "no_stop_trim": ("true or false", lambda v: isinstance(v, bool)),
    "stop": ("a string or a list of strings",
             lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v))),
    "stop_token_ids": ("a list of token ids", lambda v: isinstance(v, list) and all(_integer(t) for t in v)),
}


def sampling_problem(key: str, value: Any) -> str | None:
    """Why SGLang would refuse `key=value`, or None (keys genfleet does not know pass through)."""
    rule = SAMPLING_RULES.get(key)
    if rule is None or rule[1](value):
        return None
    return f"{key} must be {rule[0]}, got {value!r}"


def flag_problems(counts: dict[str, int | None], pairs: dict[str, Any], flags: dict[str, Any]) -> list[str]:
    """One line per bad command-line value: `counts` by flag; sampling from `--sampling KEY=VALUE`
    (`pairs`) and from its dedicated flags (`flags`, by sampling key)."""
    problems = [f"{flag} must be at least {MINIMUMS[flag]}, got {value}"
                for flag, value in counts.items() if value is not None and value < MINIMUMS[flag]]
    for given, flag_of in ((pairs, lambda key: f"--sampling {key}"), (flags, SAMPLING_FLAGS.__getitem__)):
        for key, value in given.items():
            if (problem := sampling_problem(key, value)) is not None:
                problems.append(f"{flag_of(key)}: {problem}")
    return problems


def run_name_problem(run: str) -> str | None:
    problem = name_problem(run)
    return None if problem is None else f"--run {run!r}: the run name {problem}"


def dataset_name_problem(name: str) -> str | None:
    problem = name_problem(name)
    return None if problem is None else f"dataset {name!r} (NAME=PATH or [datasets.NAME]): the name {problem}"


# Settings (GENFLEET_* env vars) a flag can override, with the least value each takes.
SETTING_MINIMUMS = {"long_threshold_tokens": 1, "max_new_tokens_short": 1, "max_new_tokens_long": 1,
                    "enqueue_batch_rows": 1, "max_queue_depth": 0}


def settings_problems(settings: Any) -> list[str]:
    """One line per GENFLEET_* value the producer cannot work with."""
    return [f"GENFLEET_{name.upper()} must be at least {least}, got {value}"
            for name, least in SETTING_MINIMUMS.items()
            if (value := getattr(settings, name)) is not None and value < least]
