"""SGLang 0.5.23's own offline throughput path, on the real-server tier's plan: the ceiling the sweep
(bench/sweep.py) measures the fleet against. No HTTP and no client: every request handed to the
engine in one call, as SGLang's own benchmark does (0.5.23 `benchmark/offline_throughput.py`
`throughput_test_once`: `Engine(server_args=...)`, then one `backend.generate(prompt=[...],
sampling_params=[...])`, timed around that call). Here the prompts go in as the ids genfleet
published (`input_ids=`), so the plan, and so every completion, is the one the fleet's runs got.

    <sglang venv>/bin/python bench/sglang_offline.py REQUESTS.json OUT.json [SGLang's server flags]

Runs in the tier's SGLang venv with tests/sglang_real and its stand_ins on PYTHONPATH (the sweep
starts it so). The scheduler process is the tier's (`serve.run_scheduler_with_plan`): `Engine`'s
own `run_scheduler_process_func` field, which 0.5.23 `entrypoints/engine.py` keeps for "private
forks" to override. REQUESTS.json: [{"id", "input_ids", "max_new_tokens"}]. OUT.json: the wall time
of the generate call, its completion tokens, the scheduler's decode count over it (read as the
server's is) and each request's output ids.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

WARM_UP_REQUESTS = 4  # SGLang's benchmark warms up first too (`sample_random_requests`, then a generate)


class DecodeCounter:
    """(seconds, tokens decoded so far) every 0.25 s from the plan's counters file (the scheduler
    process rewrites it, GENFLEET_PLAN_COUNTERS): the same readings the sweep takes of the server."""

    def __init__(self) -> None:
        self.path = os.environ.get("GENFLEET_PLAN_COUNTERS", "")
        self.points: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def start(self) -> None:
        self.started = time.perf_counter()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _read(self) -> None:
        while not self._stop.wait(0.25):
            try:
                with open(self.path) as file:
                    decoded = json.load(file)["decoded_tokens"]
            except (OSError, ValueError, KeyError):
                continue
            self.points.append((time.perf_counter() - self.started, decoded))


def main(argv: list[str]) -> None:
    requests_path, out_path, *flags = argv
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    import serve  # the tier's: the plan's scheduler process
    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.server_args import prepare_server_args

    class PlanEngine(Engine):
        run_scheduler_process_func = staticmethod(serve.run_scheduler_with_plan)

    with open(requests_path) as file:
        requests = json.load(file)
    engine = PlanEngine(server_args=prepare_server_args(flags))
    try:
        engine.generate(input_ids=[r["input_ids"] for r in requests[:WARM_UP_REQUESTS]],
                        sampling_params=[{"temperature": 0, "max_new_tokens": 8}] * WARM_UP_REQUESTS)
        engine.flush_cache()
        counter = DecodeCounter()
        counter.start()
        started = time.perf_counter()
        outputs = engine.generate(input_ids=[r["input_ids"] for r in requests],
                                  sampling_params=[{"temperature": 0, "max_new_tokens": r["max_new_tokens"]}
                                                   for r in requests])
        wall_s = time.perf_counter() - started
        counter.stop()
    finally:
        engine.shutdown()
    result = {"wall_s": wall_s, "completion_tokens": sum(o["meta_info"]["completion_tokens"] for o in outputs),
              "decoded": counter.points,
              "outputs": {r["id"]: o["output_ids"] for r, o in zip(requests, outputs, strict=True)}}
    with open(out_path, "w") as file:
        json.dump(result, file)


if __name__ == "__main__":
    main(sys.argv[1:])
