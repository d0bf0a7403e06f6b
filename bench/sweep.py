"""The operating point, swept on each server's own engine (sections 13 and 14 of `make bench`): a fixed
in-flight per host of 32, 64, 128, 150, 256 and 400 against `--in-flight auto`, on two workload
shapes and two KV provisions, each beside the engine's own offline throughput on the same prompts;
then a server whose running cap holds the batch, named by `status`, and restarted as it advises.
This module is the sweep and its SGLang 0.5.23 half (section 13); bench/sweep_vllm.py is vLLM
0.32.0's (section 14), through the same cells, modes and report.

    .venv/bin/python bench/run.py --only sweep --into-existing [--quick]      (both halves)
    .venv/bin/python bench/run.py --only sweep-sglang|sweep-vllm --into-existing
    .venv/bin/python -m bench.sweep_halves [--quick] [--repeats 2] [--server sglang|vllm]  (as JSON)

SGLang's half: the server, its step-time model and the seeds' length shape are bench/admission.py's
(read its docstring: the forward patch sleeps 30 ms + 0.1 ms per request + 20 us per prefilled
token, so a bigger batch pays as it does on a GPU; the admission, waiting and retraction are
SGLang's own). The server runs with `--max-running-requests` 500, above every mode, so only the KV
cache and the client decide the batch.

- **workloads**: the seeds' lengths (lognormal, median 646, mean 1,416, cap 10,240, all scaled by
  1/8) and short chat replies (median ~250 tokens, cap 1,024, scaled alike).
- **provisions**: KV-limited (`--max-total-tokens 12,000`: the full cap admits ~40 of 150) and
  over-provisioned (220,000: room for ~400).
- **modes**: each fixed point, `--in-flight auto` as it ships (under the short pool's 150) and
  with its ceiling raised to 400 (the user's choice: `--concurrency 400`).
- **repeats** (both halves): the modes of a cell run one after the other on one server (its prefix
  cache flushed between), in order and then in reverse, `repeats` times: a drift of the machine
  falls on every mode alike. Each cell's figure is the median, the spread min-max.
- **the ceiling**: the same prompt ids through SGLang's own offline path (bench/sglang_offline.py:
  `Engine.generate` with every request at once, as 0.5.23 `benchmark/offline_throughput.py`
  does), with the same server flags, once per cell after the server runs.
- **records**: every run's output ids against the first fixed-150 run's, and the offline ones too.
- **the server's cap**: the same server with `--max-running-requests 8`, auto as it ships; `genfleet
  status --json` polled until its alarm names the flag; the server restarted with the cap the
  advice gives (twice it) and the same prompts again; each cap `repeats` times, alternately first.
"""
from __future__ import annotations

import json
import math
import os
import random
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Protocol

from bench import admission
from bench.processes import REPO, Processes, env_for, genfleet
from bench.real_tier import RUN_TIMEOUT_S, RealServer, sglang_venv, tier_model, write_rows

FIXED_POINTS = (32, 64, 128, 150, 256, 400)
SHIPPED_CEILING = 150  # the short pool's size (the card's): auto works under it unless raised
RAISED_CEILING = 400
CHAT_CAP = round(1024 * admission.LENGTH_SCALE)  # 128
LOW_RUNNING_CAP = 8
ALARM_PREFIX = "server-limited:"


@dataclass(frozen=True)
class Mode:
    name: str
    auto: bool
    in_flight: int  # the fixed point, or auto's ceiling


MODES = (*(Mode(f"fixed {n}", False, n) for n in FIXED_POINTS), Mode("auto", True, SHIPPED_CEILING),
         Mode(f"auto, ceiling {RAISED_CEILING}", True, RAISED_CEILING))
REFERENCE = "fixed 150"


@dataclass(frozen=True)
class Profile:
    seeds_prompts: int = 120
    chat_prompts: int = 240
    remedy_prompts: int = 160
    repeats: int = 2


FULL = Profile()
QUICK = replace(FULL, seeds_prompts=24, chat_prompts=40, remedy_prompts=30, repeats=1)


