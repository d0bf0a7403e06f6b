"""One typed settings object for every part, read from `GENFLEET_*` env vars; CLI flags override."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from genfleet.common import GenfleetError
from genfleet.common.queues import IN_FLIGHT_PER_HOST
from genfleet.common.reasoning import get_format
from genfleet.common.records import Api, InFlight, Routing


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GENFLEET_", extra="ignore")

    # Broker and run state live in the same Redis (noeviction, AOF). TLS: `rediss://`, with
    # `?ssl_ca_certs=/path/ca.pem` for a private CA; the server certificate is always verified unless
    # the URL says `ssl_cert_reqs=none` (see `verify_tls_by_default`).
    redis_url: str = "redis://127.0.0.1:6379/0"
    output_dir: Path = Path("./output")
    reasoning_parser: str = "kimi_k2"
    flower_auth: str | None = None
    # Port of a worker's Prometheus /metrics: unset = its pool's default (short 9650, long 9651),
    # 0 = off. Several workers of one pool on one host need a port each.
    metrics_port: int | None = None

    # SGLang hosts a worker streams from; `genfleet worker --upstream` overrides.
    upstreams: Annotated[list[str], NoDecode] = []
    # "affinity": prompts sharing a prefix go to the same host, for its prefix cache, within a load
    # bound; "least-busy": every request to the host with the fewest in flight (workers/upstreams.py).
    routing: Routing = "affinity"
    # The queue a worker consumes, and its requests in flight (None: `in_flight()`'s default).
    pool: Literal["short", "long"] = "short"
    concurrency: int | None = None
    # "fixed": each host gets its share of the in-flight count; "auto": each host's streams follow
    # its own load (SGLang's /v1/loads), `concurrency` (or the pool's default) the ceiling.
    in_flight_mode: InFlight = "fixed"
    # How often an `auto` worker reads each host's load.
    admission_interval_s: Annotated[float, Field(gt=0)] = 2.0
    # "generate": native /generate with the producer's token ids (exact, the default);
    # "chat": /v1/chat/completions, the server templates and splits reasoning itself.
    api: Api = "generate"
    # The model's tokenizer directory on the worker host. With it, reasoning is split on the
    # generated token ids (independent of skip_special_tokens) and `--regenerate all` can template
    # each turn for /generate.
    tokenizer: Path | None = None
    # Run a tokenizer's own code (`auto_map` in its tokenizer_config.json: Kimi-K2's
    # tokenization_kimi.py), as SGLang's and vLLM's --trust-remote-code do; off, such a directory is
    # refused before anything runs (common/tokenizer.py).
    trust_remote_code: bool = False
    # Sent to SGLang; keep false unless `tokenizer` is set, or </think> vanishes from the text.
    skip_special_tokens: bool = False
    # Tokens between stream chunks: SGLang's default of 1 costs quadratic bytes when cumulative.
    stream_interval: int = 32
    connect_timeout_s: float = 10.0
    # No byte from the server for this long means the stream is stalled (transient failure).
    stall_timeout_s: float = 300.0
    # The threads pool enforces no Celery time limit, so the task keeps its own deadline.
    task_deadline_s: float = 2700.0
    max_attempts: int = 5
    retry_backoff_s: float = 5.0
    retry_backoff_max_s: float = 600.0

    # kombu re-queues an unacked task after this, even if it still runs. Leases (below) reclaim a
    # dead worker's tasks in minutes, so this only needs to be far above any task: one day.
    # Keep it equal in every worker and in Flower.
    visibility_timeout_s: int = 86400
    # A held message's lease: renewed every heartbeat; once expired, the reaper re-queues it.
    lease_ttl_s: float = 60.0
    lease_heartbeat_s: float = 15.0
    reaper_interval_s: float = 10.0
    # How often (fleet-wide) a worker's reaper checks for prompts nobody holds: enqueued, yet neither
    # queued, in transit, running, done nor dead (workers/delivery.py); `status` shows them. 0: never.
    unaccounted_check_interval_s: float = 300.0
    # On SIGTERM running streams may finish for this long; the rest are re-queued.
    shutdown_grace_s: float = 30.0
    # Circuit breaker per upstream: opens after this many consecutive failures...
    breaker_failures: int = 3
    # ...and stays open this long before a /health probe may close it again.
    breaker_open_s: float = 30.0
    health_interval_s: float = 15.0
    # How often kombu scans for unacked tasks to restore (interval x throttle seconds).
    unacked_restore_interval_s: int = 10
    unacked_restore_throttle: int = 10

    shard_max_bytes: int = 256 * 1024 * 1024
    # An open shard is sealed (renamed without `.open`) after this long, even if idle.
    shard_max_age_s: float = 900.0
    # Group commit: records written within this window share one fsync.
    commit_interval_s: float = 0.05
    # A worker takes no prompt while its output file system has less free space than this (a
    # record written to a full disk is GPU time thrown away); after `disk_wait_s` a waiting task
    # gives its message back to the queue.
    min_free_disk_mb: int = 1024
    disk_wait_s: float = 30.0
    # The loop guard's thresholds, in tokens (workers/generation/loop_guard.py; unset: its defaults, justified
    # there). A repetition is a loop when a unit of at most `loop_max_period` tokens repeats at
    # least `loop_min_repeats` times in a row over at least `loop_min_span` tokens.
    loop_max_period: Annotated[int, Field(ge=1)] | None = None
    loop_min_repeats: Annotated[int, Field(ge=2)] | None = None
    loop_min_span: Annotated[int, Field(ge=1)] | None = None

    long_threshold_tokens: int = 16384
    max_new_tokens_short: int = 10240
    max_new_tokens_long: int = 16384
    # `--first-max-new-tokens auto` (workers/generation/first_cap.py): a dataset's first cap is
    # this quantile of its finished completion lengths once this many have finished; until then
    # `first_cap_start`.
    first_cap_start: Annotated[int, Field(ge=1)] = 1024
    first_cap_quantile: Annotated[float, Field(gt=0, le=1)] = 0.5
    first_cap_min_samples: Annotated[int, Field(ge=1)] = 100
    # Producer: rows read, templated and published per batch (each batch is one atomic publish).
    enqueue_batch_rows: int = 1024
    # Producer: keep each queue at most this many messages deep (0: no limit); it waits for the
    # workers to drain and streams the rest, so a huge dataset never sits in Redis at once.
    # None: `common.queues.DEFAULT_QUEUE_DEPTH` (15,000 short, 3,200 long).
    max_queue_depth: int | None = None

    def in_flight(self) -> int:
        """Requests a worker keeps in flight over all its upstreams: `concurrency`, or the pool's
        per-host default times the hosts."""
        return self.concurrency or IN_FLIGHT_PER_HOST[self.pool] * max(len(self.upstreams), 1)

    @field_validator("redis_url")
    @classmethod
    def _verify_tls(cls, value: str) -> str:
        return verify_tls_by_default(value)

    @field_validator("reasoning_parser")
    @classmethod
    def _known_parser(cls, value: str) -> str:
        get_format(value)  # an unknown name would fail every prompt's split: refused at start instead
        return value

    @field_validator("upstreams", mode="before")
    @classmethod
    def _split_upstreams(cls, value: object) -> object:
        if isinstance(value, str):
            return [url.strip() for url in value.split(",") if url.strip()]
        return value


def verify_tls_by_default(url: str) -> str:
    """A `rediss://` URL without `ssl_cert_reqs` gets `ssl_cert_reqs=required`.

    redis-py verifies the server certificate by default, but kombu (the Celery broker connection)
    does not when the URL has no `ssl_*` option: it falls back to CERT_NONE with only a log
    warning, encrypted yet open to anyone in the middle."""
    if not url.startswith("rediss://") or "ssl_cert_reqs=" in url:
        return url
    return f"{url}{'&' if '?' in url else '?'}ssl_cert_reqs=required"


def printable_url(url: str) -> str:
    """The URL as it may be printed (a log, a ticket, a table): any password replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)).geturl()


