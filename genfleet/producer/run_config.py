"""The run's configuration: the run file and the command-line flags resolved into one validated run,
with every value refused before a row is read.

Values `genfleet enqueue` refuses before it reads a row: counts that must be positive, sampling
parameters SGLang would reject on every request (`SamplingParams.verify`, sglang 0.5.23), names that
break `common/names.py`'s rule. Each problem is one line naming the flag; the command exits 2 and
enqueues nothing.

The run file (`genfleet enqueue --run-file run.toml`): the datasets of a run and their options in
TOML. Every key has a command-line flag of the same name; the flag wins. Unknown keys are errors,
so a typo never silently falls back to a default.

    run = "r1"
    tokenizer = "/models/Kimi-K2.5"
    trust_remote_code = true                # Kimi's tokenizer is custom code (tokenization_kimi.py)
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

The effective config of one `genfleet enqueue`: command-line flags over the run file over
`GENFLEET_*` settings over defaults, resolved once into typed, immutable objects.

Precedence, first given wins: a flag; the dataset's table in the run file; the run file's top level;
the environment (`Settings`); the default. Within one level the more specific key wins
(`max_new_tokens_long` over `max_new_tokens`).
"""
from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from genfleet.common.names import name_problem
from genfleet.common.queues import DEFAULT_QUEUE_DEPTH, PARTITIONS, Partition
from genfleet.common.records import ContextRule, FirstCap, LoopGuard, OnTruncated, Regenerate, choices
from genfleet.common.settings import Settings
from genfleet.producer import ProducerError
from genfleet.producer.prompts import ROW_FORMATS, RowFormat

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


def parse_first_cap(text: str | None) -> FirstCap | None:
    """`--first-max-new-tokens`: a positive count or `auto`; a ConfigError names the flag."""
    if text is None or text == "auto":
        return text  # type: ignore[return-value]
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"--first-max-new-tokens must be a positive number of tokens or 'auto', not {text!r}")
    return value


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


if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib



class RunFileError(ProducerError, ValueError):
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
    first_max_new_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] | None = None
    samples: int | None = Field(default=None, ge=1)


class RunFile(_Strict):
    run: str | None = None
    tokenizer: str | None = None
    trust_remote_code: bool | None = None
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
    first_max_new_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] | None = None
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


T = TypeVar("T")

# Vocabularies a flag's string is checked against, typed (`choices` gives plain strings): `in` one
# narrows the string to the vocabulary's Literal.
_REGENERATE: tuple[Regenerate, ...] = get_args(Regenerate)
_LOOP_GUARDS: tuple[LoopGuard, ...] = get_args(LoopGuard)
_ON_TRUNCATED: tuple[OnTruncated, ...] = get_args(OnTruncated)


