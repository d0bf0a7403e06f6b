"""Every check `genfleet doctor` runs: Redis, the output disk, the upstream, the tokenizer and
template, and a test generation.

The result every doctor check returns: what was checked, how it went, what was seen and, when it
did not pass, the one thing to change. A check never raises for what it finds; a finding is a row.

The output directory the workers will write shards to: it can be created, a file in it written,
fsynced (file and directory, as `workers/output.py` does) and deleted, and its file system has
more free space than the workers' floor (`workers/output.py`, `GENFLEET_MIN_FREE_DISK_MB`), below
which they take no prompt at all.

The Redis the run will use: reachable, durable (`common/redis_checks.py`: noeviction and AOF),
room for the queues the producer will fill, and a clock this host agrees with.

Memory is planned from the measured cost of a queued prompt, 1,385 B + 13.9 B per prompt token of
`used_memory` (docs/scaling.md), times each queue's depth: the producer keeps a queue at most
`--max-queue-depth` deep and streams the rest, so that is what Redis must hold besides what it holds.

Each upstream as it describes itself, read by the workers' own seam (`workers/servers/`): healthy,
the model it serves, its reasoning parser, stream mode, `stream_interval`, context length and load.

The tokenizer and its chat template, against the reasoning parser the workers split with.

The classic silent failure: a template that closes reasoning in the prompt (`<think></think>`: thinking
off) under a parser that expects the output to start inside reasoning (`kimi_k2`, `deepseek-r1`,
...): the model answers straight away and every answer is filed as reasoning. Or the reverse, a
template that opens reasoning under a parser that waits for the model to open it (`kimi`): every
thought lands in the content. Which of the two a template does is read from the generation prompt
it appends to a one-line conversation; the test generation (`generation_check`) then shows what the
model does with it.

A test generation through each upstream, sent and split as a worker would: the probe prompt's
ids from the chat template (`probe_template`), a few `max_new_tokens`, streamed by the workers'
server seam and split by their `CompletionSplitter` with the configured parser and the tokenizer.

It shows what no setting can: that the tokenizer is the server's model's (its ids decode to the
server's text, else `IntegrityError`, as a worker would fail every prompt), and that reasoning comes
out as reasoning. Where the parser expects reasoning, something must open it, the prompt or the
model; when neither does, the split files the whole answer as reasoning (a forced parser) or finds
none, and the run's records would be wrong from the first one.
"""
from __future__ import annotations

import contextlib
import enum
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import redis

from genfleet.common import redis_clock
from genfleet.common.fleet_stats import ServerLoad
from genfleet.common.queues import PARTITIONS
from genfleet.common.reasoning import ReasoningFormat
from genfleet.common.redis_checks import durability_problems
from genfleet.common.run_state import connect
from genfleet.common.server_limits import server_limit
from genfleet.common.settings import Settings, printable_url
from genfleet.common.tokenizer import TRUST_FLAG, CustomCodeRefused, load_tokenizer, render_prompts, tokenizer_kind
from genfleet.doctor.plan import Preflight, TemplateVariant
from genfleet.producer.prompts import RowRejected, prompt_messages, read_row
from genfleet.producer.readers import SourceRow, open_dataset
from genfleet.workers.errors import GenerationError, IntegrityError
from genfleet.workers.generation.completion_text import CompletionSplitter
from genfleet.workers.output import DiskGuard
from genfleet.workers.servers.api import GenerationRequest, ServerApi, ServerDescription


class Status(str, Enum):
    OK = "ok"
    # The run can go ahead, but something deserves a look (an unbounded Redis, a clock a second off).
    WARN = "warn"
    # The run would lose prompts, waste GPU time or write wrong records: fix it first.
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    # One line saying what to change; empty when there is nothing to change.
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status.value}


def ok(name: str, detail: str) -> Check:
    return Check(name, Status.OK, detail)


def warn(name: str, detail: str, fix: str) -> Check:
    return Check(name, Status.WARN, detail, fix)


def fail(name: str, detail: str, fix: str) -> Check:
    return Check(name, Status.FAIL, detail, fix)


def passed(checks: Iterable[Check]) -> bool:
    """Warnings pass; one failure does not."""
    return all(check.status is not Status.FAIL for check in checks)


NAME = "output dir"
WRITABLE_FIX = "point --output-dir / GENFLEET_OUTPUT_DIR at a directory this user can write"


