"""The operating point, swept on SGLang 0.5.23's own server (section 13 of `make bench`): a fixed
in-flight per host of 32, 64, 128, 150, 256 and 400 against `--in-flight auto`, on two workload
shapes and two KV provisions, each beside the engine's own offline throughput on the same prompts;
then a server whose running cap holds the batch, named by `status`, and restarted as it advises.

    .venv/bin/python bench/run.py --only sweep --into-existing [--quick]
    .venv/bin/python -m bench.sweep [--quick] [--repeats 2]       (the figures as JSON)

The server, its step-time model and the seeds' length shape are bench/admission.py's (read its
docstring: the forward patch sleeps 30 ms + 0.1 ms per request + 20 us per prefilled token, so a
bigger batch pays as it does on a GPU; the admission, waiting and retraction are SGLang's own). The
server runs with `--max-running-requests` 500, above every mode, so only the KV cache and the
client decide the batch.

- **workloads**: the seeds' lengths (lognormal, median 646, mean 1,416, cap 10,240, all scaled by
  1/8) and short chat replies (median ~250 tokens, cap 1,024, scaled alike).
- **provisions**: KV-limited (`--max-total-tokens 12,000`: the full cap admits ~40 of 150) and
  over-provisioned (220,000: room for ~400).
- **modes**: each fixed point, `--in-flight auto` as it ships (under the short pool's 150) and
  with its ceiling raised to 400 (the user's choice: `--concurrency 400`).
- **repeats**: the modes of a cell run one after the other on one server (its radix cache flushed
  between), in order and then in reverse, `repeats` times: a drift of the machine falls on every
  mode alike. Each cell's figure is the median, the spread min-max.
- **the ceiling**: the same prompt ids through SGLang's own offline path (bench/sglang_offline.py:
  `Engine.generate` with every request at once, as 0.5.23 `benchmark/offline_throughput.py`
  does), with the same server flags, once per cell after the server runs.
- **records**: every run's output ids against the first fixed-150 run's, and the offline ones too.
- **the server's cap**: the same server with `--max-running-requests 8`, auto as it ships; `genfleet
  status --json` polled until its alarm names the flag; the server restarted with the cap the
  advice gives (twice it) and the same prompts again.
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
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bench import admission
from bench.processes import REPO, Processes, env_for, genfleet
from bench.real_tier import RUN_TIMEOUT_S, RealServer, sglang_venv, tier_model, write_rows

FIXED_POINTS = (32, 64, 128, 150, 256, 400)
SHIPPED_CEILING = 150  # the short pool's size (the card's): auto works under it unless raised
RAISED_CEILING = 400
SERVER_RUNNING_CAP = 500  # above every mode: the KV cache and the client decide the batch
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

    def describe(self) -> str:
        return (f"{self.seeds_prompts} prompts of the seeds' lengths and {self.chat_prompts} short chat prompts, "
                f"x {len(MODES)} modes x 2 provisions, {self.repeats} repeat(s) each way; the server's cap: "
                f"{self.remedy_prompts} chat prompts at --max-running-requests {LOW_RUNNING_CAP} and "
                f"{2 * LOW_RUNNING_CAP}")


FULL = Profile()
QUICK = replace(FULL, seeds_prompts=24, chat_prompts=40, remedy_prompts=30, repeats=1)


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


WORKLOADS: dict[str, tuple[Callable[[int], list[dict]], Callable[[Profile], int], int]] = {
    # name: (rows, how many, max_new_tokens)
    "seeds' lengths": (admission.rows, lambda p: p.seeds_prompts, admission.FULL_CAP),
    "short chat": (chat_rows, lambda p: p.chat_prompts, CHAT_CAP),
}


# -- the server and its offline twin ----------------------------------------------------------------

def _server_env(counters: Path) -> dict[str, str]:
    return {"GENFLEET_PLAN_COUNTERS": str(counters), "GENFLEET_PLAN_STEP_S": ",".join(map(str, admission.STEP_S)),
            **admission.sglang_variables()}


def _server_flags(total_tokens: int, running_cap: int) -> list[str]:
    return ["--max-total-tokens", str(total_tokens), "--max-running-requests", str(running_cap)]


def _start_server(procs: Processes, model: Path, total_tokens: int, running_cap: int, name: str) -> RealServer:
    server = RealServer(sglang_venv(), model, *_server_flags(total_tokens, running_cap), "--enable-cache-report",
                        name=name, env=_server_env(procs.dir / f"counters-{name}.json"))
    return server.spawn().wait_healthy()


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


def run_offline(procs: Processes, model: Path, requests: Path, total_tokens: int) -> dict:
    """SGLang's offline path on the same ids and flags (bench/sglang_offline.py)."""
    import server as tier_server  # the tier's, on sys.path through bench.real_tier

    out = procs.dir / f"offline-{requests.stem}-{total_tokens}.json"
    # Never spawned: the server's own environment (its venv, PYTHONPATH, threads, plan) for the engine.
    twin = RealServer(sglang_venv(), model, name="offline", env=_server_env(procs.dir / "counters-offline.json"))
    command = [str(twin.venv / "bin" / "python"), str(REPO / "bench" / "sglang_offline.py"), str(requests), str(out),
               "--model-path", str(model), *tier_server.CPU_ENGINE, *tier_server.DEFAULT_FLAGS,
               *_server_flags(total_tokens, SERVER_RUNNING_CAP)]
    result = subprocess.run(command, env={**os.environ, **twin.environment()}, capture_output=True, text=True,
                            timeout=RUN_TIMEOUT_S)
    if result.returncode != 0:
        raise RuntimeError(f"SGLang's offline engine failed ({result.returncode}): {result.stderr[-2000:]}")
    figures = json.loads(out.read_text())
    figures["tokens_per_s"] = figures["completion_tokens"] / figures["wall_s"]
    figures["decode_rate"] = admission.steady_decode_rate([tuple(point) for point in figures.pop("decoded")])
    return figures