class ConfigError(ProducerError, ValueError):
    """The options contradict each other or lack something; the message says what to pass."""


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset given on the command line: `NAME=PATH`, or `NAME=PATH:long` / `:short` to pin it."""
    name: str
    path: Path
    pinned: str | None = None

    @classmethod
    def parse(cls, text: str) -> DatasetSpec:
        name, sep, rest = text.partition("=")
        if not sep or not name or not rest:
            raise ValueError(f"dataset {text!r}: expected NAME=PATH or NAME=PATH:long")
        pinned = None
        path, colon, suffix = rest.rpartition(":")
        if colon and suffix in PARTITIONS:
            rest, pinned = path, suffix
        return cls(name, Path(rest), pinned)


@dataclass(frozen=True)
class CliOptions:
    """What the command line said; None where it said nothing."""
    datasets: tuple[DatasetSpec, ...] = ()
    run: str | None = None
    tokenizer: str | None = None
    trust_remote_code: bool | None = None
    redis_url: str | None = None
    long_threshold: int | None = None
    max_new_tokens_short: int | None = None
    max_new_tokens_long: int | None = None
    max_new_tokens: int | None = None
    context_length: int | None = None
    context_rule: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    thinking: bool | None = None
    regenerate: str | None = None
    keep_token_ids: bool | None = None
    row_format: str | None = None
    prompt_field: str | None = None
    max_prompts: int | None = None
    max_tokens_per_dataset: int | None = None
    max_queue_depth: int | None = None
    batch_size: int | None = None
    loop_guard: str | None = None
    on_truncated: str | None = None
    max_new_tokens_total: int | None = None
    first_max_new_tokens: FirstCap | None = None
    samples: int | None = None


@dataclass(frozen=True)
class DatasetConfig:
    name: str
    source: str  # file, saved-dataset directory or glob
    pinned: str | None
    row_format: str
    prompt_field: str
    max_prompts: int | None
    max_new_tokens: dict[str, int]  # per partition
    max_tokens_per_dataset: int | None
    sampling: dict[str, Any]
    chat_template_kwargs: dict[str, Any]
    # "abort" | "flag" | "off": what a degenerate repetition does (workers/generation/loop_guard.py).
    loop_guard: LoopGuard = "abort"
    # "keep" | "continue" | "regenerate": what a completion cut at max_new_tokens becomes.
    on_truncated: OnTruncated = "keep"
    # The most completion tokens over all parts of a continued (or regenerated) completion.
    max_new_tokens_total: int = 0
    # Completions per prompt; each its own task and row slot (`row * samples + k`).
    samples: int = 1
    # The first request's cap (`--first-max-new-tokens`), a number or "auto"; None: the full cap.
    # Not in the identity: any first cap gives the same completions (workers/generation/first_cap.py).
    first_max_new_tokens: FirstCap | None = None

    def identity(self) -> dict[str, Any]:
        """What decides this dataset's prompts and completions: a re-run must not change it.
        Not in it: the source path (files move), the pin, `max_prompts` (a re-run may raise it).
        The loop and truncation keys enter only when set away from their defaults, so a run
        enqueued before they existed resumes under the same identity."""
        identity = {
            "row_format": self.row_format, "prompt_field": self.prompt_field,
            "max_new_tokens": dict(self.max_new_tokens), "max_tokens_per_dataset": self.max_tokens_per_dataset,
            "sampling": dict(self.sampling), "chat_template_kwargs": dict(self.chat_template_kwargs),
        }
        # `samples` changes which bit is which prompt: a re-run with another count must refuse.
        if self.samples != 1:
            identity["samples"] = self.samples
        if self.on_truncated != "keep":
            identity["on_truncated"] = self.on_truncated
            identity["max_new_tokens_total"] = self.max_new_tokens_total
        if self.loop_guard != "abort":
            identity["loop_guard"] = self.loop_guard
        return identity


@dataclass(frozen=True)
class RunConfig:
    run: str
    tokenizer: str
    redis_url: str
    datasets: tuple[DatasetConfig, ...]
    # The tokenizer's own code may run (--trust-remote-code); recorded in the run's manifest.
    trust_remote_code: bool
    long_threshold: int
    context_length: int | None  # None: the tokenizer's model_max_length
    # "reserve": reject a prompt when prompt + max_new_tokens exceeds the context;
    # "clip": reject only a prompt that fills the context, and lower max_new_tokens to what is left.
    context_rule: str
    regenerate: Regenerate
    keep_token_ids: bool
    reasoning_parser: str
    max_queue_depth: dict[str, int]  # per queue; 0: unlimited
    batch_rows: int
    # This host's shards (GENFLEET_OUTPUT_DIR): a run new to Redis with records there is recovered
    # from them before anything is published (producer/command.py).
    output_dir: Path | None = None

    def identity(self) -> dict[str, Any]:
        """Run-wide settings that decide completions (the tokenizer's fingerprint is added to it)."""
        return {"regenerate": self.regenerate, "keep_token_ids": self.keep_token_ids,
                "reasoning_parser": self.reasoning_parser}


def resolve(cli: CliOptions, run_file: RunFile | None, settings: Settings) -> RunConfig:
    top = run_file or RunFile()
    run = _first(cli.run, top.run)
    tokenizer = _first(cli.tokenizer, top.tokenizer)
    if not run:
        raise ConfigError("no run id: pass --run R (or `run = \"R\"` in the run file)")
    if problem := run_name_problem(run):
        raise ConfigError(problem)
    if not tokenizer:
        raise ConfigError("no tokenizer: pass --tokenizer DIR (or `tokenizer = \"DIR\"` in the run file)")
    context_rule = _first(cli.context_rule, top.context_rule, default="reserve")
    if context_rule not in choices(ContextRule):
        raise ConfigError(f"--context-rule must be one of {', '.join(choices(ContextRule))}, not {context_rule!r}")
    regenerate = _first(cli.regenerate, top.regenerate, default="last")
    if regenerate not in _REGENERATE:
        raise ConfigError(f"--regenerate must be one of {', '.join(choices(Regenerate))}, not {regenerate!r}")
    for flag, value, allowed in (("--loop-guard", cli.loop_guard, choices(LoopGuard)),
                                 ("--on-truncated", cli.on_truncated, choices(OnTruncated))):
        if value is not None and value not in allowed:
            raise ConfigError(f"{flag} must be one of {', '.join(allowed)}, not {value!r}")
    if cli.row_format is not None and cli.row_format not in ROW_FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(ROW_FORMATS)}, not {cli.row_format!r}")
    if problems := settings_problems(settings):
        raise ConfigError(problems[0])
    depth = _first(cli.max_queue_depth, top.max_queue_depth, settings.max_queue_depth)
    datasets = _datasets(cli, top, settings)
    if regenerate == "all" and (cut := [d.name for d in datasets if d.on_truncated != "keep"]):
        raise ConfigError(f"--on-truncated continue/regenerate works on one reply (--regenerate last); "
                          f"dataset {cut[0]!r} has --regenerate all")
    if regenerate == "all" and (staged := [d.name for d in datasets if d.first_max_new_tokens is not None]):
        raise ConfigError(f"--first-max-new-tokens works on one reply (--regenerate last); "
                          f"dataset {staged[0]!r} has --regenerate all")
    return RunConfig(
        run=run, tokenizer=tokenizer,
        trust_remote_code=_first(cli.trust_remote_code, top.trust_remote_code, default=settings.trust_remote_code),
        redis_url=_first(cli.redis_url, top.redis_url, default=settings.redis_url),
        datasets=datasets,
        long_threshold=_first(cli.long_threshold, top.long_threshold, default=settings.long_threshold_tokens),
        context_length=_first(cli.context_length, top.context_length),
        context_rule=context_rule, regenerate=regenerate,
        keep_token_ids=_first(cli.keep_token_ids, top.keep_token_ids, default=False),
        reasoning_parser=settings.reasoning_parser,
        max_queue_depth=dict(DEFAULT_QUEUE_DEPTH) if depth is None else {p: depth for p in PARTITIONS},
        batch_rows=_first(cli.batch_size, top.batch_size, default=settings.enqueue_batch_rows),
        output_dir=Path(settings.output_dir),
    )