@dataclass(frozen=True)
class Workload:
    rows: Callable[[int], list[dict]]
    count: Callable[[Profile], int]
    max_new_tokens: int
    stem: str  # its files' names


class Server(Protocol):
    """One server of a half, started and healthy: what a cell needs of it."""
    url: str
    counters: Path | None  # SGLang's plan counters; None where its /metrics has them (vLLM)

    def flush_cache(self) -> None: ...

    def stop(self) -> None: ...


class Half(Protocol):
    """One server kind's half of the sweep: its servers, its offline engine, its shapes."""
    key: str  # "sglang", "vllm": the report's and `--server`'s name
    title: str  # "SGLang 0.5.23"
    kind: str  # bench/admission.py run_one's
    cap_flag: str  # the server's running cap
    running_cap: int  # above every mode: the KV cache and the client decide the batch
    provisions: Mapping[str, tuple[str, ...]]  # name -> the server's KV flags
    workloads: Mapping[str, Workload]
    enqueue_args: tuple[str, ...]
    remedy_rows: Callable[[int], list[dict]]
    remedy_provision: str

    def models(self, tmp: Path) -> dict[str, Path]: ...  # per workload, and "remedy"

    def provenance(self, outcome: dict) -> str: ...  # the section's words on the server, its model and flags

    def start(self, procs: Processes, model: Path, provision: str, running_cap: int, name: str) -> Server: ...

    def offline(self, procs: Processes, model: Path, requests: Path, provision: str) -> dict: ...


def describe(profile: Profile, half: Half) -> str:
    workloads = " and ".join(f"{workload.count(profile)} prompts of {name}"
                             for name, workload in half.workloads.items())
    return (f"{workloads}, x {len(MODES)} modes x {len(half.provisions)} provisions, {profile.repeats} repeat(s) each "
            f"way; the server's cap: {profile.remedy_prompts} chat prompts at `{half.cap_flag} {LOW_RUNNING_CAP}` "
            f"and {2 * LOW_RUNNING_CAP}")


def server_flags(half: Half, provision: str, running_cap: int) -> tuple[str, ...]:
    """The flags a cell's server runs with (and its offline engine): the provision's and the cap."""
    return (*half.provisions[provision], half.cap_flag, str(running_cap))


