"""The two records that cross process boundaries: the task payload (msgpack, producer -> worker)
and the completion record (one JSON line in a shard, worker -> disk)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, get_args

Message = dict[str, Any]

# The policy vocabularies, each defined here once: the producer's flags and run file, the settings,
# the workers and the records use these (`choices` lists a vocabulary's values, for a check or a
# help text). The queue names are `common.queues.Partition`.
Regenerate = Literal["last", "all"]  # reply to the last prompt, or regenerate every assistant turn
LoopGuard = Literal["abort", "flag", "off"]
OnTruncated = Literal["keep", "continue", "regenerate"]
Routing = Literal["affinity", "least-busy"]
Api = Literal["generate", "chat"]
# `--in-flight`: a worker's streams per host stay at its share of `--concurrency`, or follow the
# host's own load up to it (workers/admission.py).
InFlight = Literal["fixed", "auto"]
ContextRule = Literal["reserve", "clip"]  # a prompt too long for the context: refused, or cut
# `--first-max-new-tokens`: a prompt's first request asks this many new tokens (or, "auto", a cap
# drawn from the dataset's own finished lengths); a cut there goes on exactly (workers/generation/
# first_cap.py). None: the first request asks the full cap.
FirstCap = int | Literal["auto"]


def choices(vocabulary: Any) -> tuple[str, ...]:
    """The values of one of the vocabularies above, in their order."""
    return get_args(vocabulary)


@dataclass
class TaskPayload:
    run: str
    id: str
    dataset: str
    row: int
    partition: str
    prompt_tokens: int
    max_new_tokens: int
    messages: list[Message]
    # Exactly the tokens the chat template produced: no double BOS, no re-tokenisation drift.
    input_ids: list[int] | None = None
    text: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    enqueued_at: float = 0.0
    attempt: int = 1
    # Store the generated token ids in the record (token-exact training data).
    keep_token_ids: bool = False
    # "last": reply to the prompt in `messages`; "all": regenerate every assistant turn.
    regenerate: Regenerate = "last"
    # Completion tokens the whole dataset may generate (workers skip prompts past it); None: no cap.
    max_tokens_per_dataset: int | None = None
    # The upstream the previous attempt failed on: a retry prefers another one.
    failed_upstream: str | None = None
    # `--samples N` > 1: this task is sample k of its prompt (id "{prompt id}#{k}", its own row slot).
    sample: int | None = None
    # `--loop-guard`: "abort" stops a degenerate repetition at once, "flag" marks it, "off" ignores it.
    loop_guard: LoopGuard = "abort"
    # `--on-truncated`: what a completion cut at max_new_tokens becomes ("keep", "continue",
    # "regenerate"); `max_new_tokens_total` caps the completion over all its parts.
    on_truncated: OnTruncated = "keep"
    max_new_tokens_total: int | None = None
    # The parts already generated of a continued completion (`Continuation.to_dict()`); None for
    # a first request.
    continuation: dict[str, Any] | None = None
    # This task asks again, with the larger budget, for a completion that was cut (`regenerate`).
    regenerated: bool = False
    # `--first-max-new-tokens`: the cap of the prompt's first request (None: `max_new_tokens`).
    first_max_new_tokens: FirstCap | None = None
    # Set by the worker on a first request it asked for less: the cap that request stands in for.
    # A cut at the smaller cap is continued up to it, whatever `on_truncated` says.
    staged_from: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def prompt_id(self) -> str:
        """The id of the prompt itself (a sample's id without its "#k")."""
        return self.id if self.sample is None else self.id.rpartition("#")[0]

    def argsrepr(self, note: str = "") -> str:
        """What Flower shows as the task's args: the id and size, never the prompt itself."""
        return f"{self.id} {self.partition} {self.prompt_tokens} prompt tokens" + (f" ({note})" if note else "")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskPayload:
        return cls(**data)

    @classmethod
    def unknown_fields(cls, data: dict[str, Any]) -> list[str]:
        """The fields of `data` this version of the payload does not have (a newer genfleet's)."""
        return sorted(set(data) - {known.name for known in fields(cls)})


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int


@dataclass
class Timing:
    enqueued_at: float
    started_at: float
    first_token_s: float | None
    duration_s: float
    e2e_latency: float | None = None  # the server's own measure, from the last chunk


@dataclass
class CompletionRecord:
    id: str
    run: str
    dataset: str
    partition: str
    messages: list[Message]
    reasoning: str
    content: str
    finish_reason: str  # "stop" | "length" | "loop" (the loop guard stopped or flagged it)
    matched_stop: int | str | list[int] | None
    usage: Usage
    upstream: str
    model: str
    sampling: dict[str, Any]
    timing: Timing
    attempts: int
    worker: str
    output_ids: list[int] | None = None
    # With `--regenerate all`: every generated turn in order (reasoning, content, finish, usage).
    turns: list[dict[str, Any]] | None = None
    # The prompt's row index in its dataset (the bit in the run's done bitmap): lets export
    # reconcile shards against Redis.
    row: int | None = None
    # The loop guard's finding: {"period", "repeats", "start", "at_token"} (tokens from the start
    # of the completion; `start`: where the repetition begins, `at_token`: where it was seen).
    loop: dict[str, int] | None = None
    # How many follow-up requests continued this completion past a max_new_tokens cut.
    continued: int | None = None
    # The completion was asked again with the larger budget after a cut (`--on-truncated regenerate`).
    regenerated: bool | None = None
    # With `--samples N` > 1: which sample of the prompt this is (0..N-1).
    sample: int | None = None
    # The served model's revision as its upstream reported it: {"revision": `/server_info` revision,
    # "weight_version": `/model_info` weight_version}, each null where the server did not say (SGLang
    # 0.5.23 by default: revision null, weight_version "default"); left out where it said neither.
    model_revision: dict[str, str | None] | None = None

    def to_json_line(self) -> bytes:
        data = asdict(self)
        for optional in _OPTIONAL_FIELDS:
            if data[optional] is None:
                del data[optional]
        return (json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_json(cls, line: str | bytes) -> CompletionRecord:
        return cls.from_dict(json.loads(line))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompletionRecord:
        return cls(**{**data, "usage": Usage(**data["usage"]), "timing": Timing(**data["timing"])})


# Left out of a record's JSON line when None: records without them read as before.
_OPTIONAL_FIELDS = ("output_ids", "turns", "loop", "continued", "regenerated", "sample", "model_revision")


@dataclass
class Turn:
    """One generated assistant turn."""
    reasoning: str
    content: str
    finish_reason: str
    matched_stop: int | str | list[int] | None
    usage: Usage
    upstream: str
    output_ids: list[int] | None = None
    loop: dict[str, int] | None = None
