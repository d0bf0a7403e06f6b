"""`make bench`: every benchmark, repeated, into one markdown report (`bench/results.md`).

    .venv/bin/python bench/run.py [--repeats 2] [--quick]
                                  [--only throughput,onebox,scaling,enqueue,export,useful,control,affinity,
                                          tail,real,vllm,sweep (= sweep-sglang,sweep-vllm)]
                                  [--out bench/results.md] [--into-existing]

Each repetition runs throughput (genfleet against the baseline script, the order alternating),
one box (`genfleet run`, start-up included, against the same script), scaling (1, 2, 4 hosts) and
the enqueue rate; the export benchmark, the control plane's cost, routing and the shared tail (two
runs on one host, one after the other and sharing it) run once (each is minutes on its own), and so
does `real`: throughput, routing and the loop guard on SGLang 0.5.23's own server (the real-server
tier's venv, built once), each beside the simulator's figure for the same workload
(bench/real_server.py), and `vllm`: throughput and `--in-flight auto` on vLLM 0.32.0's own server
(the vLLM tier's venv, built once; bench/vllm_server.py), and `sweep`: the operating point (fixed
in-flight points against `--in-flight auto`, beside the engine's own offline path) and a capped server
raised as `status` advises, on SGLang's own server and on vLLM's (bench/sweep.py, bench/sweep_vllm.py;
~40 min each: `sweep-sglang` or `sweep-vllm` runs one). Every benchmark starts and stops its own
redis-server, simulators and workers; Ctrl-C stops them all. `--quick` shrinks every size to check
the harness, not to measure.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import (  # noqa: E402
    affinity,
    control_model,
    control_plane,
    loop_guard,
    onebox,
    real_server,
    report,
    scaling,
    shared_tail,
    standalone,
    sweep,
    sweep_halves,
    throughput,
    useful_tokens,
    vllm_server,
)
from bench.processes import REPO, interrupt_on_signals  # noqa: E402
from bench.results import Results, machine_info  # noqa: E402

MEASUREMENTS = ("throughput", "onebox", "scaling", "enqueue", "export", "useful", "control", "affinity", "tail",
                "real", "vllm", "sweep-sglang", "sweep-vllm")
ALIASES = {"sweep": ("sweep-sglang", "sweep-vllm")}  # `--only sweep`: both halves
ENQUEUE_PROMPTS = {False: 100_000, True: 5_000}
CHAT_ENQUEUE_PROMPTS = {False: 20_000, True: 2_000}
# Kimi-K2.5's custom-code tiktoken tokenizer, and a fast one (Qwen3's shape): tests/model_shapes.
CHAT_ENQUEUE_SHAPES = ("kimi-k2.5", "qwen3")
EXPORT_RECORDS = {False: 1_000_000, True: 20_000}
DEFAULT_OUT = REPO / "bench" / "results.md"


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main() -> None:
    args, only = _parse_args()
    interrupt_on_signals()

    results = Results(quick=args.quick, repeats=args.repeats, only=only, machine=machine_info())
    started = time.monotonic()
    results.throughput_profile = throughput.QUICK if args.quick else throughput.FULL
    results.scaling_profile = scaling.QUICK if args.quick else scaling.FULL
    try:
        for repeat in range(1, args.repeats + 1):
            if "throughput" in only:
                _measure_throughput(results, repeat)
            if "onebox" in only:
                _measure_onebox(results, repeat)
            if "scaling" in only:
                _measure_scaling(results, repeat)
            if "enqueue" in only:
                _measure_enqueue_rate(results, repeat)
            if "useful" in only:
                _measure_useful_tokens(results, repeat)
        if "export" in only:
            _measure_export(results)
        if "control" in only:
            _measure_control(results)
        if "affinity" in only:
            _measure_affinity(results)
        if "tail" in only:
            _measure_shared_tail(results)
        if "real" in only:
            _measure_real_server(results)
        if "vllm" in only:
            _measure_vllm_server(results)
        for key in ("sglang", "vllm"):
            if f"sweep-{key}" in only:
                _measure_sweep(results, key)
    except KeyboardInterrupt:
        log("interrupted: every process this bench started is stopped; no report written")
        sys.exit(130)
    results.machine.finish()
    results.elapsed_s = time.monotonic() - started
    rendered = report.render(results)
    if args.into_existing and args.out.exists():
        rendered = report.splice(args.out.read_text(), rendered)
    args.out.write_text(rendered)
    log(f"wrote {args.out} in {results.elapsed_s / 60:.1f} min")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results.raw(), indent=1, default=str))


def _parse_args() -> tuple[argparse.Namespace, list[str]]:
    """The arguments, and the measurements `--only` asked for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="runs of each measurement; the table shows medians")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the harness, measures nothing")
    parser.add_argument("--only", default=",".join(MEASUREMENTS),
                        help=f"comma-separated subset of {', '.join(MEASUREMENTS)}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--into-existing", action="store_true",
                        help="with --only: replace the measured sections of the report already at --out, keep "
                        "the rest")
    parser.add_argument("--json", type=Path, help="also write every run's raw figures here (default with the "
                        "default --out: bench/results/raw.json, which git ignores)")
    args = parser.parse_args()
    if args.json is None and args.out == DEFAULT_OUT:
        args.json = REPO / "bench" / "results" / "raw.json"
    only = [alias for name in args.only.split(",") if name.strip()
            for alias in ALIASES.get(name.strip(), (name.strip(),))]
    unknown = set(only) - set(MEASUREMENTS)
    if unknown:
        parser.error(f"unknown measurement(s): {', '.join(sorted(unknown))}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args, only


def _measure_throughput(results: Results, repeat: int) -> None:
    profile = results.throughput_profile
    log(f"throughput {repeat}/{results.repeats}: {profile.describe()}")
    with tempfile.TemporaryDirectory(prefix="genfleet-bench-prompts-") as tmp:
        comparison = throughput.compare(profile, Path(tmp), baseline_first=repeat % 2 == 0)
    results.throughput.append(comparison)
    log(f"  genfleet {comparison.genfleet.tokens_per_s:,.0f} tok/s in {comparison.genfleet.wall_s:.1f} s, "
        f"baseline {comparison.baseline.tokens_per_s:,.0f} tok/s in {comparison.baseline.wall_s:.1f} s")


def _measure_onebox(results: Results, repeat: int) -> None:
    profile = results.throughput_profile
    assert profile is not None
    log(f"one box {repeat}/{results.repeats}: `genfleet run` against the script, {profile.prompts:,} prompts")
    with tempfile.TemporaryDirectory(prefix="genfleet-bench-prompts-") as tmp:
        comparison = onebox.compare(profile, Path(tmp), baseline_first=repeat % 2 == 0)
    results.onebox.append(comparison)
    log(f"  genfleet run {comparison['onebox_wall_s']:.1f} s (first record at {comparison['first_record_s']:.1f} s), "
        f"script {comparison['baseline_wall_s']:.1f} s")


def _measure_scaling(results: Results, repeat: int) -> None:
    profile = results.scaling_profile
    log(f"scaling {repeat}/{results.repeats}: {profile.describe()}")
    outcome = scaling.measure(profile)
    results.scaling.append(outcome)
    log("  " + ", ".join(f"{r.hosts} hosts {r.tokens_per_s:,.0f} tok/s" for r in outcome.results))


def _measure_enqueue_rate(results: Results, repeat: int) -> None:
    prompts = ENQUEUE_PROMPTS[results.quick]
    chat_prompts = CHAT_ENQUEUE_PROMPTS[results.quick]
    log(f"enqueue rate {repeat}/{results.repeats}: {prompts:,} prompts; {chat_prompts:,} chat-length ones with "
        f"{' and '.join(CHAT_ENQUEUE_SHAPES)}")
    try:
        rate = standalone.enqueue_rate(prompts)
        # The same chat-length prompts templated by a custom-code (Python) tokenizer and a fast one.
        rate["chat"] = {shape: standalone.enqueue_rate(chat_prompts, shape=shape, chat=True)
                        for shape in CHAT_ENQUEUE_SHAPES}
        results.enqueue.append(rate)
        log(f"  {rate['end_to_end_per_s']:,} prompts/s end to end; chat-length: "
            + ", ".join(f"{shape} {r['end_to_end_per_s']:,}/s" for shape, r in rate["chat"].items()))
    except standalone.NotMeasured as error:
        results.enqueue_error = str(error)
        log(f"  not measured: {error}")


def _measure_useful_tokens(results: Results, repeat: int) -> None:
    workload = useful_tokens.QUICK if results.quick else useful_tokens.FULL
    log(f"useful tokens {repeat}/{results.repeats}: {workload.describe()}")
    with tempfile.TemporaryDirectory(prefix="genfleet-bench-useful-") as tmp:
        outcome = useful_tokens.compare(workload, Path(tmp))
    results.useful.append(outcome)
    log(f"  GPU tokens {outcome['gpu_tokens_ratio']:.2f}x, wall {outcome['wall_ratio']:.2f}x of the naive policy")
    if results.loop_guard is None:
        results.loop_guard = {"ns_per_token": loop_guard.measure(200_000 if results.quick else 2_000_000),
                              "overrun_tokens": loop_guard.overruns()}


def _measure_affinity(results: Results) -> None:
    workload = affinity.QUICK if results.quick else affinity.FULL
    log(f"routing (once): {workload.describe()}")
    with tempfile.TemporaryDirectory(prefix="genfleet-bench-affinity-") as tmp:
        results.affinity = affinity.compare(workload, Path(tmp))
    log("  " + ", ".join(f"{hosts} hosts: prefill {r['prefill_tokens']:.2f}x, wall {r['wall']:.2f}x"
                         for hosts, r in results.affinity["ratios"].items()))


def _measure_shared_tail(results: Results) -> None:
    profile = shared_tail.QUICK if results.quick else shared_tail.FULL
    log(f"shared tail (once): {shared_tail.describe(profile)}")
    with tempfile.TemporaryDirectory(prefix="genfleet-bench-tail-") as tmp:
        results.shared_tail = shared_tail.compare(profile, Path(tmp))
    apart, shared = results.shared_tail["cases"]["apart"], results.shared_tail["cases"]["shared"]
    log(f"  one after the other {apart['wall_s']:.1f} s at {apart['job_occupancy']:.1%}, sharing the fleet "
        f"{shared['wall_s']:.1f} s at {shared['job_occupancy']:.1%} (whole-job occupancy)")


def _measure_real_server(results: Results) -> None:
    workload = real_server.QUICK if results.quick else real_server.FULL
    log(f"on SGLang's own server (once): {workload.describe()}")
    try:
        results.real_server = real_server.compare(workload, log=log)
    except (RuntimeError, TimeoutError, OSError) as error:  # the SGLang venv or a server that did not start
        results.real_server_error = str(error).splitlines()[0]
        log(f"  not measured: {error}")
        return
    for name, figures in results.real_server["measurements"].items():
        log(f"  {name}: " + ", ".join(f"{kind} {_headline(name, figure)}" for kind, figure in figures.items()))


def _measure_vllm_server(results: Results) -> None:
    workload = vllm_server.QUICK if results.quick else vllm_server.FULL
    log(f"on vLLM's own server (once): {workload.describe()}")
    try:
        results.vllm_server = vllm_server.compare(workload, log=log)
    except (RuntimeError, TimeoutError, OSError, subprocess.CalledProcessError) as error:  # its venv, its server
        results.vllm_server_error = str(error).splitlines()[0]
        log(f"  not measured: {error}")
        return
    measured = results.vllm_server["measurements"]
    if "throughput" in measured:
        log(f"  throughput {measured['throughput']['throughput_ratio']:.2f}x, occupancy "
            f"{measured['throughput']['occupancy']:.1%}")
    for shape, outcome in (measured.get("admission") or {}).items():
        log(f"  {shape}: auto {outcome['tokens_ratio']:.2f}x fixed 150")


def _measure_sweep(results: Results, key: str) -> None:
    profile = sweep.QUICK if results.quick else sweep.FULL
    half = sweep_halves.half_named(key)
    log(f"the operating point on {half.title}'s own server (once): {sweep.describe(profile, half)}")
    try:
        results.sweeps[key] = sweep.measure(profile, half, log=log)
    except (RuntimeError, TimeoutError, OSError, subprocess.CalledProcessError) as error:  # its venv, its server
        results.sweep_errors[key] = str(error).splitlines()[0]
        log(f"  not measured: {error}")
        return
    for name, cell in results.sweeps[key]["cells"].items():
        ratios = cell["ratios"]["auto"]
        log(f"  {name}: auto {ratios['best_fixed']:.2f}x best fixed ({cell['best_fixed']}), "
            f"{ratios['fixed_150']:.2f}x fixed 150, {ratios['offline']:.2f}x engine offline")


def _headline(name: str, figure: dict) -> str:
    if name == "admission":
        ratios = {shape: measured["configs"]["staged, auto"]["tokens_per_s_ratio"]
                  for shape, measured in figure["shapes"].items()}
        return "staged+auto " + ", ".join(f"{shape} {ratio:.2f}x" for shape, ratio in ratios.items())
    key = {"throughput": "throughput_ratio", "affinity": "prefill_ratio", "loops": "decoded_ratio"}[name]
    return f"{figure[key]:.2f}x"


def _measure_control(results: Results) -> None:
    workload = control_plane.QUICK if results.quick else control_plane.FULL
    log(f"control plane (once): {workload.describe()}")
    try:
        raw = control_plane.measure(workload)
    except (RuntimeError, TimeoutError) as error:  # a fleet part that did not start or finish
        results.control_error = str(error).splitlines()[0]
        log(f"  not measured: {error}")
        return
    results.control = {**raw, "model": control_model.summarise(raw)}
    log(f"  {results.control['model']['ceilings']['redis_completions_per_core']:,.0f} completions/s per Redis core")


def _measure_export(results: Results) -> None:
    records = EXPORT_RECORDS[results.quick]
    log(f"export: {records:,} records (once)")
    try:
        results.export = standalone.export_memory(records)
        log(f"  {results.export['main']['records_per_s']:,} records/s, "
            f"peak {results.export['main']['peak_rss_mb']} MB")
    except standalone.NotMeasured as error:
        results.export_error = str(error)
        log(f"  not measured: {error}")


if __name__ == "__main__":
    main()