def chat_rows(count: int, seed: int = 5) -> list[dict]:
    """Short chat replies: lognormal around 250 tokens (sigma 0.6), cap 1,024, scaled as the seeds'
    shape is, with a few reasoning tokens (the tier's template always opens a think block)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        length = min(CHAT_CAP, max(4, round(rng.lognormvariate(math.log(250), 0.6) * admission.LENGTH_SCALE)))
        out.append({"id": f"c{i:05d}", "messages": [
            {"role": "user", "content": f"chat {i}: a short answer, please [plan len={length} think=4]"}]})
    return out


# -- SGLang's half: its server and its offline twin -------------------------------------------------

def _server_env(counters: Path) -> dict[str, str]:
    return {"GENFLEET_PLAN_COUNTERS": str(counters), "GENFLEET_PLAN_STEP_S": ",".join(map(str, admission.STEP_S)),
            **admission.sglang_variables()}


class SGLangServer:
    def __init__(self, procs: Processes, model: Path, flags: tuple[str, ...], name: str) -> None:
        self.process = RealServer(sglang_venv(), model, *flags, "--enable-cache-report", name=name,
                                  env=_server_env(procs.dir / f"counters-{name}.json")).spawn().wait_healthy()
        self.url = self.process.url
        self.counters: Path | None = Path(self.process.extra_env["GENFLEET_PLAN_COUNTERS"])

    def flush_cache(self) -> None:
        self.process.flush_cache()

    def stop(self) -> None:
        self.process.stop()


class SGLangHalf:
    key, title, kind = "sglang", "SGLang 0.5.23", "real"
    cap_flag = "--max-running-requests"
    running_cap = 500
    provisions = {name: ("--max-total-tokens", str(tokens)) for name, tokens in admission.SHAPES.items()}
    workloads = {
        "seeds' lengths": Workload(admission.rows, lambda p: p.seeds_prompts, admission.FULL_CAP, "seeds"),
        "short chat": Workload(chat_rows, lambda p: p.chat_prompts, CHAT_CAP, "chat"),
    }
    # The plans end every completion under its cap; a cut one is continued, as a job's would be.
    enqueue_args = ("--on-truncated", "continue")
    remedy_provision = "over-provisioned"

    @staticmethod
    def remedy_rows(count: int) -> list[dict]:
        return chat_rows(count, seed=9)

    @staticmethod
    def provenance(outcome: dict) -> str:
        return _sglang_provenance(outcome)

    def models(self, tmp: Path) -> dict[str, Path]:
        model = tier_model.build(tmp / "model")
        return {**{name: model for name in self.workloads}, "remedy": model}

    def start(self, procs: Processes, model: Path, provision: str, running_cap: int, name: str) -> Server:
        return SGLangServer(procs, model, server_flags(self, provision, running_cap), name)

    def offline(self, procs: Processes, model: Path, requests: Path, provision: str) -> dict:
        """SGLang's offline path on the same ids and flags (bench/sglang_offline.py)."""
        import server as tier_server  # the tier's, on sys.path through bench.real_tier

        out = procs.dir / f"offline-{requests.stem}.json"  # a cell has a directory of its own
        # Never spawned: the server's own environment (its venv, PYTHONPATH, threads, plan) for the engine.
        twin = RealServer(sglang_venv(), model, name="offline", env=_server_env(procs.dir / "counters-offline.json"))
        command = [str(twin.venv / "bin" / "python"), str(REPO / "bench" / "sglang_offline.py"), str(requests),
                   str(out), "--model-path", str(model), *tier_server.CPU_ENGINE, *tier_server.DEFAULT_FLAGS,
                   *server_flags(self, provision, self.running_cap)]
        return run_offline_script(command, {**os.environ, **twin.environment()}, out, "SGLang")


def run_offline_script(command: list[str], env: dict[str, str], out: Path, engine: str) -> dict:
    """An offline engine's script (bench/sglang_offline.py, bench/vllm_offline.py), and its figures:
    tok/s over the wall, and the steady decode rate read as a server's is."""
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if result.returncode != 0:
        raise RuntimeError(f"{engine}'s offline engine failed ({result.returncode}): {result.stderr[-2000:]}")
    figures = json.loads(out.read_text())
    figures["tokens_per_s"] = figures["completion_tokens"] / figures["wall_s"]
    figures["decode_rate"] = admission.steady_decode_rate([tuple(point) for point in figures.pop("decoded")])
    return figures


def offline_requests(path: Path, model: Path, rows: list[dict], max_new_tokens: int) -> Path:
    """The rows as the producer publishes them (its own templating, genfleet/common/tokenizer.py),
    for the offline engine."""
    from genfleet.common.tokenizer import load_tokenizer, render_prompts
    from genfleet.producer.prompts import prompt_id

    ids = render_prompts(load_tokenizer(model), [row["messages"] for row in rows])
    # Named as the records are (admission.run_one enqueues the rows as dataset "d").
    path.write_text(json.dumps([{"id": prompt_id("d", row, number), "input_ids": row_ids,
                                 "max_new_tokens": max_new_tokens}
                                for number, (row, row_ids) in enumerate(zip(rows, ids, strict=True))]))
    return path


# -- one cell ---------------------------------------------------------------------------------------

