"""The problems `genfleet status` puts in red: one line each, saying what is wrong and what to check.

Data quality (empty reasoning, truncation, loops) is judged per dataset once it has a few completions;
fleet health (errors, no progress, upstreams, no workers) per run.
"""
from __future__ import annotations

from dataclasses import dataclass

from genfleet.common.server_limits import server_limit
from genfleet.status.read_model import RunStatus

# Shares of a dataset's completions, once it has a few.
EMPTY_REASONING_ALARM = 0.05
TRUNCATION_ALARM = 0.10
# Degenerate repetition is rarer than truncation and each one can burn a whole max_new_tokens
# budget, so a lower share is already worth a look.
LOOP_ALARM = 0.02
ALARM_MIN_SAMPLES = 5
# Failed attempts (retried or not) over all attempts in the last 10 minutes, once there are a few.
ERROR_RATE_ALARM = 0.05
ERROR_MIN_ATTEMPTS = 10
# A fleet that finishes nothing for this long while prompts wait is stuck.
NO_PROGRESS_S = 600.0


@dataclass(frozen=True)
class AlarmSettings:
    no_progress_s: float = NO_PROGRESS_S
    error_rate: float = ERROR_RATE_ALARM
    truncation: float = TRUNCATION_ALARM
    loop: float = LOOP_ALARM


DEFAULT_ALARMS = AlarmSettings()


def alarms(status: RunStatus, settings: AlarmSettings = DEFAULT_ALARMS) -> list[str]:
    """One line per problem an operator must look at now."""
    return [*quality_alarms(status, settings), *fleet_alarms(status, settings)]


def quality_alarms(status: RunStatus, settings: AlarmSettings) -> list[str]:
    lines = []
    for row in status.datasets:
        d = row.progress
        if d.integrity:  # any at all: a server or proxy that corrupts streams corrupts data
            lines.append(f"{d.dataset}: {d.integrity:,} attempts failed the stream integrity check (ids, "
                         "completion_tokens and text disagreed; nothing was written, the prompts were retried): "
                         "check the upstream's streaming mode and any proxy between (worker logs name the host)")
        if d.done < ALARM_MIN_SAMPLES:
            continue
        # Counted only where the parser and template say the output starts in reasoning.
        if d.empty_reasoning / d.done > EMPTY_REASONING_ALARM:
            lines.append(f"{d.dataset}: {100 * d.empty_reasoning / d.done:.0f}% of completions have empty "
                         "reasoning on a reasoning model: check GENFLEET_REASONING_PARSER and that the "
                         "template's <think> is not lost (skip_special_tokens)")
        if d.truncated / d.done > settings.truncation:
            lines.append(f"{d.dataset}: {100 * d.truncated / d.done:.0f}% of completions stopped at "
                         "max_new_tokens (finish_reason length): raise the cap or expect cut-off answers")
        if d.looped / d.done > settings.loop:
            lines.append(f"{d.dataset}: {100 * d.looped / d.done:.1f}% of completions looped (finish_reason loop: "
                         f"the loop guard saw a degenerate repetition; {d.looped_tokens:,} completion tokens): "
                         "check the sampling (temperature, repetition penalty) and the chat template")
    return lines


def fleet_alarms(status: RunStatus, settings: AlarmSettings) -> list[str]:
    lines = []
    recent = status.totals.rates["10m"]
    attempts = recent.requests + recent.errors
    if recent.error_share is not None and attempts >= ERROR_MIN_ATTEMPTS and recent.error_share > settings.error_rate:
        worst = max(status.datasets, key=lambda row: row.rates["10m"].errors)
        lines.append(f"errors: {100 * recent.error_share:.0f}% of attempts failed in the last 10 min "
                     f"({recent.errors:.0f}, most in {worst.name}): see `genfleet failures --run {status.run}` "
                     "and the worker logs")
    pending = status.progress.totals().pending
    if pending:
        since = status.last_finished or status.created_at
        if since is not None and status.time - since > settings.no_progress_s:
            what = "no prompt finished" if status.last_finished else "no prompt has finished since enqueue"
            lines.append(f"no progress: {what} for {(status.time - since) / 60:.0f} min while {pending:,} "
                         "are pending: are workers running, and their upstreams answering? (Flower, worker logs)")
        if status.workers == 0:
            lines.append(f"no live worker (no beacon in the last 10 s) while {pending:,} prompts are pending: "
                         "start `genfleet worker --pool short|long --upstream URL`")
    lines += status.redis_problems  # no noeviction or no AOF: a restart or full memory loses prompts
    for problem in status.disk_problems:
        lines.append(f"worker {problem}: it takes no new prompts until it can write (free space, the "
                     "output volume, permissions); its prompts wait in the queue, nothing is dead-lettered")
    if status.lost_by:
        run = status.run
        lines.append(f"state lost: Redis no longer has run {run}, which worker {status.lost_by[0]} saw (a restart "
                     "without AOF, a failover, a flush?); its records are safe on disk. Run `genfleet recover --run "
                     f"{run} --from OUTPUT_DIR` on each host (or once with every host's directory), then re-run "
                     f"`genfleet enqueue --run {run}` with the same datasets: only the rows with no record are "
                     "generated (docs/running.md, \"If Redis lost its data\")")
    for worker, offset in sorted(status.skewed_clocks.items()):
        lines.append(f"clock: worker {worker}'s host is {abs(offset):.1f} s {'behind' if offset > 0 else 'ahead of'} "
                     "Redis: its leases are safe (they run on Redis's clock), but its rates, beacons and records' "
                     "timestamps are off; sync it (NTP; `genfleet doctor` checks it)")
    if lost := sum(status.unaccounted.values()):
        where = ", ".join(f"{dataset} {count:,}" for dataset, count in sorted(status.unaccounted.items()))
        lines.append(f"lost: {lost:,} prompts are neither queued, running, done, dead, rejected nor skipped "
                     f"({where}): their messages are gone; publish them again with `genfleet enqueue --run "
                     f"{status.run} --recover-lost DATASETS...`")
    for upstream in status.upstreams:
        if upstream.admission_bound and (load := upstream.load) is not None:
            lines.append(f"admission-bound: {upstream.url} has {load.waiting} requests waiting at "
                         f"{load.token_usage:.0%} KV use: the caps reserve the KV cache (SGLang admits a request "
                         "only with room for its max_new_tokens); enqueue with --first-max-new-tokens auto, "
                         "and run workers with --in-flight auto (docs/running.md)")
        if upstream.load is not None and (limit := server_limit(upstream.load)) is not None:
            lines.append(limit.line(upstream.url))
        if upstream.down_in:
            lines.append(f"upstream {upstream.url} is down (circuit open in {upstream.down_in} of "
                         f"{upstream.workers} workers using it): its requests wait or go to other hosts; "
                         "check the SGLang server and its /health")
    return lines
