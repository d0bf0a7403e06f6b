"""Whether the Redis genfleet runs on keeps what it is given. It must run with `maxmemory-policy
noeviction` (any other policy deletes keys under memory pressure: queued prompts, held messages, run
counters and bitmaps) and with AOF (without it a restart loses everything since the last snapshot).

Read with `CONFIG GET`, else from `INFO` (managed Redis services often disable CONFIG but answer
INFO); where neither answers, the check says it could not check. Workers log the lines at start
(`workers/command.py`); `genfleet status` shows them as alarms (`genfleet/status/read_model.py`).
"""
from __future__ import annotations

import redis

SAFE_POLICY = "noeviction"


def durability_problems(client: redis.Redis) -> list[str]:
    """One line per way this Redis may lose genfleet's state; empty when it is configured as it must
    be. Connection errors propagate: the caller knows whether an unreachable Redis is news."""
    try:
        policy, aof = _from_config(client)
    except redis.ResponseError as config_refused:
        try:
            policy, aof = _from_info(client)
        except (redis.ResponseError, KeyError) as info_refused:
            return [f"could not check Redis's maxmemory-policy and AOF (CONFIG GET: {config_refused}; INFO: "
                    f"{info_refused}): make sure it runs with maxmemory-policy noeviction and appendonly yes"]
    problems = []
    if policy != SAFE_POLICY:
        problems.append(f"Redis maxmemory-policy is {policy}, not {SAFE_POLICY}: under memory pressure it deletes "
                        "keys, queued prompts and run state among them (set maxmemory-policy noeviction)")
    if not aof:
        problems.append("Redis runs without AOF (appendonly no): a restart loses the queued prompts and run state "
                        "written since its last snapshot (set appendonly yes, appendfsync everysec)")
    return problems


def _from_config(client: redis.Redis) -> tuple[str, bool]:
    found = {_text(k): _text(v) for k, v in client.config_get("maxmemory-policy").items()}
    found |= {_text(k): _text(v) for k, v in client.config_get("appendonly").items()}
    if "maxmemory-policy" not in found or "appendonly" not in found:
        # A renamed or filtered CONFIG answers with nothing rather than an error.
        raise redis.ResponseError("no maxmemory-policy or appendonly in its answer")
    return found["maxmemory-policy"], found["appendonly"] == "yes"


def _from_info(client: redis.Redis) -> tuple[str, bool]:
    memory, persistence = client.info("memory"), client.info("persistence")
    return _text(memory["maxmemory_policy"]), int(persistence["aof_enabled"]) == 1


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