def output_dir_check(root: Path, *, min_free_disk_mb: int) -> Check:
    try:
        write_probe(root)
    except OSError as error:
        return fail(NAME, f"{root}: cannot write a file there: {error.strerror or error}", WRITABLE_FIX)
    floor = min_free_disk_mb * 2**20
    if problem := DiskGuard(root, min_free_bytes=floor).problem():
        return fail(NAME, problem, "free space there, or point --output-dir / GENFLEET_OUTPUT_DIR at a larger disk")
    stats = os.statvfs(root)
    free = stats.f_bavail * stats.f_frsize
    return ok(NAME, f"{root}: writable, fsync ok, {free / 2**30:,.1f} GiB free (floor {min_free_disk_mb:,} MiB)")


def write_probe(root: Path) -> None:
    """Creates `root` (as a worker would), then writes, fsyncs and deletes a file in it."""
    root.mkdir(parents=True, exist_ok=True)
    probe = root / f".genfleet-doctor-{os.getpid()}"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, b"genfleet doctor\n")
        os.fsync(fd)
    finally:
        os.close(fd)
        probe.unlink()
    directory = os.open(root, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


QUEUED_PROMPT_BYTES = 1385
QUEUED_BYTES_PER_TOKEN = 13.9
# Leases run on Redis's clock (common/redis_clock.py), but rate buckets and beacons are per
# wall-clock second and minute, and records carry this host's timestamps: hosts must agree to well
# within a beacon's interval. Redis's clock is the one every host can compare with.
WARN_SKEW_S = redis_clock.WARN_OFFSET_S
FAIL_SKEW_S = 5.0
CLOCK_FIX = "sync this host's clock (NTP: `timedatectl set-ntp true`, or chrony) and Redis's host"


def redis_checks(preflight: Preflight, *, timeout_s: float) -> list[Check]:
    """Connection first: when Redis does not answer, that is the one row."""
    url = printable_url(preflight.settings.redis_url)
    try:
        client = connect(preflight.settings.redis_url, timeout_s=timeout_s)
    except ValueError as error:  # redis-py's word for a URL it cannot parse
        return [fail("Redis", f"{url}: {error}", "fix --redis-url / GENFLEET_REDIS_URL: redis://[:PASSWORD@]HOST:PORT/DB")]
    try:
        version = client.info("server").get("redis_version", "?")
    except redis.RedisError as error:
        return [fail("Redis", f"{url}: {error or type(error).__name__}",
                     "start Redis, or point --redis-url / GENFLEET_REDIS_URL at it")]
    try:
        return [version_check(url, version), *durability_checks(client), memory_check(client, preflight),
                clock_check(client)]
    finally:
        client.close()


# Workers consume with BLMOVE (workers/broker.py) and the reaper reads leases with ZMSCORE
# (workers/delivery.py): both Redis 6.2.
MIN_REDIS = (6, 2)


def version_check(url: str, version: str) -> Check:
    try:
        have = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return warn("Redis", f"{url}: redis {version} (version not understood)", "use Redis 6.2 or later")
    if have < MIN_REDIS:
        return fail("Redis", f"{url}: redis {version}, older than 6.2",
                    "upgrade to Redis 6.2 or later: workers consume with BLMOVE, the reaper reads leases with ZMSCORE")
    return ok("Redis", f"{url}: redis {version}")


def durability_checks(client: redis.Redis) -> list[Check]:
    problems = durability_problems(client)
    if not problems:
        return [ok("Redis durability", "maxmemory-policy noeviction, AOF on")]
    checks = []
    for problem in problems:
        if "maxmemory-policy is" in problem:
            fix = "CONFIG SET maxmemory-policy noeviction (and `maxmemory-policy noeviction` in redis.conf)"
        elif "without AOF" in problem:
            fix = "CONFIG SET appendonly yes (and `appendonly yes`, `appendfsync everysec` in redis.conf)"
        else:  # CONFIG and INFO both refused: a managed Redis; its console says
            checks.append(warn("Redis durability", problem, "check the service's settings: noeviction, AOF on"))
            continue
        checks.append(fail("Redis durability", problem, fix))
    return checks


def planned_queue_bytes(preflight: Preflight) -> int:
    """Redis memory the full queues take (0 for an unlimited queue: it has no bound to plan for)."""
    return round(sum(preflight.queue_depth[p] * (QUEUED_PROMPT_BYTES + QUEUED_BYTES_PER_TOKEN *
                                                  preflight.planned_prompt_tokens[p]) for p in PARTITIONS))


def memory_check(client: redis.Redis, preflight: Preflight) -> Check:
    name = "Redis memory"
    try:
        memory = client.info("memory")
    except redis.RedisError as error:
        return warn(name, f"INFO memory refused: {error}", "make sure Redis has room for the queues")
    used, limit = int(memory["used_memory"]), int(memory.get("maxmemory", 0))
    depths = ", ".join(f"{preflight.queue_depth[p]:,} {p} x {preflight.planned_prompt_tokens[p]:,} tokens"
                       for p in PARTITIONS)
    need = planned_queue_bytes(preflight)
    plan = f"queues need {_gib(need)} ({depths}), {_gib(used)} used"
    if any(preflight.queue_depth[p] == 0 for p in PARTITIONS):
        return warn(name, f"no queue depth limit: the whole dataset may wait in Redis; {plan}",
                    "give --max-queue-depth (or GENFLEET_MAX_QUEUE_DEPTH) to `genfleet enqueue`")
    if limit == 0:
        return warn(name, f"maxmemory 0 (bounded only by the host's RAM); {plan}",
                    f"CONFIG SET maxmemory above {_gib(used + need)} (and in redis.conf)")
    if limit - used < need:
        return fail(name, f"maxmemory {_gib(limit)}, {_gib(limit - used)} free: {plan}",
                    f"CONFIG SET maxmemory {used + need} (and in redis.conf), or a lower --max-queue-depth")
    return ok(name, f"maxmemory {_gib(limit)}, {_gib(limit - used)} free; {plan}")


def clock_check(client: redis.Redis) -> Check:
    name = "clock vs Redis"
    try:
        reading = redis_clock.read(client)
    except redis.RedisError as error:
        return warn(name, f"TIME refused: {error}", CLOCK_FIX)
    skew = reading.offset_s
    detail = f"this host is {abs(skew):.3f} s {'behind' if skew > 0 else 'ahead of'} Redis " \
             f"(round trip {reading.round_trip_s * 1000:.1f} ms)"
    if abs(skew) >= FAIL_SKEW_S:
        return fail(name, f"{detail}: rates, beacons and records' timestamps would be off", CLOCK_FIX)
    if abs(skew) >= WARN_SKEW_S:
        return warn(name, detail, CLOCK_FIX)
    return ok(name, detail)


def _gib(size: float) -> str:
    return f"{size / 2**30:,.2f} GiB"


HEALTH_TIMEOUT_S = 5.0
LOAD_READINGS = 5  # the most a host's load is read, while its running cap is unknown and requests wait


@dataclass(frozen=True)
class Upstream:
    url: str
    description: ServerDescription
    load: ServerLoad | None = None  # None where the server reports none


def upstream_check(server: ServerApi, url: str, settings: Settings,
                   run_context_length: int | None) -> tuple[Upstream | None, Check]:
    """The upstream (None when it is not healthy) and its row."""
    name = f"upstream {url}"
    health = server.health(url, timeout_s=HEALTH_TIMEOUT_S)
    if not health.reachable:
        return None, fail(name, health.detail, "start the server (SGLang or vLLM) there, or fix --upstream")
    if not health.ready:
        return None, fail(name, health.detail, "wait for the server to finish loading, or restart it")
    # The workers' own readers: what the server says about itself, and its load.
    upstream = Upstream(url, server.describe(url), _read_load(server, url))
    return upstream, _judge(name, upstream, settings, run_context_length,
                            upstream.description.load_source or server.load_source)


def _read_load(server: ServerApi, url: str) -> ServerLoad | None:
    """The host's load; read again, a second apart, while requests wait and its running cap is not
    known yet: vLLM's is known only once its running count holds over a few pages (servers/vllm.py)."""
    load = server.read_load(url).load
    for _ in range(LOAD_READINGS - 1):
        if load is None or not load.waiting or load.max_running is not None:
            break
        time.sleep(1.0)
        load = server.read_load(url).load
    return load


def _judge(name: str, upstream: Upstream, settings: Settings, run_context_length: int | None,
           load_source: str) -> Check:
    info = upstream.description
    stream = ("not reported" if info.incremental is None else
              "incremental" if info.incremental else "cumulative")
    server_parser = info.reasoning_parser
    context = f"{info.context_length:,}" if info.context_length else "unknown"
    kind = f"{info.kind or 'server'} {info.version or '(version not reported)'}"
    detail = (f"healthy: {kind}; model {info.model.name}; reasoning parser {server_parser or 'none'}; stream {stream}, "
              f"stream_interval {info.stream_interval or '?'} (requests ask {settings.stream_interval}); "
              f"context {context}; {_load_detail(upstream.load, load_source)}")
    findings: list[tuple[Status, str, str]] = []
    if upstream.load is None and settings.in_flight_mode == "auto":
        findings.append((Status.WARN, f"no {load_source}: --in-flight auto keeps the fixed count on this host",
                         "run SGLang 0.5.23 or later, or send workers to the server itself rather than a router"))
    if run_context_length and info.context_length and run_context_length > info.context_length:
        findings.append((Status.FAIL, f"the run's context_length {run_context_length:,} is above the server's",
                         "lower context_length in the run file (or --context-length) to the server's"))
    if server_parser and server_parser != settings.reasoning_parser:
        # Over the chat API the server splits, so its parser is the one that counts.
        status = Status.FAIL if settings.api == "chat" else Status.WARN
        findings.append((status, f"the server's reasoning parser is {server_parser}, genfleet splits with "
                                 f"{settings.reasoning_parser}",
                         f"GENFLEET_REASONING_PARSER={server_parser} if that is the model's parser "
                         "(`genfleet run` takes the server's when none is set)"))
    if info.kind == "vllm" and not server_parser and "reasoning_parser" not in settings.model_fields_set:
        findings.append((Status.WARN, f"vLLM does not say which reasoning parser it runs: genfleet splits with "
                                      f"{settings.reasoning_parser}",
                         "set GENFLEET_REASONING_PARSER to the model's parser (the one given to vllm serve)"))
    if upstream.load is not None and (limit := server_limit(upstream.load)) is not None:
        findings.append((Status.WARN, f"the server limits the batch: {limit.figure}", f"{limit.advice} ({limit.flag})"))
    if info.incremental is None:
        findings.append((Status.WARN, "no stream mode reported: workers infer it from the chunks",
                         "run a server that reports its settings (SGLang 0.5.23's /server_info does)"))
    if not findings:
        return ok(name, detail)
    status = Status.FAIL if any(s is Status.FAIL for s, _, _ in findings) else Status.WARN
    worst = [f for f in findings if f[0] is status]
    return Check(name, status, "; ".join([detail, *(text for _, text, _ in worst)]), worst[0][2])


def _load_detail(load: ServerLoad | None, load_source: str) -> str:
    if load is None:
        return f"no {load_source} (--in-flight auto stays fixed)"
    capacity = f" of {load.max_total_tokens:,} tokens" if load.max_total_tokens else ""
    return (f"load {load.running} running, {load.waiting} waiting, KV {load.token_usage:.0%}{capacity}"
            + (" (admission-bound: the caps reserve the KV cache)" if load.admission_bound() else ""))


PROBE_MESSAGES = [{"role": "user", "content": "What is 2 + 2? Answer in one word."}]
# The parts of a reasoning marker that must be single special tokens (as in sim/completion.py).
SPECIAL_PIECE = re.compile(r"<\|[^|<>]+\|>|</?think>|◁/?think▷")
MODEL_TOKENIZER_FIX = "pass --tokenizer the model's own directory (the one the server loaded)"


class Opening(enum.Enum):
    TEMPLATE_OPENS = "opens"  # the generation prompt ends inside reasoning (Kimi-K2.5, DeepSeek-R1)
    TEMPLATE_CLOSES = "closes"  # it opens and closes reasoning: thinking off
    MODEL_OPENS = "leaves"  # no start marker: the model writes it (or not)


@dataclass(frozen=True)
class TemplateProbe:
    variant: TemplateVariant
    input_ids: list[int]
    generation_prompt: str  # what `add_generation_prompt` appended to the conversation
    expects_reasoning: bool
    opening: Opening | None  # None: a format without think markers (Harmony) or no parser


def tokenizer_check(path: Path | None, fmt: ReasoningFormat | None, *,
                    trust_remote_code: bool = False) -> tuple[Any | None, Check]:
    """The tokenizer (None when unusable) and its row: its kind (fast, or custom code and whether it
    may run), vocabulary, and the parser's markers."""
    if path is None:
        return None, fail("tokenizer", "no tokenizer given", "pass --tokenizer DIR (or `tokenizer` in the run file)")
    try:
        kind = tokenizer_kind(path)
        tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
    except CustomCodeRefused as error:
        return None, fail("tokenizer", str(error), f"pass {TRUST_FLAG} if you trust the model's code")
    except Exception as error:  # noqa: BLE001 - transformers and tokenizers raise many kinds for a bad dir
        text = str(error) if str(path) in str(error) else f"{path}: {error}"
        return None, fail("tokenizer", text, MODEL_TOKENIZER_FIX)
    markers = [piece for marker in (fmt.start, fmt.end) for piece in SPECIAL_PIECE.findall(marker)] if fmt else []
    found = []
    for piece in dict.fromkeys(markers):
        ids = tokenizer.encode(piece, add_special_tokens=False)
        if len(ids) != 1:
            assert fmt is not None  # the markers are its
            return None, fail("tokenizer", f"{path}: {piece!r}, a marker of parser {fmt.name}, is {len(ids)} tokens, "
                                           "not one: not this parser's model", MODEL_TOKENIZER_FIX + " or the right "
                                           "--reasoning-parser")
        found.append(f"{piece} = {ids[0]}")
    markers_text = f"; {', '.join(found)}" if found else ""
    runs = "; its code runs (--trust-remote-code)" if kind.needs_custom_code else ""
    return tokenizer, ok("tokenizer", f"{path}: {kind.describe()}{runs}, vocab {len(tokenizer):,}, "
                                      f"EOS {tokenizer.eos_token}{markers_text}")


# Rows templated to measure the producer's rate: enough to pass a warm-up, few enough for a preflight.
RATE_ROWS = 200


def templating_rate_check(tokenizer: Any, datasets: dict[str, str], variants: Sequence[TemplateVariant]) -> Check:
    """Prompts per second the producer's templating reaches with this tokenizer, measured on the
    run's first rows (the probe conversation without a run file): a custom-code tokenizer is
    Python, not Rust, and may bound the producer."""
    conversations: list[list[dict[str, Any]]] = []
    source = "the probe conversation"
    for name, path in datasets.items():
        for row in open_dataset(path).rows():
            if len(conversations) >= RATE_ROWS:
                break
            if isinstance(row, SourceRow):
                with contextlib.suppress(RowRejected):
                    conversations.append(prompt_messages(read_row(row.data).messages))
        source = f"the first {len(conversations)} rows of {name}"
        break
    if not conversations:
        conversations = [PROBE_MESSAGES] * RATE_ROWS
    kwargs = variants[0].kwargs if variants else {}
    started = time.perf_counter()
    render_prompts(tokenizer, conversations, kwargs)
    rate = len(conversations) / max(time.perf_counter() - started, 1e-9)
    return ok("templating", f"{rate:,.0f} prompts/s on one core ({source})")


def probe_template(tokenizer: Any, variant: TemplateVariant, fmt: ReasoningFormat | None) -> TemplateProbe:
    """Renders the probe conversation as the producer does (`render_prompts`); raises what the
    template raises."""
    kwargs = variant.kwargs
    ids = render_prompts(tokenizer, [PROBE_MESSAGES], kwargs)[0]
    bare = tokenizer.apply_chat_template(PROBE_MESSAGES, tokenize=False, add_generation_prompt=False, **kwargs)
    full = tokenizer.apply_chat_template(PROBE_MESSAGES, tokenize=False, add_generation_prompt=True, **kwargs)
    generation_prompt = full[len(bare):] if full.startswith(bare) else full
    expects = fmt is not None and not (fmt.toggle and kwargs.get(fmt.toggle) is False)
    opening = None
    if fmt is not None and not fmt.harmony:
        at = generation_prompt.rfind(fmt.start)
        opening = (Opening.MODEL_OPENS if at == -1 else
                   Opening.TEMPLATE_CLOSES if fmt.end in generation_prompt[at:] else Opening.TEMPLATE_OPENS)
    return TemplateProbe(variant, ids, generation_prompt, expects, opening)


def template_check(probe: TemplateProbe, fmt: ReasoningFormat | None) -> Check:
    name = "chat template" + variant_label(probe.variant)
    shown = f"generation prompt {probe.generation_prompt[-60:]!r}"
    if fmt is None:
        return ok(name, f"{shown}; parser none: no reasoning expected")
    if not probe.expects_reasoning:
        return ok(name, f"{shown}; thinking off ({fmt.toggle}=false): no reasoning expected")
    if probe.opening is Opening.TEMPLATE_CLOSES:
        return fail(name, f"{shown} closes reasoning ({fmt.start}...{fmt.end}) before the model starts: it answers "
                          f"without reasoning, and parser {fmt.name} files each answer as reasoning",
                    f"use the model's own chat template, one whose generation prompt ends in {fmt.start} "
                    "(or leaves it to the model)")
    if probe.opening is Opening.TEMPLATE_OPENS and not fmt.forced:
        return fail(name, f"{shown} opens {fmt.start}, but parser {fmt.name} waits for the model to write it: "
                          "every thought would land in the content",
                    "set --reasoning-parser / GENFLEET_REASONING_PARSER to the parser of this model")
    if probe.opening is Opening.TEMPLATE_OPENS:
        return ok(name, f"{shown}: opens {fmt.start}, the output starts inside reasoning (parser {fmt.name})")
    return ok(name, f"{shown}: the model opens its reasoning itself (parser {fmt.name})")


def variant_label(variant: TemplateVariant) -> str:
    if not variant.kwargs:
        return ""
    kwargs = ", ".join(f"{key}={value}" for key, value in variant.kwargs.items())
    return f" ({kwargs}{': ' + ', '.join(variant.datasets) if variant.datasets else ''})"


PROBE_MAX_NEW_TOKENS = 64
PROBE_DEADLINE_S = 60.0


def generation_check(server: ServerApi, url: str, model: str, tokenizer: Any, probe: TemplateProbe,
                     settings: Settings, fmt: ReasoningFormat | None) -> Check:
    name = f"test generation {url}{variant_label(probe.variant)}"
    request = GenerationRequest(max_new_tokens=PROBE_MAX_NEW_TOKENS, sampling={}, input_ids=probe.input_ids,
                                chat_template_kwargs=probe.variant.kwargs,
                                skip_special_tokens=settings.skip_special_tokens,
                                stream_interval=settings.stream_interval)
    try:
        generation = server.generate(url, request, deadline=time.monotonic() + PROBE_DEADLINE_S)
    except GenerationError as error:
        return fail(name, f"the test generation failed: {error}", "see the server's log; retry once it answers")
    mismatch = f"not the tokenizer of the server's model ({model})"
    if generation.prompt_tokens != len(probe.input_ids):
        return fail(name, f"the server counted {generation.prompt_tokens} prompt tokens for "
                          f"{len(probe.input_ids)} ids sent: {mismatch}", MODEL_TOKENIZER_FIX)
    if generation.output_ids and max(generation.output_ids) >= len(tokenizer):
        return fail(name, f"the server generated id {max(generation.output_ids)}, beyond the tokenizer's "
                          f"{len(tokenizer):,}: {mismatch}", MODEL_TOKENIZER_FIX)
    splitter = CompletionSplitter(settings.reasoning_parser, tokenizer,
                                  skip_special_tokens=settings.skip_special_tokens)
    try:
        # A server that streams no ids leaves only the text to split (and nothing to compare it with).
        text = splitter.checked_text(generation) if generation.output_ids else generation.text
    except IntegrityError as error:
        return fail(name, f"{error}: {mismatch}", MODEL_TOKENIZER_FIX)
    split = splitter.split(generation, probe.variant.kwargs)
    seen = (f"{generation.completion_tokens} tokens ({generation.finish}): reasoning "
            f"{len(split.reasoning)} chars{', closed' if split.closed else ''}, content {len(split.content)} chars")
    if fmt is None or not probe.expects_reasoning:
        return ok(name, f"{seen}; no reasoning expected")
    opened_by = ("the template" if probe.opening is Opening.TEMPLATE_OPENS else
                 "the model" if fmt.harmony or text.lstrip().startswith(fmt.start) else None)
    if opened_by is None:
        return fail(name, f"{seen}: neither the prompt nor the model opened reasoning ({fmt.start}), so parser "
                          f"{fmt.name} {'filed the answer as reasoning' if fmt.forced else 'found none'}",
                    "use the model's own chat template and its --reasoning-parser (GENFLEET_REASONING_PARSER)")
    if not split.reasoning.strip():
        return fail(name, f"{seen}: empty reasoning with parser {fmt.name}",
                    "use the model's own chat template and its --reasoning-parser (GENFLEET_REASONING_PARSER)")
    if not split.closed and generation.finish == "stop":
        return warn(name, f"{seen}: the model stopped without closing its reasoning ({fmt.end})",
                    f"check that {fmt.name} is this model's reasoning parser")
    return ok(name, f"{seen}; reasoning opened by {opened_by}")
