"""`genfleet run` on one host against the seeds' single script: the same prompts and the same
simulated server (throughput.py's profile), each on a fresh simulator. Both clocks include start-up:
for `genfleet run`, from the command to its exit (embedded redis-server, both pools, the producer,
the last record fsynced, the pools and Redis stopped); for the script, from its start to its exit.
Also: the seconds from `genfleet run` to its first record on disk.

    .venv/bin/python -m bench.onebox [--quick] [--prompts N]
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from bench.processes import TOKENIZER, Processes, genfleet
from bench.prompts import write_prompts
from bench.throughput import POLL_S, RUN_TIMEOUT_S, SLOTS, Profile, chosen_profile, in_turn, run_baseline


def run_onebox(profile: Profile, prompts: Path) -> dict:
    """One `genfleet run`: its wall time, the time to its first record, prompts and tokens done."""
    with Processes(prefix="genfleet-bench-onebox-") as procs:
        _, sim_url = procs.start_sim("sim", profile.sim_flags())
        out = procs.dir / "output"
        env = {"GENFLEET_METRICS_PORT": "0", "GENFLEET_OUTPUT_DIR": str(out)}
        started = time.monotonic()
        job = procs.start("run", genfleet("run", "--run", "bench", "--upstream", sim_url, "--tokenizer", str(TOKENIZER),
                                          "--short-concurrency", str(SLOTS), "--max-new-tokens",
                                          str(profile.max_new_tokens), "--progress-every", "60", f"bench={prompts}"),
                          _without_redis_url(env))
        first_record = None
        while job.process.poll() is None:
            if first_record is None and _any_record(out / "bench"):
                first_record = time.monotonic() - started
            if time.monotonic() - started > RUN_TIMEOUT_S:
                raise TimeoutError(f"genfleet run not finished after {RUN_TIMEOUT_S:.0f} s:\n{job.tail()}")
            time.sleep(POLL_S)
        wall = time.monotonic() - started
        if job.process.returncode != 0:
            raise RuntimeError(f"genfleet run failed ({job.process.returncode}):\n{job.tail()}")
        records = [json.loads(line) for path in (out / "bench").rglob("*.jsonl")
                   for line in path.read_text().splitlines()]
        return {"wall_s": wall, "first_record_s": first_record if first_record is not None else wall,
                "prompts": len(records), "completion_tokens": sum(r["usage"]["completion_tokens"] for r in records)}


def _without_redis_url(env: dict[str, str]) -> dict[str, str]:
    """The bench's environment for the job: no GENFLEET_REDIS_URL, so it starts its embedded Redis."""
    return {**{k: v for k, v in os.environ.items() if k != "GENFLEET_REDIS_URL"}, **env}


def _any_record(directory: Path) -> bool:
    return any(path.stat().st_size > 0 for path in directory.rglob("*.jsonl*")) if directory.exists() else False


def compare(profile: Profile, workdir: Path, baseline_first: bool = False) -> dict:
    """Both on the same prompts; `baseline_first` alternates the order across repeats."""
    prompts = write_prompts(workdir / "prompts.jsonl", profile.prompts)
    onebox, baseline = in_turn(lambda: run_onebox(profile, prompts), lambda: run_baseline(profile, prompts),
                               baseline_first)
    if onebox["completion_tokens"] != baseline.completion_tokens:
        raise RuntimeError(f"different work: genfleet run {onebox['completion_tokens']:,} tokens, "
                           f"the script {baseline.completion_tokens:,}")
    return {"prompts": profile.prompts, "onebox_wall_s": onebox["wall_s"], "first_record_s": onebox["first_record_s"],
            "baseline_wall_s": baseline.wall_s, "wall_ratio": onebox["wall_s"] / baseline.wall_s,
            "completion_tokens": onebox["completion_tokens"]}


def main() -> None:
    import tempfile

    from bench.processes import interrupt_on_signals

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--prompts", type=int)
    args = parser.parse_args()
    interrupt_on_signals()
    profile = chosen_profile(args)
    with tempfile.TemporaryDirectory(prefix="genfleet-bench-") as tmp:
        print(json.dumps(compare(profile, Path(tmp)), indent=1))


if __name__ == "__main__":
    main()
