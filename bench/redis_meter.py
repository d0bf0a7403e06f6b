"""What a Redis and the processes around it spent between two instants: commands by name (INFO
commandstats), Redis CPU (INFO cpu), memory (INFO memory, and MEMORY USAGE per key), the CPU of
watched processes (/proc), and the Celery events published (a pub/sub subscriber).
`bench/control_plane.py` measures with it."""
from __future__ import annotations

import base64
import json
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import redis

from bench.proc_stats import cpu_seconds

# INFO fields kept besides used_memory, to tell where memory went: the clients' buffers and count
# above all (a worker's connection pool grows with its threads, not with prompts).
MEMORY_PARTS = ("used_memory_overhead", "used_memory_dataset", "used_memory_scripts", "mem_clients_normal",
                "connected_clients", "used_memory_lua")


@dataclass(frozen=True)
class Snapshot:
    at: float
    calls: dict[str, int]  # by command, the bench's own taken out
    usec: dict[str, int]  # time inside each command (not reading, parsing or writing the socket)
    redis_cpu_s: float
    used_memory: int
    memory: dict[str, int]  # MEMORY_PARTS and the key count
    cpu_s: dict[str, float] = field(default_factory=dict)  # the watched processes


class Meter:
    """Snapshots of one Redis and of some processes' CPU. The bench's own commands (INFO, progress
    polls, key scans) are counted here and taken out, so the figures are the fleet's alone.

    Redis 7 counts each command a script or a MULTI block runs in commandstats and in
    total_commands_processed, besides the EVALSHA or EXEC itself (checked on 7.0.15: an EVAL of 10
    SETs adds 11), so "commands" here are commands executed, not round trips."""

    def __init__(self, client: redis.Redis, pids: dict[str, int] | None = None) -> None:
        self.client, self.pids, self.own = client, pids or {}, Counter()

    def snapshot(self) -> Snapshot:
        own = Counter(self.own)
        info = self.client.info("all")  # one command; its own call shows in the next snapshot
        self.own["info"] += 1
        stats = {key[len("cmdstat_"):]: value for key, value in info.items() if key.startswith("cmdstat_")}
        memory = {name: int(info.get(name, 0)) for name in MEMORY_PARTS}
        memory["keys"] = info.get("db0", {}).get("keys", 0)
        return Snapshot(at=time.monotonic(), calls={n: s["calls"] - own[n] for n, s in stats.items()},
                        usec={n: s["usec"] for n, s in stats.items()},
                        redis_cpu_s=info["used_cpu_user"] + info["used_cpu_sys"], used_memory=info["used_memory"],
                        memory=memory, cpu_s={name: cpu_seconds(pid) for name, pid in self.pids.items()})

    def poll(self, *commands: tuple) -> list:
        """The bench's own reads, in one round trip, counted as its own."""
        pipe = self.client.pipeline(transaction=False)
        for command in commands:
            name = command[0].lower()
            # commandstats names a subcommand's calls `memory|usage`, as it does `client|setname`.
            self.own[f"{name}|{command[1].lower()}" if name in ("memory", "slowlog", "config") else name] += 1
            pipe.execute_command(*command)
        return pipe.execute()

    def settled_memory(self) -> dict[str, int]:
        """MEMORY STATS' byte counts (`total.allocated` is INFO's used_memory) without two fixed costs
        that would otherwise read as data; used_memory with them is kept as `with_fixed`:
        - the slowlog: up to slowlog-max-len (128) commands slower than 10 ms, each with up to 32
          arguments of up to 128 bytes (Redis src/slowlog.h, SLOWLOG_ENTRY_MAX_ARGC, _MAX_STRING); a
          publish.lua batch of 1,024 prompts is one, ~5 KB. SLOWLOG RESET empties it.
        - Redis 7's per-command latency histograms (`latency-tracking yes`, the default): ~24.7 KB for
          each command name once first called (measured on 7.0.15: a first SET adds 24,760 B, the next
          none), so a longer run that happens to call one more command (the reaper's rarer checks)
          looks 25 KB bigger. CONFIG RESETSTAT frees them, and zeroes commandstats: call this only
          outside a window measured with `snapshot()`."""
        before, entries, _, _ = self.poll(("MEMORY", "STATS"), ("SLOWLOG", "LEN"), ("SLOWLOG", "RESET"),
                                          ("CONFIG", "RESETSTAT"))
        stats = {key.decode(): value for key, value in self.poll(("MEMORY", "STATS"))[0].items()
                 if isinstance(value, int)}
        # Redis 7.0 counts a client's buffers in clients.normal only once its cron has visited it, so
        # a difference of these can carry a few KB of connection buffers as well.
        return {**stats, "slowlog.entries": entries, "with_fixed": before[b"total.allocated"]}

    def key_memory(self) -> dict[str, dict]:
        """MEMORY USAGE of every key (exact: SAMPLES 0), summed per pattern, numbers and ids folded."""
        out: dict[str, dict] = {}
        cursor = None
        while cursor != 0:
            cursor, keys = self.poll(("SCAN", cursor or 0, "COUNT", 1000))[0]
            sizes = self.poll(*[("MEMORY", "USAGE", key, "SAMPLES", 0) for key in keys]) if keys else []
            for key, size in zip(keys, sizes, strict=True):
                entry = out.setdefault(re.sub(r"[0-9a-f]{16,}|\d{5,}", "*", key.decode(errors="replace")),
                                       {"keys": 0, "bytes": 0})
                entry["keys"] += 1
                entry["bytes"] += size or 0
        return dict(sorted(out.items(), key=lambda item: -item[1]["bytes"]))


