"""Local faults cost nothing: a disk that fills up mid-run, a silent stream at SIGTERM, the lease set
after a long run. Each test prints prompts in / done / dead / duplicated."""
from __future__ import annotations

import json
import time

from helpers.data import write_prompts
from helpers.sim_process import SimProcess
from helpers.tmpfs import fill, tmpfs
from helpers.waits import wait_until

from genfleet.common.keys import LEASES
from genfleet.common.run_state import RunState

QUICK = dict(lease_ttl_s=3, lease_heartbeat_s=0.5, reaper_interval_s=0.5, retry_backoff_s=0.2,
             retry_backoff_max_s=2, disk_wait_s=2)


def accounted(fleet, run: str, n: int, prefix: str) -> dict:
    records = fleet.records(run)
    done = {r["id"] for r in records}
    dead = set(RunState(fleet.redis, run).dead_letters())
    assert done | dead == {f"{prefix}/{i}" for i in range(n)}, "a prompt is missing"
    return {"in": n, "done": len(done), "dead": len(dead), "duplicated": len(records) - len(done)}


def test_a_disk_full_for_5_s_mid_run_dead_letters_nothing_and_loses_nothing(fleet, tmp_path):
    with tmpfs(tmp_path / "out", "8m") as out:
        fleet.output_dir = out
        fleet.configure(output_dir=out, min_free_disk_mb=1, **QUICK)
        data = write_prompts(tmp_path / "d.jsonl", 200)
        with SimProcess("--rate", "60", "--knee", "100000", "--length-median", "40", "--length-mean", "41") as sim:
            fleet.start_worker("short", sim.url, concurrency=40)
            fleet.enqueue("disk", f"d={data}")
            wait_until(lambda: fleet.progress("disk").totals().done >= 40, timeout=60)
            filler = fill(out)
            time.sleep(5)
            during = json.loads(fleet.genfleet("status", "--run", "disk", "--json").stdout)
            filler.unlink()
            fleet.wait_finished("disk", timeout=120)
        counts = accounted(fleet, "disk", 200, "d")
        export = fleet.genfleet("export", "--run", "disk", "--from", str(out), "--out", str(tmp_path / "export"),
                                "--format", "specforge")
    print(f"disk full 5 s: {counts}")
    assert counts["dead"] == 0 and counts["done"] == 200
    # The alarm names the worker and the path it cannot write.
    assert any(alarm.startswith("worker short-") and str(out) in alarm for alarm in during["alarms"]), during["alarms"]
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    assert manifest["complete"] and manifest["verified"], export.stdout + export.stderr


def test_sigterm_during_a_60_s_prefill_exits_within_the_grace_and_gives_the_prompt_back(fleet, tmp_path):
    fleet.configure(**{**QUICK, "shutdown_grace_s": 3})
    data = write_prompts(tmp_path / "p.jsonl", 1)
    # Prefill at 0.5 prompt tokens/s: the stream stays silent for about a minute.
    with SimProcess("--prefill-rate", "0.5", "--rate", "40") as sim:
        worker = fleet.start_worker("short", sim.url, concurrency=2)
        fleet.enqueue("prefill", f"p={data}")
        wait_until(lambda: sim.stats()["running"] >= 1, timeout=30, message="the prompt never reached the server")
        stopped_at = time.monotonic()
        worker.stop(timeout=30)
        exit_s = time.monotonic() - stopped_at
        wait_until(lambda: fleet.progress("prefill").queued["short"] == 1, timeout=30,
                   message="the prompt did not go back to its queue")
    print(f"sigterm during prefill: exited in {exit_s:.1f} s (grace 3 s)")
    assert exit_s < 3 + 5
    assert RunState(fleet.redis, "prefill").dead_letters() == {}


def test_the_lease_set_holds_only_messages_in_hand_after_2000_prompts(fleet, tmp_path):
    fleet.configure(**QUICK)
    data = write_prompts(tmp_path / "l.jsonl", 2000)
    with SimProcess("--rate", "4000", "--length-tokens", "5:30") as sim:
        fleet.start_worker("short", sim.url, concurrency=100)
        fleet.enqueue("leases", f"l={data}", extra=("--max-new-tokens-short", "64"))
        fleet.wait_finished("leases", timeout=180)
        in_flight = fleet.progress("leases").unacked
        leases = wait_until(lambda: (n := fleet.redis.zcard(LEASES)) <= in_flight and (n,), timeout=15,
                            message=lambda: f"{fleet.redis.zcard(LEASES)} leases left")[0]
    print(f"leases after 2,000 prompts: {leases} (in flight {in_flight})")