class SettingsError(GenfleetError, ValueError):
    """A setting's value refused, in one line naming its flag and variable, and why."""


# Settings whose command-line flag is not the field's name.
_FLAGS = {"upstreams": "--upstream", "in_flight_mode": "--in-flight"}


def settings_with(**flags: Any) -> Settings:
    """The settings from GENFLEET_* env vars, with the flags the user gave (not None) on top; raises
    SettingsError for the first value refused."""
    try:
        return Settings(**{name: value for name, value in flags.items() if value is not None})
    except ValidationError as error:
        first = error.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "settings"
        flag = _FLAGS.get(name, "--" + name.replace("_", "-"))
        why = str(first["msg"]).removeprefix("Value error, ")
        raise SettingsError(f"{flag} / GENFLEET_{name.upper()}: {why}") from None


def flower_auth_problem(auth: str | None) -> str | None:
    """Why GENFLEET_FLOWER_AUTH cannot protect Flower, or None: it must be exactly one `user:password`.
    Flower splits its basic-auth value on commas, so `admin:abc,xyz` would let a bare `xyz` in."""
    if not auth:
        return ("GENFLEET_FLOWER_AUTH is not set: genfleet flower runs only behind basic auth, e.g. "
                "GENFLEET_FLOWER_AUTH=\"admin:$(openssl rand -hex 16)\"")
    user, colon, password = auth.partition(":")
    if "," in auth:
        return ("GENFLEET_FLOWER_AUTH holds a comma: it must be one user:password (Flower splits the value on "
                "commas, so each part would be accepted as a credential of its own)")
    if not colon or not user or not password:
        return "GENFLEET_FLOWER_AUTH must be user:password, with a user and a password both non-empty"
    if any(c.isspace() or not c.isprintable() for c in auth):
        return "GENFLEET_FLOWER_AUTH may not hold spaces or control characters"
    return None