def measure_cell(half: Half, procs: Processes, redis_url: str, model: Path, rows_path: Path, count: int,
                 max_new_tokens: int, provision: str, repeats: int, requests: Path,
                 log: Callable[[str], None]) -> dict:
    runs: dict[str, list[dict]] = {mode.name: [] for mode in MODES}
    server = half.start(procs, model, provision, half.running_cap, f"sweep-{half.key}-{provision}")
    try:
        for repeat in range(repeats):
            for mode in (MODES if repeat % 2 == 0 else MODES[::-1]):
                server.flush_cache()
                run = f"sw{provision[:2]}r{repeat}{mode.name.replace(' ', '').replace(',', '')}"
                side = admission.run_one(procs, redis_url, half.kind, server.url, server.counters, model, rows_path,
                                         count, admission.Config(mode.name, staged=False, auto=mode.auto), run,
                                         concurrency=mode.in_flight, max_new_tokens=max_new_tokens,
                                         enqueue_args=half.enqueue_args)
                log(f"    {mode.name}: steady {side['decode_rate']:,.0f} tok/s, wall {side['tokens_per_s']:,.0f}, "
                    f"running {side['running']:.0f}, waiting {side['waiting']:.0f}")
                runs[mode.name].append(side)
    finally:
        server.stop()
    offline = half.offline(procs, model, requests, provision)
    log(f"    {half.title} offline: steady {offline['decode_rate']:,.0f} tok/s, wall {offline['tokens_per_s']:,.0f}")
    return summarize_cell(runs, offline)


def summarize_cell(runs: dict[str, list[dict]], offline: dict) -> dict:
    """Per mode: the median steady rate (the server's decode rate from 10% to 80% of what it decoded:
    a 50-hour job is all steady state; a run of a few hundred prompts ends in one long completion's
    tail, which no client setting shortens) and its spread, the wall tok/s, the server's figures, its
    records against the reference's; the cell's ratios, steady and wall."""
    reference = runs[REFERENCE][0]["outputs"]
    modes: dict[str, dict] = {}
    for name, sides in runs.items():
        steady = [side["decode_rate"] for side in sides]
        identical = min(sum(1 for rid, ids in side["outputs"].items() if ids is not None and ids == reference.get(rid))
                        for side in sides)
        modes[name] = {
            "decode_rate": statistics.median(steady), "min": min(steady), "max": max(steady),
            "tokens_per_s": statistics.median(side["tokens_per_s"] for side in sides),
            "running": statistics.median(side["running"] for side in sides),
            "waiting": statistics.median(side["waiting"] for side in sides),
            "token_usage": statistics.median(side["token_usage"] for side in sides),
            "retracted": max(side["retracted_peak"] for side in sides),
            "decoded_twice": max(side["decoded_twice"] for side in sides),
            "records": sides[0]["records"], "identical": identical,
            "target_over_time": sides[0]["target_over_time"]}
    fixed = {name: figures for name, figures in modes.items() if name.startswith("fixed")}
    best = max(fixed, key=lambda name: fixed[name]["decode_rate"])
    offline_outputs = offline.pop("outputs")
    offline_identical = sum(1 for rid, ids in offline_outputs.items() if ids == reference.get(rid))
    ratios = {}
    for auto in (m.name for m in MODES if m.auto):
        rate, wall = modes[auto]["decode_rate"], modes[auto]["tokens_per_s"]
        ratios[auto] = {"best_fixed": rate / fixed[best]["decode_rate"],
                        "fixed_150": rate / modes[REFERENCE]["decode_rate"],
                        "offline": rate / offline["decode_rate"] if offline["decode_rate"] else 0.0,
                        "best_fixed_wall": wall / fixed[best]["tokens_per_s"],
                        "fixed_150_wall": wall / modes[REFERENCE]["tokens_per_s"],
                        "offline_wall": wall / offline["tokens_per_s"]}
    return {"modes": modes, "best_fixed": best, "ratios": ratios,
            "offline": {**offline, "identical": offline_identical, "records": len(offline_outputs)}}


# -- the server's own cap, named and raised ---------------------------------------------------------