# -- one cell ---------------------------------------------------------------------------------------

def measure_cell(procs: Processes, redis_url: str, model: Path, rows_path: Path, count: int, max_new_tokens: int,
                 total_tokens: int, repeats: int, requests: Path, log: Callable[[str], None]) -> dict:
    runs: dict[str, list[dict]] = {mode.name: [] for mode in MODES}
    server = _start_server(procs, model, total_tokens, SERVER_RUNNING_CAP, f"sweep-{total_tokens}")
    counters = Path(server.extra_env["GENFLEET_PLAN_COUNTERS"])
    try:
        for repeat in range(repeats):
            for mode in (MODES if repeat % 2 == 0 else MODES[::-1]):
                server.flush_cache()
                run = f"sw{total_tokens}r{repeat}{mode.name.replace(' ', '').replace(',', '')}"
                side = admission.run_one(procs, redis_url, "real", server.url, counters, model, rows_path, count,
                                         admission.Config(mode.name, staged=False, auto=mode.auto), run,
                                         concurrency=mode.in_flight, max_new_tokens=max_new_tokens)
                log(f"    {mode.name}: steady {side['decode_rate']:,.0f} tok/s, wall {side['tokens_per_s']:,.0f}, "
                    f"running {side['running']:.0f}, waiting {side['waiting']:.0f}")
                runs[mode.name].append(side)
    finally:
        server.stop()
    offline = run_offline(procs, model, requests, total_tokens)
    log(f"    SGLang offline: steady {offline['decode_rate']:,.0f} tok/s, wall {offline['tokens_per_s']:,.0f}")
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


