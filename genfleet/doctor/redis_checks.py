"""The Redis the run will use: reachable, durable (`common/redis_checks.py`: noeviction and AOF),
room for the queues the producer will fill, and a clock this host agrees with.

Memory is planned from the measured cost of a queued prompt, 1,385 B + 13.9 B per prompt token of
`used_memory` (docs/scaling.md), times each queue's depth: the producer keeps a queue at most
`--max-queue-depth` deep and streams the rest, so that is what Redis must hold besides what it holds.
"""
from __future__ import annotations

import time

import redis

from genfleet.common.queues import PARTITIONS
from genfleet.common.redis_checks import durability_problems
from genfleet.common.run_state import connect
from genfleet.common.settings import printable_url
from genfleet.doctor.checks import Check, fail, ok, warn
from genfleet.doctor.plan import Preflight

QUEUED_PROMPT_BYTES = 1385
QUEUED_BYTES_PER_TOKEN = 13.9
# Leases (TTL 60 s, renewed every 15 s: workers/delivery.py) are written with one worker's clock and
# judged by the reaper's, and rate buckets and beacons are per wall-clock second and minute: hosts
# must agree to well within a heartbeat. Redis's clock is the one every host can compare with.
WARN_SKEW_S = 1.0
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
    before = time.time()
    try:
        seconds, micros = client.time()
    except redis.RedisError as error:
        return warn(name, f"TIME refused: {error}", CLOCK_FIX)
    after = time.time()
    # Redis read its clock somewhere within the round trip: compare with its middle.
    skew = seconds + micros / 1e6 - (before + after) / 2
    detail = f"this host is {abs(skew):.3f} s {'behind' if skew > 0 else 'ahead of'} Redis " \
             f"(round trip {(after - before) * 1000:.1f} ms)"
    if abs(skew) >= FAIL_SKEW_S:
        return fail(name, f"{detail}: leases and rates would be judged wrongly", CLOCK_FIX)
    if abs(skew) >= WARN_SKEW_S:
        return warn(name, detail, CLOCK_FIX)
    return ok(name, detail)


def _gib(size: float) -> str:
    return f"{size / 2**30:,.2f} GiB"
