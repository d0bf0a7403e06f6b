"""The control-plane cost model: per-completion costs from `bench/control_plane.py`'s measurements,
the ceilings they imply, and what the target fleet needs (10,000,000 prompts on 100 hosts in a day).

A cost is split in two: what each completion adds (enqueue, fetch, ack, account, events) and what the
fleet costs per second whatever it finishes (each worker's polls, heartbeats and beacons; every held
message's lease renewals and reaper checks). The first is the run's cost minus the idle window's rate
over the run's seconds, per completion; the second is measured idle and in `background_cost`.
"""
from __future__ import annotations

from genfleet.common.queues import DEFAULT_QUEUE_DEPTH, IN_FLIGHT_PER_HOST, LONG, SHORT

TARGET_PROMPTS, TARGET_HOSTS, DAY_S = 10_000_000, 100, 86_400
WORKERS_PER_HOST = 2  # a short and a long worker per host (docs/deploying.md)
LEASE_TTL_S, LEASE_HEARTBEAT_S, REAPER_INTERVAL_S = 60.0, 15.0, 10.0  # common/settings.py defaults
# Prompt tokens for the memory plan: a typical and a heavy mix (a long prompt is one past
# long_threshold 16,384 - max_new_tokens_short 10,240 = 6,144 tokens).
TOKEN_MIXES = {"typical": {SHORT: 1_000, LONG: 8_000}, "heavy": {SHORT: 6_000, LONG: 30_000}}
TASK_EVENTS = ("task-sent", "task-received", "task-started", "task-succeeded")
FLOWER_MAX_TASKS = 20_000  # `genfleet flower --max-tasks` default (workers/command.py)


def per_completion(run: dict) -> dict:
    """One fleet run's cost per finished prompt: all in (what Redis did ÷ prompts) and marginal (less
    the idle rate over the run's seconds)."""
    n, spent, idle = run["prompts"], run["run"], run["idle"]
    seconds, idle_s = spent["seconds"], idle["seconds"]

    def marginal(total: float, idle_total: float) -> float:
        return (total - idle_total / idle_s * seconds) / n

    procs = {name: marginal(cpu, idle["cpu_s"].get(name, 0.0)) for name, cpu in spent["cpu_s"].items()}
    events = spent["events"]
    return {
        "prompts": n, "job_s": run["job_s"], "completions_per_s": n / run["job_s"],
        "commands": spent["commands"] / n, "commands_marginal": marginal(spent["commands"], idle["commands"]),
        "redis_cpu_us": 1e6 * spent["redis_cpu_s"] / n,
        "redis_cpu_us_marginal": 1e6 * marginal(spent["redis_cpu_s"], idle["redis_cpu_s"]),
        "command_us": sum(spent["usec"].values()) / n,
        "calls": {name: calls / n for name, calls in sorted(spent["calls"].items(), key=lambda kv: -kv[1])},
        "usec": {name: us / n for name, us in sorted(spent["usec"].items(), key=lambda kv: -kv[1])},
        "cpu_ms_marginal": {name: 1e3 * cpu for name, cpu in procs.items()},
        "task_events": sum(events.get(t, 0) for t in TASK_EVENTS) / n,
        "event_publishes": sum(spent["event_messages"].values()) / n,
        "event_bytes": sum(spent["event_bytes"].values()) / n,
        "events": {name: count / n for name, count in events.items()},
        # used_memory the fleet leaves (clients gone) less a fresh Redis's: the warm-up run's and the
        # worker's fixed keys, and this run's; and the run's own keys alone (MEMORY USAGE).
        "retained_bytes": run["left_memory"]["total.allocated"], "left_memory": run["left_memory"],
        "retained_with_fixed": run["left_memory"]["with_fixed"],
        "retained_memory_parts": spent["memory"],
        "retained_key_bytes": _key_bytes(run["keys_after"]) - _key_bytes(run["keys_before"]),
        "job_occupancy": run["job_mean_running"] / run["slots"],
        "flower_tasks_seen": (run["flower"] or {}).get("events_seen", {}).get("task-succeeded", 0),
        "flower_rss": (run["flower"] or {}).get("peak_rss_bytes", 0),
        "idle_per_s": {"commands": idle["commands"] / idle_s, "redis_cpu_ms": 1e3 * idle["redis_cpu_s"] / idle_s,
                       "heartbeats": idle["events"].get("worker-heartbeat", 0) / idle_s,
                       "heartbeat_bytes": idle["event_bytes"].get("worker.heartbeat", 0) / idle_s,
                       **{f"{name}_cpu_ms": 1e3 * cpu / idle_s for name, cpu in idle["cpu_s"].items()}},
    }


def _key_bytes(keys: dict[str, dict]) -> int:
    return sum(entry["bytes"] for entry in keys.values())