def measure_remedy(procs: Processes, redis_url: str, model: Path, rows_path: Path, count: int,
                   log: Callable[[str], None]) -> dict:
    """Auto as it ships against a server capped at LOW_RUNNING_CAP, then against the same server
    restarted with the cap the alarm advises: tok/s after ÷ before, and the alarm's line."""
    total_tokens = admission.SHAPES["over-provisioned"]
    sides = {}
    for cap in (LOW_RUNNING_CAP, 2 * LOW_RUNNING_CAP):
        server = _start_server(procs, model, total_tokens, cap, f"cap-{cap}")
        run = f"cap{cap}"
        try:
            watch = AlarmWatch(env_for(redis_url, procs.dir / f"output-{run}"), run)
            with watch:
                side = admission.run_one(procs, redis_url, "real", server.url,
                                         Path(server.extra_env["GENFLEET_PLAN_COUNTERS"]), model, rows_path, count,
                                         admission.Config("auto", staged=False, auto=True), run,
                                         concurrency=SHIPPED_CEILING, max_new_tokens=CHAT_CAP)
        finally:
            server.stop()
        side.update(alarm=watch.line, alarm_after_s=watch.after_s)
        log(f"    --max-running-requests {cap}: steady {side['decode_rate']:,.0f} tok/s, wall "
            f"{side['tokens_per_s']:,.0f}, running {side['running']:.0f}, "
            f"waiting {side['waiting']:.0f}; alarm: {watch.line or 'none'}")
        sides[cap] = side
    low, raised = sides[LOW_RUNNING_CAP], sides[2 * LOW_RUNNING_CAP]
    identical = sum(1 for rid, ids in raised.pop("outputs").items() if ids == low["outputs"].get(rid))
    low.pop("outputs")
    keep = ("decode_rate", "tokens_per_s", "running", "waiting", "token_usage", "records", "alarm", "alarm_after_s")
    return {"low_cap": LOW_RUNNING_CAP, "raised_cap": 2 * LOW_RUNNING_CAP,
            "low": {k: low[k] for k in keep}, "raised": {k: raised[k] for k in keep},
            "ratio": raised["decode_rate"] / low["decode_rate"],
            "wall_ratio": raised["tokens_per_s"] / low["tokens_per_s"], "identical": identical}


# -- the whole sweep --------------------------------------------------------------------------------

def measure(profile: Profile, log: Callable[[str], None] = print) -> dict:
    outcome: dict = {"sglang": "0.5.23", "profile": asdict(profile), "workload": profile.describe(),
                     "step_s": admission.STEP_S, "cells": {}}
    with tempfile.TemporaryDirectory(prefix="genfleet-bench-sweep-") as tmp_name:
        tmp = Path(tmp_name)
        model = tier_model.build(tmp / "model")
        paths = {}
        for workload, (make_rows, how_many, max_new_tokens) in WORKLOADS.items():
            rows = make_rows(how_many(profile))
            stem = "seeds" if workload.startswith("seeds") else "chat"
            paths[workload] = (write_rows(tmp / f"{stem}.jsonl", rows),
                               offline_requests(tmp / f"{stem}-requests.json", model, rows, max_new_tokens))
        for workload, (_, how_many, max_new_tokens) in WORKLOADS.items():
            for provision, total_tokens in admission.SHAPES.items():
                log(f"  sweep: {workload}, {provision} (--max-total-tokens {total_tokens:,})")
                with Processes(prefix="genfleet-bench-sweep-") as procs:
                    _, redis_url = procs.start_redis()
                    rows_path, requests = paths[workload]
                    cell = measure_cell(procs, redis_url, model, rows_path, how_many(profile), max_new_tokens,
                                        total_tokens, profile.repeats, requests, log)
                outcome["cells"][f"{workload}, {provision}"] = {"max_total_tokens": total_tokens,
                                                                "max_new_tokens": max_new_tokens, **cell}
        log(f"  the server's cap: --max-running-requests {LOW_RUNNING_CAP}, then as advised")
        with Processes(prefix="genfleet-bench-sweep-cap-") as procs:
            _, redis_url = procs.start_redis()
            remedy_rows = write_rows(tmp / "remedy.jsonl", chat_rows(profile.remedy_prompts, seed=9))
            outcome["remedy"] = measure_remedy(procs, redis_url, model, remedy_rows, profile.remedy_prompts, log)
    return outcome


# -- the report's section ---------------------------------------------------------------------------

HEADING = "## The operating point: a sweep on SGLang's own server (section 13)"


