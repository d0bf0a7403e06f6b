"""Deployment rehearsed on this machine: two simulated hosts with a worker pair each, Flower with
auth, a third host joining mid-run and taking work at once, KEDA's inputs on the workers' /metrics;
and a pickle message on a queue, rejected and never executed while the worker carries on."""
from __future__ import annotations

import re
import time
import uuid
from collections import Counter

import httpx
from helpers.data import write_prompts
from helpers.deploy_files import K8S
from helpers.fleet import Fleet, WorkerProcess
from helpers.flower import FlowerProcess
from helpers.metrics import Sample, scrape
from helpers.pickles import LeavesATrace
from helpers.sim_process import ONE_SECOND, SimProcess, free_port
from helpers.waits import wait_until

from genfleet.common.queues import GENERATE_TASK, LONG, PARTITIONS, SHORT


def keda_work(scrapes: list[list[Sample]], partition: str) -> tuple[float, float]:
    """What keda.yaml's query computes, from the workers' own /metrics: (queue depth, in flight)."""
    depth = max(value for s in scrapes for name, labels, value in s
                if name == "genfleet_queue_depth" and labels["queue"] == partition)
    in_flight = sum(value for s in scrapes for name, labels, value in s
                    if name == "genfleet_tasks_in_flight" and labels["partition"] == partition)
    return depth, in_flight


class Hosts:
    """Worker pairs (one per pool) per simulated host, with small per-host caps to keep a backlog."""

    CAPS = {SHORT: 6, LONG: 2}

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.by_pid: dict[str, tuple[str, str]] = {}  # a record's worker ends in its pid -> (host, pool)
        self.metrics_ports: list[int] = []

    def start_pair(self, host: str, url: str) -> list[WorkerProcess]:
        started = []
        for pool in PARTITIONS:
            port = free_port()
            self.fleet.configure(metrics_port=port)
            worker = self.fleet.start_worker(pool, url, concurrency=self.CAPS[pool], wait=False)
            self.by_pid[str(worker.process.pid)] = (host, pool)
            self.metrics_ports.append(port)
            started.append(worker)
        return started

    def of(self, record: dict) -> tuple[str, str]:
        """(host, pool) of the worker that wrote `record`."""
        return self.by_pid[record["worker"].rsplit("-", 1)[1]]


def check_flower_lists_the_fleet(flower: FlowerProcess) -> None:
    """Flower with auth: refuses anonymous calls, lists the fleet's workers."""
    api = f"{flower.url}/api/workers"
    anonymous = wait_until(lambda: httpx.get(api, timeout=5).status_code, 30, 0.2, "Flower not answering",
                           ignore=(httpx.TransportError,))
    assert anonymous == 401
    listed = httpx.get(api, params={"status": "1"}, auth=flower.auth, timeout=15).raise_for_status().json()
    assert len(listed) >= 4, listed


def keda_tail(metrics_ports: list[int]) -> tuple[float, float]:
    """KEDA's inputs on the workers' /metrics: at the tail of the run the queue is empty while
    streams still run, and the scaled quantity must still count them."""
    query_names = set(re.findall(r"genfleet_\w+", (K8S / "keda.yaml").read_text()))

    def tail() -> tuple[float, float] | None:
        scrapes = [scrape(f"http://127.0.0.1:{port}") for port in metrics_ports]
        assert query_names <= {name for s in scrapes for name, _, _ in s}, \
            "keda.yaml asks for metrics no worker exports"
        depth, in_flight = keda_work(scrapes, SHORT)
        return (depth, in_flight) if depth == 0 and in_flight > 0 else None

    return wait_until(tail, 90, 0.2, "never saw an empty short queue with streams in flight")