def summarise(result: dict) -> dict:
    runs = [per_completion(run) for run in result["runs"]]
    small, big = runs[0], runs[-1]
    queue, held = result["queue"], result["queue"]["background"]
    enqueued, redis_idle = queue["points"]["small"], queue["points"]["redis_idle"]

    def slope(key: str, per: str = "prompts") -> tuple[float, float]:
        """Bytes per finished prompt between the two runs, and the fixed part per run."""
        per_prompt = (big[key] - small[key]) / max(big[per] - small[per], 1)
        return per_prompt, small[key] - per_prompt * small[per]

    ceilings = {"redis_completions_per_core": 1e6 / big["redis_cpu_us_marginal"],
                "redis_completions_per_core_all_in": 1e6 / big["redis_cpu_us"],
                "worker_tasks_per_core": 1e3 / big["cpu_ms_marginal"]["worker"]}
    if "flower" in big["cpu_ms_marginal"]:
        ceilings["flower_tasks_per_s"] = 1e3 / big["cpu_ms_marginal"]["flower"]
    summary = {
        "runs": runs, "queue_fit": queue["fit"],
        "queue_points": {name: {k: queue["points"][name][k] for k in ("prompt_tokens", "message_bytes",
                                                                         "bytes_per_prompt")}
                         for name in ("small", "large")},
        "enqueue_commands": enqueued["commands"] / queue["prompts"],
        "enqueue_redis_cpu_us": 1e6 * enqueued["redis_cpu_s"] / queue["prompts"],
        "retained": dict(zip(("slope", "fixed"), slope("retained_bytes"), strict=True)),
        "retained_keys": dict(zip(("slope", "fixed"), slope("retained_key_bytes"), strict=True)),
        "retained_with_fixed": dict(zip(("slope", "fixed"), slope("retained_with_fixed"), strict=True)),
        # Flower's peak RSS per task it holds (every task so far: fewer than its --max_tasks)
        "flower_rss": dict(zip(("slope", "fixed"), slope("flower_rss", "flower_tasks_seen"), strict=True)),
        "redis_idle_cpu_ms_per_s": 1e3 * redis_idle["redis_cpu_s"] / redis_idle["seconds"],
        "per_held": {"held": held["held"], "reap_pass_s": held["reap"]["seconds"],
                     "reap_commands": held["reap"]["commands"] / held["held"],
                     **{f"{part}_us": 1e6 * held[part]["redis_cpu_s"] / held["held"]
                        for part in ("renew", "reap", "zmscore")}},
        "ceilings": ceilings}
    summary["plan"] = plan(summary, big)
    return summary


def plan(summary: dict, run: dict) -> dict:
    """What 10M prompts on 100 hosts in a day needs, at the measured costs."""
    rate = TARGET_PROMPTS / DAY_S
    workers = WORKERS_PER_HOST * TARGET_HOSTS
    in_flight = TARGET_HOSTS * sum(IN_FLIGHT_PER_HOST.values())
    task_s = in_flight / rate  # Little's law, every slot busy
    past_ttl = in_flight * max(0.0, 1 - LEASE_TTL_S / task_s)  # ages spread evenly over a task's life
    idle, held = run["idle_per_s"], summary["per_held"]
    # The reaper lock (SET NX PX interval, kept until it expires: workers/delivery.py `reap_once`)
    # lets the fleet make one pass per interval, however many workers' timers ask (a pass that
    # lasts longer than the interval runs back to back with the next). A pass reads the candidates'
    # leases a thousand per ZMSCORE; its length scales from the measured pass (localhost).
    pass_s = past_ttl * held["reap_pass_s"] / held["held"]
    passes = min(1 / REAPER_INTERVAL_S, 1 / pass_s) if pass_s > 0 else 1 / REAPER_INTERVAL_S
    redis = {"completions": rate * run["redis_cpu_us_marginal"] / 1e6,
             # Idle workers: their commands per second (BLMOVE timeouts, heartbeats, beacons) at the
             # run's cost per command; their CPU difference with Redis alone is lost in its cron's.
             "idle_workers": workers * idle["commands"] * run["redis_cpu_us_marginal"] / run["commands_marginal"] / 1e6,
             "lease_renewals": in_flight / LEASE_HEARTBEAT_S * held["renew_us"] / 1e6,
             "reaper_passes": passes * past_ttl * held["reap_us"] / 1e6}
    fit = summary["queue_fit"]
    memory = {}
    for mix, tokens in TOKEN_MIXES.items():
        size = {pool: fit["a"] + fit["b"] * tokens[pool] for pool in tokens}
        memory[mix] = {"queued": sum(DEFAULT_QUEUE_DEPTH[p] * size[p] for p in size),
                       "in_flight": sum(TARGET_HOSTS * IN_FLIGHT_PER_HOST[p] * size[p] for p in size),
                       "retained": summary["retained"]["fixed"] + max(summary["retained"]["slope"], 0) * TARGET_PROMPTS}
    out = {"completions_per_s": rate, "workers": workers, "in_flight": in_flight, "task_s": task_s,
           "held_past_ttl": past_ttl, "reaper_pass_s": pass_s, "reaper_passes_per_s": passes,
           "reaper_cores_unserialised": workers / REAPER_INTERVAL_S * past_ttl * held["reap_us"] / 1e6,
           "redis_cores": redis, "redis_cores_total": sum(redis.values()), "memory_bytes": memory,
           "worker_cores_control": rate * run["cpu_ms_marginal"]["worker"] / 1e3}
    if "flower" in run["cpu_ms_marginal"]:
        per_event = run["cpu_ms_marginal"]["flower"] / 1e3 / max(run["task_events"], 1e-9)
        heartbeats = workers * idle["heartbeats"]
        heartbeat_bytes = idle["heartbeat_bytes"] / max(idle["heartbeats"], 1e-9)
        out["flower"] = {"events_per_s": rate * run["task_events"] + heartbeats, "heartbeats_per_s": heartbeats,
                         "bytes_per_s": rate * run["event_bytes"] + heartbeats * heartbeat_bytes,
                         "cores": rate * run["cpu_ms_marginal"]["flower"] / 1e3 + heartbeats * per_event,
                         "rss_at_max_tasks": summary["flower_rss"]["fixed"]
                         + summary["flower_rss"]["slope"] * FLOWER_MAX_TASKS}
    return out


