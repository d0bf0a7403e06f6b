"""Every Redis key genfleet uses, built in one place. All of a run's keys start with `genfleet:{run}:`."""
from __future__ import annotations

from dataclasses import dataclass

PREFIX = "genfleet"


@dataclass(frozen=True)
class RunKeys:
    run: str

    @property
    def base(self) -> str:
        return f"{PREFIX}:{self.run}"

    @property
    def manifest(self) -> str:
        """Hash: run config (tokenizer, parser, config hash, created_at); fields in `ManifestFields`."""
        return f"{self.base}:manifest"

    @property
    def datasets(self) -> str:
        """Set: names of the run's datasets."""
        return f"{self.base}:datasets"

    def counters(self, dataset: str) -> str:
        """Hash: per-dataset counters (total, done, failed, tokens, ...)."""
        return f"{self.base}:counters:{dataset}"

    def enqueued(self, dataset: str) -> str:
        """Bitmap over row indices: the prompt was published once (makes enqueue idempotent)."""
        return f"{self.base}:enqueued:{dataset}"

    def done(self, dataset: str) -> str:
        """Bitmap over row indices: the record is durably on disk."""
        return f"{self.base}:done:{dataset}"

    def rejected(self, dataset: str) -> str:
        """Hash: row index -> JSON {file, line, reason} for rows refused at enqueue."""
        return f"{self.base}:rejected:{dataset}"

    @property
    def unaccounted(self) -> str:
        """Hash: dataset -> rows found neither queued, running, done nor dead by two workers' checks in
        a row (lost: `enqueue --recover-lost`), and `suspects:{dataset}` -> bitmap of the rows the
        latest check found; absent while nothing is missing (`workers/delivery.py`)."""
        return f"{self.base}:unaccounted"

    @property
    def dead_letters(self) -> str:
        """Hash: prompt id -> msgpack dead letter (`common/run_state.py`: payload, error class, message,
        attempts, ...)."""
        return f"{self.base}:dead"

    # --- what `genfleet status` reads to show rates, lengths and ETA (written by the workers) ----
    def rate_bucket(self, minute: int) -> str:
        """Hash for one wall-clock minute (unix time // 60): `{req|tok|sec|err}:{partition}:{dataset}`
        -> prompts finished, completion tokens generated, seconds their requests ran, failed
        attempts. Expires after
        `RATE_BUCKET_TTL_S`, so a run keeps at most two hours of them whatever its length."""
        return f"{self.base}:rate:{minute}"

    def lengths(self, dataset: str) -> str:
        """Hash: log-spaced bucket index -> finished prompts whose completion fell in it (see
        `common/fleet_stats.py`); at most ~170 fields per dataset, kept for the run's life."""
        return f"{self.base}:lengths:{dataset}"

    @property
    def partition_done(self) -> str:
        """Hash: `{partition}:{dataset}` -> prompts finished on that partition's workers."""
        return f"{self.base}:partition-done"

    @property
    def activity(self) -> str:
        """Hash: `first` / `last` -> unix time the run's first / latest prompt finished."""
        return f"{self.base}:activity"


# Rate buckets outlive the longest window `status` shows (10 min) by far: two hours.
RATE_BUCKET_TTL_S = 2 * 3600


# --- fleet-wide keys (not per run) --------------------------------------------------------------
# kombu's Redis transport emulates acks with these two (default names, no global_keyprefix).
KOMBU_UNACKED = "unacked"
KOMBU_UNACKED_INDEX = "unacked_index"
# Zset: kombu delivery tag -> lease expiry (unix time), renewed by the holding worker's heartbeat.
LEASES = f"{PREFIX}:leases"
# Only one reaper scans at a time, fleet-wide.
REAPER_LOCK = f"{PREFIX}:reaper-lock"
# Zset: transit list (`transit_list`) -> unix time its worker last showed it is alive. Written by
# `workers/broker.py` only, as are the lists.
TRANSITS = f"{PREFIX}:transits"
# Set while one worker's reaper checks for prompts lost in transit, for as long as the check interval
# (`workers/delivery.py`, its writer): one check per interval, fleet-wide.
UNACCOUNTED_CHECK = f"{PREFIX}:unaccounted-check"


def transit_list(queue: str, consumer: str) -> str:
    """List: what one consumer (a worker's kombu channel) took off `queue` and has not yet recorded
    as unacked, normally empty; its message moves atomically from the queue to here (BLMOVE) and on
    to `unacked` (workers/broker.py)."""
    return f"{PREFIX}:transit:{queue}:{consumer}"


def transit_queue(key: str) -> str:
    """The queue a transit list's messages came from."""
    return key.split(":")[2]
# Zset: worker name -> unix time of its latest beacon; the beacon itself is `worker_beacon(name)`.
WORKER_BEACONS = f"{PREFIX}:workers"


def worker_beacon(name: str) -> str:
    """String (JSON, expires): a live worker's upstream health and tasks in flight per run, dataset
    and partition; it vanishes with its worker, so a dead worker's view never lingers."""
    return f"{PREFIX}:worker:{name}"


class ManifestFields:
    """Field names inside a run's manifest hash (written by `common/run_state.py`, read by all)."""
    CREATED_AT = "created_at"
    CONFIG = "config"  # JSON: the run-wide config the producer hashed
    CONFIG_HASH = "config_hash"
    TOKENIZER_DIR = "tokenizer_dir"  # where the producer read the tokenizer (not hashed)
    TRUST_REMOTE_CODE = "trust_remote_code"  # "1": the tokenizer's own code ran (--trust-remote-code)
    # With `enqueue --new-run`: the run that replaced this one, and the one this run replaced.
    SUCCESSOR = "successor"
    PREDECESSOR = "predecessor"

    @staticmethod
    def source(dataset: str) -> str:
        return f"source:{dataset}"

    @staticmethod
    def dataset_config(dataset: str) -> str:
        """JSON: the dataset's own config (sampling, max_new_tokens, template kwargs, budget, ...)."""
        return f"dataset:{dataset}"

    @staticmethod
    def dataset_config_hash(dataset: str) -> str:
        return f"dataset_hash:{dataset}"

    @staticmethod
    def budget(dataset: str) -> str:
        """Integer: completion tokens the dataset may generate (absent: no budget)."""
        return f"max_tokens_per_dataset:{dataset}"


# --- Celery's keys in the broker Redis: kombu's Redis transport names and writes them; of ours, only
# RunState.publish (LPUSH onto a queue list) and the lease reaper (workers/delivery.py, restore) do ---
def queue_list(queue: str) -> str:
    """List of a queue's messages at the default priority: kombu LPUSHes there, workers BRPOP."""
    return queue


def celery_event_channel(db: int, routing_key: str) -> str:
    """Pub/sub channel of Celery's `celeryev` fanout exchange (kombu's `fanout_patterns`), e.g.
    `/0.celeryev/task.sent`, where Flower listens for task events."""
    return f"/{db}.celeryev/{routing_key}"