def _datasets(cli: CliOptions, top: RunFile, settings: Settings) -> tuple[DatasetConfig, ...]:
    on_command_line = {spec.name: spec for spec in cli.datasets}
    names = list(top.datasets) + [name for name in on_command_line if name not in top.datasets]
    if not names:
        raise ConfigError("no datasets: pass NAME=PATH arguments or [datasets.NAME] tables in a run file")
    configs = []
    for name in names:
        if problem := dataset_name_problem(name):
            raise ConfigError(problem)
        spec, entry = on_command_line.get(name), top.datasets.get(name)
        configs.append(_dataset(name, spec, entry or DatasetEntry(path=str(on_command_line[name].path)), cli, top,
                                settings))
        for key, value in configs[-1].sampling.items():
            if problem := sampling_problem(key, value):
                raise ConfigError(f"dataset {name!r}, sampling (--sampling or the run file): {problem}")
        if problem := _generation_problem(configs[-1]):
            raise ConfigError(f"dataset {name!r}: {problem}")
    return tuple(configs)


def _generation_problem(dataset: DatasetConfig) -> str | None:
    """Loop, truncation and sample options that contradict the rest of the dataset's config."""
    if dataset.samples > 1 and dataset.sampling.get("temperature") == 0:
        return (f"--samples {dataset.samples} with temperature 0 would generate the same completion "
                f"{dataset.samples} times: raise --temperature or drop --samples")
    if dataset.on_truncated != "keep" and dataset.max_new_tokens_total < max(dataset.max_new_tokens.values()):
        return (f"--max-new-tokens-total {dataset.max_new_tokens_total} is below the dataset's "
                f"max_new_tokens {max(dataset.max_new_tokens.values())}")
    return None


