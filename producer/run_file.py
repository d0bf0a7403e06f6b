"""The run file (`genfleet enqueue --run-file run.toml`): the datasets of a run and their options in
TOML. Every key has a command-line flag of the same name; the flag wins. Unknown keys are errors,
so a typo never silently falls back to a default.

    run = "r1"
    tokenizer = "/models/Kimi-K2.5"
    context_length = 131072
    thinking = true
    [sampling]
    temperature = 1.0
    [datasets.glaive]
    path = "data/glaive-*.jsonl.zst"        # relative paths are relative to the run file
    format = "messages"
    max_prompts = 100000
    max_tokens_per_dataset = 50_000_000
    [datasets.swe]
    path = "data/swe.parquet"
    partition = "long"
    chat_template_kwargs = { thinking = false }
    on_truncated = "continue"               # per dataset too: loop_guard, on_truncated,
    samples = 4                             # max_new_tokens_total, samples
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from genfleet.producer.conversations import RowFormat

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

Partition = Literal["short", "long"]
ContextRule = Literal["reserve", "clip"]
Regenerate = Literal["last", "all"]
LoopGuard = Literal["abort", "flag", "off"]
OnTruncated = Literal["keep", "continue", "regenerate"]


class RunFileError(ValueError):
    """The run file is unreadable or invalid; the message names the file and the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetEntry(_Strict):
    path: str
    format: RowFormat | None = None
    prompt_field: str | None = None
    partition: Partition | None = None
    max_prompts: int | None = Field(default=None, ge=1)
    # Replaces the per-partition max_new_tokens for this dataset's prompts.
    max_new_tokens: int | None = Field(default=None, ge=1)
    max_tokens_per_dataset: int | None = Field(default=None, ge=1)
    sampling: dict[str, Any] = {}
    chat_template_kwargs: dict[str, Any] = {}
    thinking: bool | None = None
    loop_guard: LoopGuard | None = None
    on_truncated: OnTruncated | None = None
    max_new_tokens_total: int | None = Field(default=None, ge=1)
    samples: int | None = Field(default=None, ge=1)


class RunFile(_Strict):
    run: str | None = None
    tokenizer: str | None = None
    redis_url: str | None = None
    context_length: int | None = Field(default=None, ge=1)
    context_rule: ContextRule | None = None
    long_threshold: int | None = Field(default=None, ge=1)
    max_new_tokens_short: int | None = Field(default=None, ge=1)
    max_new_tokens_long: int | None = Field(default=None, ge=1)
    max_new_tokens: int | None = Field(default=None, ge=1)
    max_tokens_per_dataset: int | None = Field(default=None, ge=1)
    max_prompts: int | None = Field(default=None, ge=1)
    format: RowFormat | None = None
    prompt_field: str | None = None
    sampling: dict[str, Any] = {}
    chat_template_kwargs: dict[str, Any] = {}
    thinking: bool | None = None
    regenerate: Regenerate | None = None
    keep_token_ids: bool | None = None
    max_queue_depth: int | None = Field(default=None, ge=0)
    batch_size: int | None = Field(default=None, ge=1)
    loop_guard: LoopGuard | None = None
    on_truncated: OnTruncated | None = None
    max_new_tokens_total: int | None = Field(default=None, ge=1)
    samples: int | None = Field(default=None, ge=1)
    datasets: dict[str, DatasetEntry] = {}


def load_run_file(path: Path) -> RunFile:
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as error:
        raise RunFileError(f"{path}: cannot read run file: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise RunFileError(f"{path}: invalid TOML: {error}") from None
    try:
        parsed = RunFile.model_validate(raw)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors())
        raise RunFileError(f"{path}: {problems}") from None
    return _resolve_paths(parsed, path.parent)


def _resolve_paths(parsed: RunFile, base: Path) -> RunFile:
    """Relative paths mean relative to the run file, wherever the command is run from."""
    def absolute(text: str) -> str:
        return text if Path(text).is_absolute() else str(base / text)

    datasets = {name: entry.model_copy(update={"path": absolute(entry.path)})
                for name, entry in parsed.datasets.items()}
    update: dict[str, Any] = {"datasets": datasets}
    if parsed.tokenizer is not None:
        update["tokenizer"] = absolute(parsed.tokenizer)
    return parsed.model_copy(update=update)
