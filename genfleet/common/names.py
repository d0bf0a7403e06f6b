"""The one rule for run and dataset names, checked by the producer before anything is enqueued and by
the worker before anything is generated or written.

A name is a directory under the output root (`{out}/{run}/{dataset}/`, `common/shards.py`) and part
of Redis keys, so it may hold ASCII letters, digits, `.`, `_` and `-` only, may not start with a dot
(no `.`, `..` or hidden directories) and is at most 128 characters long. Whatever route a task came
by (the producer, a requeue, Flower, a forged message), a name that breaks the rule never becomes a
path.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from genfleet.common import GenfleetError

MAX_NAME_LENGTH = 128
NAME_RULE = "letters, digits, '.', '_' and '-' only, not starting with '.', at most 128 characters"
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


class UnsafeName(GenfleetError, ValueError):
    """A run or dataset name that breaks the rule, or a path that would leave the output root."""


def name_problem(name: object) -> str | None:
    """Why `name` cannot name a run or a dataset, or None when it can."""
    if not isinstance(name, str):
        return f"must be a string, not {type(name).__name__}"
    if not name:
        return "is empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"is {len(name)} characters long (at most {MAX_NAME_LENGTH})"
    if not _NAME.fullmatch(name):
        return f"may hold {NAME_RULE}"
    return None


def check_name(kind: str, name: object) -> str:
    """`name` itself, or `UnsafeName` saying which `kind` of name ("run", "dataset") is wrong and why."""
    problem = name_problem(name)
    if problem is not None:
        raise UnsafeName(f"{kind} name {name!r} {problem}")
    return name  # type: ignore[return-value]


def inside(root: Path, *parts: str) -> Path:
    """`root / part / ...`, or `UnsafeName` if that path, normalised, is not strictly under `root`.
    Normalised lexically: a symlink an operator placed under the root (a run on another volume) is
    followed on purpose; no name that passes the rule can create one."""
    path = root.joinpath(*parts)
    base = os.path.normpath(os.path.abspath(root))
    joined = os.path.normpath(os.path.abspath(path))
    if os.path.commonpath([base, joined]) != base or joined == base:
        raise UnsafeName(f"{path} resolves outside the output root {root}")
    return path


def task_problem(run: object, dataset: object, prompt_id: object) -> str | None:
    """Why a task's names cannot be trusted, or None. Its run and dataset become directories, so they
    must pass the rule; its id is `{dataset}/{key}` (it names no file: shards are named after the
    worker, `common/shards.py`)."""
    for kind, name in (("run", run), ("dataset", dataset)):
        if (problem := name_problem(name)) is not None:
            return f"{kind} name {name!r} {problem}"
    if not isinstance(prompt_id, str) or not prompt_id.startswith(f"{dataset}/") or prompt_id == f"{dataset}/":
        return f"prompt id {prompt_id!r} is not '{dataset}/KEY'"
    return None