def _dataset(name: str, spec: DatasetSpec | None, entry: DatasetEntry, cli: CliOptions, top: RunFile,
             settings: Settings) -> DatasetConfig:
    defaults = {"short": settings.max_new_tokens_short, "long": settings.max_new_tokens_long}
    per_partition = {"short": (cli.max_new_tokens_short, top.max_new_tokens_short),
                     "long": (cli.max_new_tokens_long, top.max_new_tokens_long)}
    max_new_tokens: dict[str, int] = {
        partition: _first(per_partition[partition][0], cli.max_new_tokens, entry.max_new_tokens,
                          per_partition[partition][1], top.max_new_tokens, default=defaults[partition])
        for partition in PARTITIONS
    }
    loop_guard = _first(cli.loop_guard, entry.loop_guard, top.loop_guard, default="abort")
    on_truncated = _first(cli.on_truncated, entry.on_truncated, top.on_truncated, default="keep")
    # resolve refused any other flag value; the run file's are typed.
    assert loop_guard in _LOOP_GUARDS and on_truncated in _ON_TRUNCATED
    total = _first(cli.max_new_tokens_total, entry.max_new_tokens_total, top.max_new_tokens_total,
                   default=max(max_new_tokens.values()))
    return DatasetConfig(
        name=name,
        source=str(spec.path) if spec is not None else entry.path,
        pinned=_first(spec.pinned if spec is not None else None, entry.partition),
        row_format=_first(cli.row_format, entry.format, top.format, default="auto"),
        prompt_field=_first(cli.prompt_field, entry.prompt_field, top.prompt_field, default="prompt"),
        max_prompts=_first(cli.max_prompts, entry.max_prompts, top.max_prompts),
        max_new_tokens=max_new_tokens,
        max_tokens_per_dataset=_first(cli.max_tokens_per_dataset, entry.max_tokens_per_dataset,
                                      top.max_tokens_per_dataset),
        sampling={**top.sampling, **entry.sampling, **cli.sampling},
        chat_template_kwargs={**top.chat_template_kwargs, **_thinking(top.thinking),
                              **entry.chat_template_kwargs, **_thinking(entry.thinking),
                              **cli.chat_template_kwargs, **_thinking(cli.thinking)},
        loop_guard=loop_guard, on_truncated=on_truncated, max_new_tokens_total=total,
        samples=_first(cli.samples, entry.samples, top.samples, default=1),
        first_max_new_tokens=_first(cli.first_max_new_tokens, entry.first_max_new_tokens, top.first_max_new_tokens),
    )


def _thinking(value: bool | None) -> dict[str, bool]:
    # Templates disagree on the name: Kimi/DeepSeek read `thinking`, Qwen3 `enable_thinking`.
    return {} if value is None else {"thinking": value, "enable_thinking": value}


@overload
def _first(*values: T | None) -> T | None: ...
@overload
def _first(*values: T | None, default: T) -> T: ...
def _first(*values: Any, default: Any = None) -> Any:
    for value in values:
        if value is not None:
            return value
    return default