class AlarmWatch:
    """`genfleet status --run R --json` every 2 s while a run goes: the first server-limited alarm,
    and when it came."""

    def __init__(self, env: dict[str, str], run: str) -> None:
        self.env, self.run = env, run
        self.line: str | None = None
        self.after_s: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> AlarmWatch:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while self.line is None and not self._stop.wait(2.0):
            result = subprocess.run(genfleet("status", "--run", self.run, "--json"), env=self.env,
                                    capture_output=True, text=True, timeout=60)
            try:
                alarms = json.loads(result.stdout).get("alarms", [])
            except ValueError:
                continue
            found = next((line for line in alarms if line.startswith(ALARM_PREFIX)), None)
            if found:
                self.line, self.after_s = found, time.monotonic() - self.started


def measure_remedy(half: Half, procs: Processes, redis_url: str, model: Path, rows_path: Path, count: int,
                   repeats: int, log: Callable[[str], None]) -> dict:
    """Auto as it ships against a server capped at LOW_RUNNING_CAP, then against the same server
    restarted with the cap the alarm advises: tok/s after ÷ before (medians), and the alarm's line.
    `repeats` times each, the two caps alternately first and second, as a cell's modes run: one run
    each moved 1.43x on vLLM's CPU engine once (section 14 at 79927d7) and 1.01x the next (at 866b673)."""
    runs: dict[int, list[dict]] = {LOW_RUNNING_CAP: [], 2 * LOW_RUNNING_CAP: []}
    workload = half.workloads["short chat"]
    for repeat in range(repeats):
        caps = (LOW_RUNNING_CAP, 2 * LOW_RUNNING_CAP)
        for cap in (caps if repeat % 2 == 0 else caps[::-1]):
            server = half.start(procs, model, half.remedy_provision, cap, f"cap-{cap}-{repeat}")
            run = f"cap{cap}r{repeat}"
            try:
                watch = AlarmWatch(env_for(redis_url, procs.dir / f"output-{run}"), run)
                with watch:
                    side = admission.run_one(procs, redis_url, half.kind, server.url, server.counters, model,
                                             rows_path, count, admission.Config("auto", staged=False, auto=True), run,
                                             concurrency=SHIPPED_CEILING, max_new_tokens=workload.max_new_tokens,
                                             enqueue_args=half.enqueue_args)
            finally:
                server.stop()
            side.update(alarm=watch.line, alarm_after_s=watch.after_s)
            log(f"    {half.cap_flag} {cap}: steady {side['decode_rate']:,.0f} tok/s, wall "
                f"{side['tokens_per_s']:,.0f}, running {side['running']:.0f}, "
                f"waiting {side['waiting']:.0f}; alarm: {watch.line or 'none'}")
            runs[cap].append(side)
    low_runs, raised_runs = runs[LOW_RUNNING_CAP], runs[2 * LOW_RUNNING_CAP]
    reference = low_runs[0]["outputs"]
    identical = min(sum(1 for rid, ids in side["outputs"].items() if ids == reference.get(rid))
                    for side in low_runs + raised_runs)
    low, raised = remedy_side(low_runs), remedy_side(raised_runs)
    return {"low_cap": LOW_RUNNING_CAP, "raised_cap": 2 * LOW_RUNNING_CAP, "cap_flag": half.cap_flag,
            "repeats": repeats, "low": low, "raised": raised,
            "ratio": raised["decode_rate"] / low["decode_rate"],
            "wall_ratio": raised["tokens_per_s"] / low["tokens_per_s"], "identical": identical}


def remedy_side(sides: list[dict]) -> dict:
    """One cap's runs: the medians and the spread of the steady rate; the alarm of the run that
    raised it soonest, and how many of the runs raised one."""
    steady = [side["decode_rate"] for side in sides]
    alarmed = [side for side in sides if side["alarm"]]
    first = min(alarmed, key=lambda side: side["alarm_after_s"]) if alarmed else None
    return {"decode_rate": statistics.median(steady), "min": min(steady), "max": max(steady),
            **{key: statistics.median(side[key] for side in sides)
               for key in ("tokens_per_s", "running", "waiting", "token_usage")},
            "records": sides[0]["records"], "alarm": first["alarm"] if first else None,
            "alarm_after_s": first["alarm_after_s"] if first else None,
            "alarmed": f"{len(alarmed)} of {len(sides)}"}


