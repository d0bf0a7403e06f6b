"""Chaos: Redis loses its data mid-run (killed and started again without AOF or RDB: what a crash, a
failover that drops the last writes, a `FLUSHALL` or a pod rescheduled without its volume leave).
The shards are the truth: `status` says the state is lost and what to run, `genfleet recover`
settles every row that has a record, the re-run enqueue publishes only the rest, and export is
complete. Judged by the simulator's count of generations, not by our own counters."""
from __future__ import annotations

import json
import time

import pytest
from helpers.data import write_prompts
from helpers.fleet import Fleet
from helpers.redis_server import RedisServer
from helpers.sim_process import SimProcess
from helpers.waits import wait_until
from test_chaos import QUICK

from genfleet.common.keys import KOMBU_UNACKED

PROMPTS = 240
# ~1.5 s per completion at 30 tok/s, 30 at once: a third of the run done after ~6 s.
STEADY = ("--rate", "30", "--knee", "100000", "--length-median", "45", "--length-mean", "46")


def loss_alarms(fleet: Fleet, run: str) -> list[str]:
    status = fleet.genfleet("status", "--run", run, "--json", check=False)
    alarms = json.loads(status.stdout)["alarms"] if status.stdout.strip() else []
    return [alarm for alarm in alarms if alarm.startswith("state lost")]


@pytest.mark.parametrize("runbook", ["recover, then enqueue", "enqueue alone (one host)"])
def test_a_redis_that_lost_its_data_is_rebuilt_from_the_shards_and_nothing_done_is_generated_again(tmp_path, runbook):
    server = RedisServer(tmp_path / "redis")  # no AOF, no RDB: a restart starts empty
    server.start()
    try:
        with Fleet(server.url, tmp_path, **QUICK) as fleet, SimProcess(*STEADY) as sim:
            data = write_prompts(tmp_path / "w.jsonl", PROMPTS)
            worker = fleet.start_worker("short", sim.url, concurrency=30)
            fleet.enqueue("wipe", f"w={data}")
            wait_until(lambda: fleet.progress("wipe").totals().done >= PROMPTS // 3, timeout=90, interval=0.05)
            in_flight = fleet.redis.hlen(KOMBU_UNACKED)
            server.kill()
            server.start()
            wiped_at = time.monotonic()
            wait_until(lambda: loss_alarms(fleet, "wipe"), timeout=60, interval=1.0,
                       message="status never said the run's state was lost")
            alarm_s = time.monotonic() - wiped_at
            alarm = loss_alarms(fleet, "wipe")[0]
            on_disk = len({r["id"] for r in fleet.records("wipe")})
            # The runbook (docs/running.md, "If Redis lost its data"), as written: on one host the
            # enqueue recovers from its own output directory by itself.
            if runbook.startswith("recover"):
                recovered = fleet.genfleet("recover", "--run", "wipe", "--from", str(fleet.output_dir)).stdout
                assert "settled now" in recovered
            enqueue = fleet.enqueue("wipe", f"w={data}")
            enqueued = enqueue.stdout + enqueue.stderr
            assert "not in this Redis" in enqueued, enqueued  # either way the enqueue looks at its disk
            fleet.wait_finished("wipe", timeout=150)
            generations = sim.stats()["requests_started"]
            after = loss_alarms(fleet, "wipe")
            exited = worker.process.poll()
            export = fleet.genfleet("export", "--run", "wipe", "--from", str(fleet.output_dir), "--out",
                                    str(tmp_path / "export"), "--format", "specforge", check=False)
            records = fleet.records("wipe")
    finally:
        server.kill()
    ids = {r["id"] for r in records}
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    exported = [json.loads(line)["id"] for line in (tmp_path / "export" / "datasets" / "w.jsonl").open()]
    print(f"{runbook}: redis wiped at {on_disk} of {PROMPTS} on disk, {in_flight} in flight: {generations} "
          f"generations; loss alarm after {alarm_s:.1f} s; export exit {export.returncode}, {len(exported)} records")
    assert exited is None, "the worker exited"
    assert "genfleet recover --run wipe" in alarm
    assert alarm_s <= 30
    assert ids == {f"w/{i}" for i in range(PROMPTS)}  # nothing lost
    assert generations <= PROMPTS + in_flight, f"{generations - PROMPTS} prompts generated again"
    assert not after, "the alarm stays after the run was rebuilt"
    assert export.returncode == 0, export.stdout + export.stderr
    assert manifest["complete"] and manifest["verified"]
    assert sorted(exported) == sorted(ids)  # once each