def section_lines(outcome: dict, date: str, commit: str) -> list[str]:
    fixed_s, per_request, per_token = outcome["step_s"]
    repeats = outcome["profile"]["repeats"]
    lines = [HEADING, "",
             f"Measured {date} at commit {commit} on SGLang {outcome['sglang']}'s own server (the real-server tier's "
             f"CPU engine, the forward pass replaced by the plan; a step sleeps {fixed_s * 1000:g} ms + "
             f"{per_request * 1000:g} ms per request + {per_token * 1e6:g} µs per prefilled token: a model of a GPU "
             f"step, bench/admission.py); {outcome['workload']}. `--max-running-requests 500`: only the KV cache and "
             f"the client bound the batch. A cell's modes ran on one server {repeats} time(s), "
             "alternately in order and reversed (its radix cache flushed between runs); steady tok/s: the server's "
             "own decode count from 10% to 80% of what it decoded (median, min–max): what a long job runs at, "
             "where the modes are judged (a run of a few hundred prompts ends in one long completion's tail, "
             "which no client setting shortens); wall tok/s: the records' completion tokens ÷ wall; running, "
             "waiting, usage: `/v1/loads` over the middle "
             "80% of the run; identical: records equal, token for token, to the "
             "first fixed-150 run's; offline: the same prompt ids through SGLang's own offline path "
             "(`Engine.generate`, every request at once, as `sglang.benchmark.offline_throughput` does), same flags.",
             ""]
    for name, cell in outcome["cells"].items():
        offline = cell["offline"]
        lines += [f"**{name}** (`--max-total-tokens {cell['max_total_tokens']:,}`, max_new_tokens "
                  f"{cell['max_new_tokens']:,})", "",
                  "| mode | steady tok/s | min – max | wall tok/s | running | waiting | KV use | retracted | decoded "
                  "twice | identical | target over time |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for mode, m in cell["modes"].items():
            best = " (best fixed)" if mode == cell["best_fixed"] else ""
            lines.append(f"| {mode}{best} | {m['decode_rate']:,.0f} | {m['min']:,.0f} – {m['max']:,.0f} | "
                         f"{m['tokens_per_s']:,.0f} | "
                         f"{m['running']:.0f} | {m['waiting']:.0f} | {100 * m['token_usage']:.1f}% | "
                         f"{m['retracted']} | "
                         f"{m['decoded_twice']:,} | {m['identical']} of {m['records']} | "
                         f"{' '.join(f'{t}s:{v}' for t, v in m['target_over_time'][:10]) or '—'} |")
        lines.append(f"| SGLang offline (no HTTP, no client) | {offline['decode_rate']:,.0f} | | "
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
        lines += [f"**The server's cap**: {outcome['profile']['remedy_prompts']} short chat prompts, auto as it ships, "
                  f"over-provisioned KV. At `--max-running-requests {remedy['low_cap']}`: "
                  f"{low['decode_rate']:,.0f} steady tok/s, running {low['running']:.0f}, waiting "
                  f"{low['waiting']:.0f}; "
                  f"`genfleet status` after {low['alarm_after_s'] or 0:.0f} s: `{low['alarm'] or 'no alarm'}`. "
                  f"Restarted with `--max-running-requests {remedy['raised_cap']}`: {raised['decode_rate']:,.0f} "
                  f"steady tok/s, running {raised['running']:.0f}, alarm: {raised['alarm'] or 'none'}. **Raised ÷ "
                  f"capped {remedy['ratio']:.2f}×** (wall {remedy['wall_ratio']:.2f}×); records identical "
                  f"{remedy['identical']} of {raised['records']}.", ""]
    return lines


def main() -> None:
    import argparse

    from bench.processes import interrupt_on_signals

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int)
    args = parser.parse_args()
    interrupt_on_signals()
    profile = QUICK if args.quick else FULL
    if args.repeats:
        profile = replace(profile, repeats=args.repeats)
    print(json.dumps(measure(profile), indent=1, default=str))


if __name__ == "__main__":
    main()