# -- the whole sweep --------------------------------------------------------------------------------

def measure(profile: Profile, half: Half, log: Callable[[str], None] = print) -> dict:
    outcome: dict = {"server": half.title, "server_key": half.key, "cap_flag": half.cap_flag,
                     "running_cap": half.running_cap, "profile": asdict(profile), "workload": describe(profile, half),
                     "step_s": admission.STEP_S, "cells": {}}
    outcome["provenance"] = half.provenance(outcome)
    with tempfile.TemporaryDirectory(prefix=f"genfleet-bench-sweep-{half.key}-") as tmp_name:
        tmp = Path(tmp_name)
        models = half.models(tmp)
        paths = {}
        for name, workload in half.workloads.items():
            rows = workload.rows(workload.count(profile))
            paths[name] = (write_rows(tmp / f"{workload.stem}.jsonl", rows),
                           offline_requests(tmp / f"{workload.stem}-requests.json", models[name], rows,
                                            workload.max_new_tokens))
        for name, workload in half.workloads.items():
            for provision in half.provisions:
                flags = " ".join(server_flags(half, provision, half.running_cap))
                log(f"  sweep on {half.title}: {name}, {provision} ({flags})")
                with Processes(prefix=f"genfleet-bench-sweep-{half.key}-") as procs:
                    _, redis_url = procs.start_redis()
                    rows_path, requests = paths[name]
                    cell = measure_cell(half, procs, redis_url, models[name], rows_path, workload.count(profile),
                                        workload.max_new_tokens, provision, profile.repeats, requests, log)
                outcome["cells"][f"{name}, {provision}"] = {"flags": flags,
                                                            "max_new_tokens": workload.max_new_tokens, **cell}
        log(f"  the server's cap: {half.cap_flag} {LOW_RUNNING_CAP}, then as advised")
        with Processes(prefix=f"genfleet-bench-sweep-{half.key}-cap-") as procs:
            _, redis_url = procs.start_redis()
            remedy_rows = write_rows(tmp / "remedy.jsonl", half.remedy_rows(profile.remedy_prompts))
            outcome["remedy"] = measure_remedy(half, procs, redis_url, models["remedy"], remedy_rows,
                                               profile.remedy_prompts, profile.repeats, log)
    return outcome


# -- the report's sections --------------------------------------------------------------------------

HEADINGS = {"sglang": "## The operating point: a sweep on SGLang's own server (section 13)",
            "vllm": "## The operating point: a sweep on vLLM's own server (section 14)"}
SECTIONS = {"sglang": "13", "vllm": "14"}
HEADING = HEADINGS["sglang"]


def _sglang_provenance(outcome: dict) -> str:
    fixed_s, per_request, per_token = outcome["step_s"]
    return (f"on SGLang {outcome['server'].split()[-1]}'s own server (the real-server tier's CPU engine, the forward "
            f"pass replaced by the plan; a step sleeps {fixed_s * 1000:g} ms + {per_request * 1000:g} ms per request "
            f"+ {per_token * 1e6:g} µs per prefilled token: a model of a GPU step, bench/admission.py); "
            f"{outcome['workload']}. `--max-running-requests {outcome['running_cap']}`: only the KV cache and the "
            "client bound the batch. Running, waiting, usage: `/v1/loads` over the middle 80% of the run; "
            "offline: the same prompt ids through SGLang's own offline path (`Engine.generate`, every request at "
            "once, as `sglang.benchmark.offline_throughput` does), same flags.")


