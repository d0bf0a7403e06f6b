"""The task body in process: a worker's runtime built from its `Settings` as `genfleet worker`
builds it (real Redis, real shard files, the real HTTP client), with no Celery worker around it, and
a simulated server on a real socket in a thread of this process. Most task-level behaviour needs no
process boundary: this is the fast tier's stand-in for a worker, as dramatiq's stub broker is its
tests' (what needs a process, kills, signals, Celery delivery, Flower, stays in tests/e2e/)."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from genfleet.common.records import TaskPayload
from genfleet.common.settings import Settings
from genfleet.common.tokenizer import render_prompts
from genfleet.sim.server import SimServer
from genfleet.workers import tasks
from genfleet.workers.runtime import WorkerRuntime
from helpers.paths import TOKENIZER
from helpers.sim_in_process import parse_sim_args
from helpers.sim_process import free_port, sim_stats
from helpers.waits import wait_until


@dataclass(frozen=True)
class ThreadedSim:
    """A simulator served in a thread of this process: what a test reads of `SimProcess`, in process."""

    url: str
    server: SimServer

    def stats(self) -> dict[str, Any]:
        return sim_stats(self.url)


@contextmanager
def sim_on_a_socket(*flags: str) -> Iterator[ThreadedSim]:
    """`genfleet sim FLAGS`, served by uvicorn in a thread on a free loopback port."""
    server = SimServer(parse_sim_args(flags))
    config = uvicorn.Config(server, host="127.0.0.1", port=free_port(), log_level="warning", lifespan="off")
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, name="sim", daemon=True)
    thread.start()
    try:
        wait_until(lambda: running.started, 15, 0.02, "the simulator did not start")
        yield ThreadedSim(f"http://127.0.0.1:{config.port}", server)
    finally:
        running.should_exit = True
        thread.join(timeout=10)


@contextmanager
def worker_runtime(redis_url: str, output_dir: Path, *upstreams: str, **settings: Any) -> Iterator[WorkerRuntime]:
    """A short pool's runtime, as `genfleet worker` builds it, its background threads not started."""
    runtime = WorkerRuntime.build(Settings(redis_url=redis_url, output_dir=output_dir, upstreams=list(upstreams),
                                           pool="short", tokenizer=TOKENIZER, commit_interval_s=0.005,
                                           min_free_disk_mb=1, **settings))
    try:
        yield runtime
    finally:
        runtime.close()


def prompt_payload(tokenizer: Any, run: str, dataset: str, row: int, question: str, **fields: Any) -> TaskPayload:
    """The task the producer would publish for a one-question row (the template's ids, the default caps)."""
    messages = [{"role": "user", "content": question}]
    (ids,) = render_prompts(tokenizer, [messages])
    return TaskPayload(run=run, id=f"{dataset}/{row}", dataset=dataset, row=row, partition="short",
                       prompt_tokens=len(ids), max_new_tokens=fields.pop("max_new_tokens", 200), messages=messages,
                       input_ids=ids, **fields)


def run_task(payload: TaskPayload, runtime: WorkerRuntime) -> tuple[dict[str, Any], list[TaskPayload]]:
    """The real task body on `payload`: what it returned, and the tasks it published (follow-ups)."""
    published: list[TaskPayload] = []
    result = tasks.complete(payload, runtime, lambda task, _note, **_: published.append(task))
    return result, published