def delta(a: Snapshot, b: Snapshot) -> dict:
    calls = {n: c - a.calls.get(n, 0) for n, c in b.calls.items() if c - a.calls.get(n, 0) > 0}
    return {"seconds": b.at - a.at, "commands": sum(calls.values()), "calls": calls,
            "usec": {n: b.usec[n] - a.usec.get(n, 0) for n in calls}, "redis_cpu_s": b.redis_cpu_s - a.redis_cpu_s,
            "used_memory": b.used_memory - a.used_memory,
            "memory": {name: value - a.memory.get(name, 0) for name, value in b.memory.items()},
            "cpu_s": {name: b.cpu_s[name] - a.cpu_s.get(name, 0.0) for name in b.cpu_s}}


class EventCounter(threading.Thread):
    """Every Celery event published while it runs, by type. Celery's events go out through kombu's
    fanout exchange `celeryev`, on Redis one PUBLISH per message to `/{db}.celeryev/{routing key}`
    (kombu 5.7.0, kombu/transport/redis.py: `_put_fanout`, `_get_publish_topic`, `keyprefix_fanout`
    '/{db}.'; Flower's receiver PSUBSCRIBEs the same pattern). A worker with an event loop (genfleet's
    threads pool has one) buffers task events and publishes up to 24 at once as one `task.multi` list
    (celery 5.7.0, celery/worker/consumer/events.py `buffer_group=['task']`, celery/events/dispatcher.py
    `send`, `flush`); `genfleet enqueue` PUBLISHes one `task.sent` per prompt (common/publish.lua)."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__(daemon=True, name="celeryev-counter")
        db = client.connection_pool.connection_kwargs.get("db", 0)
        self.pubsub = client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.psubscribe(f"/{db}.celeryev/*")
        self.messages: Counter = Counter()  # PUBLISHes, by routing key
        self.events: Counter = Counter()  # events, by type
        self.bytes: Counter = Counter()  # payload bytes, by routing key: what a slow subscriber's buffer holds
        # Not `_stop`: threading.Thread has a method of that name.
        self._lock, self._halt = threading.Lock(), threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                message = self.pubsub.get_message(timeout=0.2)
            except redis.ConnectionError:  # Redis stopped under it: the run is over
                return
            if message and message["type"] == "pmessage":
                with self._lock:
                    self._count(message)

    def _count(self, message: dict) -> None:
        key = message["channel"].decode().rsplit("/", 1)[-1]
        self.messages[key] += 1
        self.bytes[key] += len(message["data"])
        try:
            envelope = json.loads(message["data"])
            body = envelope["body"]
            if envelope.get("properties", {}).get("body_encoding") == "base64":
                body = base64.b64decode(body)
            events = json.loads(body)
        except (ValueError, KeyError, TypeError):
            self.events[key] += 1
            return
        for event in events if isinstance(events, list) else [events]:
            self.events[event.get("type", key) if isinstance(event, dict) else key] += 1

    def read(self) -> tuple[Counter, Counter, Counter]:
        with self._lock:
            return Counter(self.messages), Counter(self.events), Counter(self.bytes)

    def stop(self) -> None:
        self._halt.set()
        self.join(2)
        self.pubsub.close()