def section_lines(outcome: dict, date: str, commit: str) -> list[str]:
    key = outcome.get("server_key", "sglang")
    provenance = outcome.get("provenance") or _sglang_provenance(outcome)  # a report from before the halves
    repeats = outcome["profile"]["repeats"]
    title = outcome["server"].split()[0]
    lines = [HEADINGS[key], "",
             f"Measured {date} at commit {commit} {provenance} A cell's modes ran on one server "
             f"{repeats} time(s), alternately in order and reversed (its prefix cache flushed between runs); steady "
             "tok/s: the server's own decode count from 10% to 80% of what it decoded (median, min–max): what a "
             "long job runs at, where the modes are judged (a run of a few hundred prompts ends in one long "
             "completion's tail, which no client setting shortens); wall tok/s: the records' completion tokens ÷ "
             "wall; identical: records equal, token for token, to the first fixed-150 run's.", ""]
    for name, cell in outcome["cells"].items():
        offline = cell["offline"]
        lines += [f"**{name}** (`{cell['flags']}`, max_new_tokens {cell['max_new_tokens']:,})", "",
                  "| mode | steady tok/s | min – max | wall tok/s | running | waiting | KV use | "
                  f"{'preempted' if key == 'vllm' else 'retracted'} | decoded twice | identical | target over time |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for mode, m in cell["modes"].items():
            best = " (best fixed)" if mode == cell["best_fixed"] else ""
            lines.append(f"| {mode}{best} | {m['decode_rate']:,.0f} | {m['min']:,.0f} – {m['max']:,.0f} | "
                         f"{m['tokens_per_s']:,.0f} | "
                         f"{m['running']:.0f} | {m['waiting']:.0f} | {100 * m['token_usage']:.1f}% | "
                         f"{m['retracted']} | "
                         f"{m['decoded_twice']:,} | {m['identical']} of {m['records']} | "
                         f"{' '.join(f'{t}s:{v}' for t, v in m['target_over_time'][:10]) or '—'} |")
        lines.append(f"| {title} offline (no HTTP, no client) | {offline['decode_rate']:,.0f} | | "
                     f"{offline['tokens_per_s']:,.0f} | | | | | | {offline['identical']} of {offline['records']} | |")
        lines.append("")
        for auto, r in cell["ratios"].items():
            lines.append(f"- {auto}, steady (wall): ÷ best fixed ({cell['best_fixed']}) **{r['best_fixed']:.2f}×** "
                         f"({r['best_fixed_wall']:.2f}×), ÷ fixed 150 **{r['fixed_150']:.2f}×** "
                         f"({r['fixed_150_wall']:.2f}×), ÷ engine offline {r['offline']:.2f}× "
                         f"({r['offline_wall']:.2f}×)")
        lines.append("")
    if remedy := outcome.get("remedy"):
        low, raised = remedy["low"], remedy["raised"]
        flag = remedy.get("cap_flag", "--max-running-requests")
        repeats = remedy.get("repeats", 1)
        runs = (f", each cap {repeats} time(s), alternately first and second (medians, min–max)"
                if repeats > 1 else "")
        lines += [f"**The server's cap**: {outcome['profile']['remedy_prompts']} short chat prompts, auto as it ships, "
                  f"over-provisioned KV{runs}. At `{flag} {remedy['low_cap']}`: "
                  f"{low['decode_rate']:,.0f} steady tok/s{_spread(low)}, running {low['running']:.0f}, waiting "
                  f"{low['waiting']:.0f}; "
                  f"`genfleet status` after {low['alarm_after_s'] or 0:.0f} s{_alarmed(low)}: "
                  f"`{low['alarm'] or 'no alarm'}`. "
                  f"Restarted with `{flag} {remedy['raised_cap']}`: {raised['decode_rate']:,.0f} "
                  f"steady tok/s{_spread(raised)}, running {raised['running']:.0f}, alarm: "
                  f"{raised['alarm'] or 'none'}. **Raised ÷ "
                  f"capped {remedy['ratio']:.2f}×** (wall {remedy['wall_ratio']:.2f}×); records identical "
                  f"{remedy['identical']} of {raised['records']}.", ""]
    return lines


def _spread(side: dict) -> str:
    return f" ({side['min']:,.0f} – {side['max']:,.0f})" if "min" in side and side["min"] != side["max"] else ""


def _alarmed(side: dict) -> str:
    if "alarmed" not in side:
        return ""
    return f" (the soonest; an alarm in {side['alarmed']} runs)" if side["alarm"] else f" (in {side['alarmed']} runs)"