def test_two_hosts_rehearsal_where_a_third_host_added_mid_run_takes_work_at_once(fleet, tmp_path):
    """Two simulated SGLang hosts with a worker pair each, one producer, one Redis, Flower with auth;
    a third host's pair joins mid-run. Small per-host caps keep a backlog long enough to watch."""
    short_data = write_prompts(tmp_path / "s.jsonl", 240, "a short question")
    long_data = write_prompts(tmp_path / "l.jsonl", 36, "a long question")
    hosts = Hosts(fleet)
    with SimProcess(*ONE_SECOND) as gpu1, SimProcess(*ONE_SECOND) as gpu2, SimProcess(*ONE_SECOND) as gpu3:
        flower = FlowerProcess(fleet, f"ops:{uuid.uuid4().hex}", wait=False)
        try:
            for worker in hosts.start_pair("gpu1", gpu1.url) + hosts.start_pair("gpu2", gpu2.url):
                worker.wait_ready()
            fleet.enqueue("rehearsal", f"s={short_data}", f"l={long_data}:long")
            # Mid-run, with the backlog still there: the fleet has started, far from done.
            wait_until(lambda: fleet.progress("rehearsal").totals().done >= 10, timeout=60)
            assert fleet.progress("rehearsal").totals().pending > 100
            joined_at = time.time()
            for worker in hosts.start_pair("gpu3", gpu3.url):
                worker.wait_ready()
            ready_at = time.time()
            check_flower_lists_the_fleet(flower)
            tail = keda_tail(hosts.metrics_ports)
            fleet.wait_finished("rehearsal", timeout=90)
        finally:
            flower.stop()

    records = fleet.records("rehearsal")
    ids = Counter(r["id"] for r in records)
    assert set(ids) == {f"s/{i}" for i in range(240)} | {f"l/{i}" for i in range(36)}
    urls = {"gpu1": gpu1.url, "gpu2": gpu2.url, "gpu3": gpu3.url}
    first_start: dict[str, float] = {}
    for record in records:
        host, pool = hosts.of(record)
        # Each pair streams only from its own host, each pool only from its own queue.
        assert record["upstream"] == urls[host], record["worker"]
        assert record["partition"] == pool
        first_start[host] = min(first_start.get(host, float("inf")), record["timing"]["started_at"])
    per_host = Counter(hosts.of(r)[0] for r in records)
    print(f"rehearsal: records per host {dict(per_host)}; third host joined {ready_at - joined_at:.1f} s "
          f"after start, first task {first_start['gpu3'] - ready_at:+.1f} s after ready; "
          f"KEDA work at the tail: queue {tail[0]:.0f} + in flight {tail[1]:.0f}")
    assert per_host["gpu3"] >= 20, per_host  # a fair share of what was left, not a straggler
    assert first_start["gpu3"] - ready_at < 3.0, "the third host did not take work at once"


def test_a_pickle_message_on_a_queue_is_rejected_never_executed_and_the_worker_carries_on(fleet, tmp_path):
    from kombu import Connection, Exchange, Producer
    from kombu.serialization import dumps, loads

    trace = tmp_path / "pickle-was-executed"
    task_id = str(uuid.uuid4())
    # A well-formed protocol-2 task message for genfleet's task, except for its pickle body.
    body = ((LeavesATrace(trace),), {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None})
    headers = {"lang": "py", "task": GENERATE_TASK, "id": task_id, "root_id": task_id, "parent_id": None,
               "group": None, "retries": 0, "eta": None, "expires": None, "argsrepr": "(...)",
               "kwargsrepr": "{}", "origin": "attacker@nowhere"}

    # The payload is live: wherever pickle is accepted, merely decoding it leaves the trace.
    control = tmp_path / "control"
    content_type, encoding, data = dumps(((LeavesATrace(control),), {}, {}), serializer="pickle")
    assert content_type == "application/x-python-serialize"
    loads(data, content_type, encoding, accept={content_type})
    assert control.exists()

    with SimProcess(*ONE_SECOND) as sim:
        fleet.configure(metrics_port=0)
        worker = fleet.start_worker(SHORT, sim.url, concurrency=2)
        with Connection(fleet.redis_url) as connection:
            Producer(connection).publish(body, exchange=Exchange(SHORT, type="direct"), routing_key=SHORT,
                                         serializer="pickle", headers=headers)
        wait_until(lambda: "ContentDisallowed" in worker.log.read_text(errors="replace"), timeout=30,
                   message="the worker never refused the pickle message")
        # Then a normal prompt, through the same queue and worker.
        data_file = write_prompts(tmp_path / "after.jsonl", 1, "a normal question")
        fleet.enqueue("after-pickle", f"after={data_file}")
        progress = fleet.wait_finished("after-pickle", timeout=60)

    log = worker.log.read_text(errors="replace")
    assert "Refusing to deserialize untrusted content of type pickle" in log
    assert not trace.exists(), "the pickle payload was deserialised by the worker"
    assert progress.totals().done == 1
    assert f"{GENERATE_TASK}[{task_id}] received" not in log, "the pickle task reached the pool"
    # Discarded, not parked: nothing of it left in the queue or among unacknowledged messages.
    assert fleet.redis.llen(SHORT) == 0
    assert not any(task_id.encode() in value for value in fleet.redis.hvals("unacked"))
    assert worker.process.poll() is None, "the worker died"
