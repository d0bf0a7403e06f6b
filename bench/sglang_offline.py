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
of the generate call, its completion tokens and each request's output ids.
"""
from __future__ import annotations

import json
import os
import sys
import time

WARM_UP_REQUESTS = 4  # SGLang's benchmark warms up first too (`sample_random_requests`, then a generate)


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
        started = time.perf_counter()
        outputs = engine.generate(input_ids=[r["input_ids"] for r in requests],
                                  sampling_params=[{"temperature": 0, "max_new_tokens": r["max_new_tokens"]}
                                                   for r in requests])
        wall_s = time.perf_counter() - started
    finally:
        engine.shutdown()
    result = {"wall_s": wall_s, "completion_tokens": sum(o["meta_info"]["completion_tokens"] for o in outputs),
              "outputs": {r["id"]: o["output_ids"] for r, o in zip(requests, outputs, strict=True)}}
    with open(out_path, "w") as file:
        json.dump(result, file)


if __name__ == "__main__":
    main(sys.argv[1:])