def render(m: dict) -> str:
    """A plain-text summary for the terminal (docs/scaling.md has the full table)."""
    lines = ["| prompts | completions/s | Redis cmds/compl. (marginal) | Redis CPU µs/compl. (marginal) | "
             "worker CPU ms/task | Flower CPU ms/task | task events/task | run's keys left B | job occupancy |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in m["runs"]:
        cpu = r["cpu_ms_marginal"]
        lines.append(f"| {r['prompts']:,} | {r['completions_per_s']:,.0f} | {r['commands']:.1f} "
                     f"({r['commands_marginal']:.1f}) | {r['redis_cpu_us']:.0f} ({r['redis_cpu_us_marginal']:.0f}) | "
                     f"{cpu['worker']:.2f} | {cpu.get('flower', float('nan')):.2f} | {r['task_events']:.2f} | "
                     f"{r['retained_key_bytes']:,} | {r['job_occupancy']:.1%} |")
    big = m["runs"][-1]
    top = ", ".join(f"{name} {calls:.2f}" for name, calls in list(big["calls"].items())[:12])
    fit, held, plan_ = m["queue_fit"], m["per_held"], m["plan"]
    lines += ["", f"top commands per completion ({big['prompts']:,} run): {top}",
              f"queued prompt: {fit['a']:,.0f} B + {fit['b']:.2f} B/token (wire {fit['wire_b']:.2f} B/token)",
              f"enqueue: {m['enqueue_commands']:.2f} commands, {m['enqueue_redis_cpu_us']:.0f} µs Redis CPU per prompt",
              "retained per finished prompt beyond a fixed amount per run: " + "; ".join(
                  f"{name} {m[key]['slope']:.3f} B beyond {m[key]['fixed']:,.0f} B"
                  for name, key in (("used_memory", "retained"), ("with slowlog and histograms", "retained_with_fixed"),
                                    ("keys", "retained_keys"))),
              f"held message: renewal {held['renew_us']:.2f} µs, reaper check {held['reap_us']:.2f} µs "
              f"({held['reap_commands']:.2f} commands) of Redis CPU; a pass over {held['held']:,}: "
              f"{held['reap_pass_s']:.2f} s; as one ZMSCORE {held['zmscore_us']:.2f} µs per message",
              "ceilings: " + ", ".join(f"{k} {v:,.0f}" for k, v in m["ceilings"].items()),
              f"plan: {plan_['completions_per_s']:.1f} completions/s, {plan_['workers']} workers, "
              f"{plan_['held_past_ttl']:,.0f} of {plan_['in_flight']:,} held past the lease TTL; Redis cores "
              + ", ".join(f"{k} {v:.3f}" for k, v in plan_["redis_cores"].items())
              + f" = {plan_['redis_cores_total']:.2f}; reaper: a pass {plan_['reaper_pass_s']:.2f} s, "
              f"{plan_['reaper_passes_per_s']:.2f} passes/s ({plan_['reaper_cores_unserialised']:.2f} cores if "
              f"every worker's timer made a pass)"]
    if "flower" in plan_:
        f = plan_["flower"]
        lines.append(f"Flower: {f['events_per_s']:,.0f} events/s ({f['heartbeats_per_s']:,.0f} heartbeats), "
                     f"{f['bytes_per_s'] / 1e3:,.0f} KB/s, {f['cores']:.2f} cores, RSS at {FLOWER_MAX_TASKS:,} tasks "
                     f"{f['rss_at_max_tasks'] / 2**20:,.0f} MiB")
    for mix, mem in plan_["memory_bytes"].items():
        lines.append(f"Redis memory, {mix}: " + ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in mem.items()))
    return "\n".join(lines)


if __name__ == "__main__":  # re-derive the model from a run's raw figures: `python -m bench.control_model raw.json`
    import json
    import sys

    raw = json.loads(open(sys.argv[1]).read())
    print(render(summarise(raw)))
