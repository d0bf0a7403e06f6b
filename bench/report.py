"""The markdown report of `make bench` (`bench/results.md`): machine, date, commit, the table of
medians against their targets, a note on every missed target, how each figure is measured, every
run. The figures and their targets are `bench/figures.py`; the notes, `bench/target_notes.py`."""
from __future__ import annotations

import os
import re

from bench import shared_tail, sweep, sweep_halves
from bench.figures import (
    MB,
    Figure,
    affinity_figures,
    control_figures,
    enqueue_figures,
    export_figures,
    format_percent,
    onebox_figures,
    real_server_figures,
    scaling_figures,
    shared_tail_figures,
    sweep_figures,
    throughput_figures,
    useful_token_figures,
    vllm_server_figures,
)
from bench.results import Results


def render(results: Results) -> str:
    numbered = _numbered_figures(results)
    lines = _heading(results) + _table(results, numbered) + _warnings(results, numbered)
    if results.scaling:
        lines += ["## What limits scaling on this machine", "", _scaling_limits(results), ""]
    if results.real_server:
        lines += _real_server_section(results)
    if results.vllm_server:
        lines += _vllm_server_section(results)
    for outcome in results.sweeps.values():
        lines += sweep.section_lines(outcome, results.machine.date, results.machine.commit)
    lines += ["## How each figure is measured", ""] + _methods(results) + [""]
    tail = shared_tail.runs_table(results.shared_tail) if results.shared_tail else []
    lines += ["## Every run", ""] + _runs(results) + tail + [""]
    return "\n".join(lines)


def _heading(results: Results) -> list[str]:
    m = results.machine
    lines = ["# genfleet benchmarks", ""]
    if results.quick:
        lines += ["> **Quick run** (`--quick`): tiny sizes that check the harness. These numbers measure "
                  "nothing; run `make bench`.", ""]
    load_end = f" → {m.load_end[0]:.2f}" if m.load_end else ""
    return lines + [
        f"- **Machine**: {m.cpu}, {m.cores} cores, {m.memory_gb:.0f} GiB; Linux {m.kernel}; Python {m.python}; "
        f"{m.redis.split(' sha=')[0]}",
        f"- **Date**: {m.date}; **commit** {m.commit}",
        f"- **Command**: `bench/run.py --repeats {results.repeats}"
        + (" --quick" if results.quick else "")
        + (f" --only {','.join(results.only)}" if len(results.only) < 9 else "")
        + f"` ({results.elapsed_s / 60:.1f} min); 1-minute load average {m.load_start[0]:.2f}{load_end} "
        "(anything above ~0.5 at the start means other work shared the CPUs: the figures are noisier)",
        "",
    ]


def _numbered_figures(results: Results) -> list[tuple[str, Figure]]:
    """Every measured figure with its number: section.index, the sections fixed (1-2 throughput,
    3 enqueue, 4 scaling, 5 export, 6 useful tokens, 7 control plane, 8 routing, 9 shared tail, 10 on
    SGLang's own server, 11 one box, 12 on vLLM's own server, 13 the sweep on SGLang, 14 on vLLM) so a number
    means the same figure in every report."""
    sections: list[tuple[str, list[Figure]]] = []
    if results.throughput:
        speed, cost = throughput_figures(results.throughput)
        sections += [("1", speed), ("2", cost)]
    if results.enqueue:
        sections.append(("3", enqueue_figures(results.enqueue)))
    if results.scaling:
        sections.append(("4", scaling_figures(results.scaling)))
    if results.export:
        sections.append(("5", export_figures(results.export)))
    if results.useful:
        sections.append(("6", useful_token_figures(results.useful, results.loop_guard)))
    if results.control:
        sections.append(("7", control_figures(results.control)))
    if results.affinity:
        sections.append(("8", affinity_figures(results.affinity)))
    if results.shared_tail:
        sections.append(("9", shared_tail_figures(results.shared_tail)))
    if results.real_server:
        sections.append(("10", real_server_figures(results.real_server)))
    if results.onebox:
        sections.append(("11", onebox_figures(results.onebox)))
    if results.vllm_server:
        sections.append(("12", vllm_server_figures(results.vllm_server)))
    for key, outcome in results.sweeps.items():
        sections.append((sweep.SECTIONS[key], sweep_figures(outcome)))
    return [(f"{section}.{i}", figure) for section, group in sections for i, figure in enumerate(group, 1)]


def _table(results: Results, numbered: list[tuple[str, Figure]]) -> list[str]:
    lines = [
        f"## Results: medians of {results.repeats} run{'s' if results.repeats > 1 else ''} (min – max)",
        "",
        "| # | figure | median | detail | target | |",
        "|---|---|---:|---|---|---|",
    ]
    for number, figure in numbered:
        lines.append(f"| {number} | {figure.name} | {figure.cell()} | {figure.detail} | {figure.target} | "
                     f"{figure.status} |")
    not_measured = []
    if "enqueue" in results.only and not results.enqueue:
        not_measured.append(("3", "Enqueue rate, 100,000 short prompts", results.enqueue_error or "not run"))
    if "export" in results.only and not results.export:
        not_measured.append(("5", "Export rate and peak memory, 1,000,000 small records",
                             results.export_error or "not run"))
    if "real" in results.only and not results.real_server:
        not_measured.append(("10", "On SGLang's own server", results.real_server_error or "not run"))
    if "vllm" in results.only and not results.vllm_server:
        not_measured.append(("12", "On vLLM's own server", results.vllm_server_error or "not run"))
    for key, section in sweep.SECTIONS.items():
        if f"sweep-{key}" in results.only and key not in results.sweeps:
            title = sweep_halves.half_named(key).title
            not_measured.append((section, f"The operating point, swept on {title}'s own server",
                                 results.sweep_errors.get(key, "not run")))
    if "control" in results.only and not results.control:
        not_measured.append(("7", "Control plane cost", results.control_error or "not run"))
    for number, name, why in not_measured:
        lines.append(f"| {number} | {name} | not measured | {why} | | |")
    return lines + [""]


def _warnings(results: Results, numbered: list[tuple[str, Figure]]) -> list[str]:
    """Runs whose two sides did different work, and the notes on missed targets."""
    lines = []
    mismatched = [i for i, c in enumerate(results.throughput, 1)
                  if c.genfleet.completion_tokens != c.baseline.completion_tokens]
    if mismatched:
        lines += [f"> **Warning**: in run(s) {', '.join(map(str, mismatched))} genfleet and the baseline generated "
                  "different token totals, so they did not do the same work; see Every run.", ""]
    missed = [(n, f) for n, f in numbered if f.meets is not None and not f.meets(f.median) and f.note]
    if missed and results.quick:
        lines += ["A quick run judges no target: the notes on missed targets are left out.", ""]
    elif missed:
        lines += [MISSED_SECTION, ""]
        for number, figure in missed:
            lines += [f"- **{number} {figure.name}**: {figure.note()}", ""]
    return lines


def _scaling_limits(results: Results) -> str:
    last = results.scaling[-1]
    cores = os.cpu_count() or 1
    rows = ["| hosts | tok/s | per-host occupancy | whole job | cores: sims | workers | redis | machine busy |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in last.results:
        rows.append(f"| {r.hosts} | {r.tokens_per_s:,.0f} | {r.occupancy:.1%} | {r.job_occupancy:.1%} | "
                    f"{r.sim_cores:.2f} | "
                    f"{r.worker_cores:.2f} | {r.redis_cores:.2f} | {r.machine_busy_cores:.2f} of {cores} |")
    profile = results.scaling_profile
    one = next(r for r in last.results if r.hosts == 1)
    most = max(last.results, key=lambda r: r.hosts)
    per_host = most.own_cores / most.hosts
    text = (
        f"Each host is its own `genfleet sim` process with the same capacity, with its own short worker; all of "
        f"them, Redis and the producer share this machine's {cores} cores. The hosts are capacity-bound by "
        f"construction ({profile.describe() if profile else ''}): a host generates "
        f"{profile.capacity_tok_s if profile else 0:,.0f} tok/s only while its 150 slots stay full, and "
        f"`stream_interval` 32 keeps each token cheap for worker and simulator, so what a host costs is mostly "
        f"its worker's few ms of CPU per completion. "
    )
    if one.occupancy - most.occupancy < 0.005 and most.machine_busy_cores < 0.9 * cores:
        text += (
            f"In the last run nothing limited it: with {most.hosts} hosts every host stayed {most.occupancy:.1%} "
            f"busy (1 host: {one.occupancy:.1%}) and the fleet's own processes used {most.own_cores:.2f} of "
            f"{cores} cores, about {per_host:.2f} per host. The limit on this box is CPU: at that cost the fleet "
            f"would fill the cores at about {cores / per_host:.0f} hosts, sooner when other work shares the "
            f"machine; past that, workers get the CPU late, refill their slots late, and occupancy per host "
            f"falls. Real hosts bring their own CPUs."
        )
    else:
        text += (
            f"In the last run occupancy per host fell from {one.occupancy:.1%} (1 host) to {most.occupancy:.1%} "
            f"({most.hosts} hosts) while the machine was {most.machine_busy_cores:.2f} of {cores} cores busy "
            f"(the fleet's own processes {most.own_cores:.2f}, about {per_host:.2f} per host): workers that get "
            f"the CPU late refill their slots late. Real hosts bring their own CPUs."
        )
    return text + " CPU in use during the last run's steady-state windows:\n\n" + "\n".join(rows)


def _methods(results: Results) -> list[str]:
    tp = results.throughput_profile
    enqueue_prompts = results.enqueue[0]["prompts"] if results.enqueue else 100_000
    export_records = results.export["main"]["records"] if results.export else 1_000_000
    return [
        f"- **Workload (1-2)**: {tp.describe() if tp else ''}. The prompts are short chat rows in "
        "`messages` form; both sides send the same token ids (the model's chat template), so the simulator "
        "generates the same completions for both (same total tokens, checked in every run below).",
        "- **Throughput (1.1)**: completion tokens ÷ wall time, per side, on a fresh simulator each. genfleet: "
        "redis-server, `genfleet sim`, one `genfleet worker --pool short` started and idle first (a fleet is "
        "long-lived); the clock runs from `genfleet enqueue` to the last prompt counted done in Redis "
        "(its record fsynced). Baseline: `bench/baseline_client.py` (asyncio + httpx, semaphore 150, SGLang's "
        "default cumulative stream at interval 1, `json.loads` per line, reasoning split at `</think>`, JSONL "
        "written at the end); the clock runs from its start (imports, templating) to its exit.",
        "- **Occupancy (1.2)**: the simulator's time-averaged running requests (`/sim/stats` `mean_running`) "
        "between the 10% and 90% completion marks: `POST /sim/stats/reset` when 10% of the requests have "
        "finished, `GET /sim/stats` at 90%, polled every 50 ms; ÷ 150.",
        "- **Wall time (1.3)**: the two clocks above.",
        "- **CPU per token (2.1)**: user + system CPU seconds ÷ completion tokens. The worker: `/proc/<pid>/stat` "
        "utime + stime, delta over the run (all its threads). The baseline: `wait4` rusage of its process.",
        "- **Peak RSS (2.2)**: the worker's `VmHWM` from `/proc/<pid>/status` at the end of the run (it held "
        "150 streams; the simulator's `peak_running` confirms it).",
        f"- **Enqueue rate (3.1)**: `bench/enqueue_rate.py`: `genfleet enqueue` of {enqueue_prompts:,} short "
        "prompts into a throwaway redis-server, prompts ÷ the command's wall time (process start and tokenizer "
        "load included).",
        "- **Chat-length enqueue (3.2, 3.3)**: the same script with `--chat --shape kimi-k2.5` and `--shape qwen3`: "
        "the same seeded prompts (a system prompt and a 60-400-word user turn) templated by each family's tokenizer "
        "directory as tests/model_shapes builds it; Kimi's is custom code (a Python tokenizer over tiktoken, "
        "templated in one process per core: genfleet/producer/templating_processes.py), Qwen3's a fast Rust one. "
        "The target is 83,000 prompts in under 90 s.",
        "- **Scaling (4.1, 4.2)**: N = 1, 2, 4 simulators (same capacity), one `genfleet worker --pool short "
        "--upstream` per simulator, one Redis and one producer for all; the simulators' generated tokens "
        "summed over a steady-state window (from 10% of completions until the queue runs dry or 90%, whichever "
        "first), ÷ the window's seconds; then ÷ the 1-host figure. The CPU figures stop when the window closes.",
        "- **Export (5.1, 5.2)**: `bench/export_memory.py` (run once): `genfleet export --format specforge` over "
        f"{export_records:,} small synthetic records, records ÷ the command's wall time, and its peak RSS (`wait4` "
        "ru_maxrss).",
        f"- **Useful tokens (6.1, 6.2)**: `bench/useful_tokens.py`: "
        f"{(results.useful[0]['workload'] if results.useful else '')}; run twice, each on a fresh simulator with a "
        "short and a long worker: `--loop-guard off --on-truncated regenerate` (a loop runs to its cap, a cut "
        "completion is asked again from scratch on long) and `--loop-guard abort --on-truncated continue`. GPU "
        "tokens: every token the simulator decoded (`/sim/stats` `tokens_generated`, aborted requests' included); "
        "useful output: the records that finished on their own, which must be the same, token for token, in both.",
        "- **Loop guard (6.3, 6.4)**: `bench/loop_guard.py`: CPU per token feeding random word-id streams to the "
        "detector; tokens from a planted loop's start to its finding, periods 5-40 at random offsets.",
        "- **Whole-job occupancy** (the 'whole job' columns): the simulators' time-averaged running count from a "
        "`/sim/stats/reset` at enqueue (the baseline's start) to the last completion; the steady-state window "
        "restarts the counters at 10%, so their mean until then is read just before and weighed by its seconds "
        "(`bench/steady_state.py` `JobWindow`). Scaling waits for the drain for this figure only.",
        f"- **Control plane (7.x)**: `bench/control_plane.py` (once; docs/scaling.md): "
        f"{results.control['workload'] if results.control else ''}. Per completion: INFO commandstats and INFO cpu "
        "deltas from `genfleet enqueue` to the last prompt done and settled (nothing unacked, no lease), less the "
        "rate of an idle window before (a warm worker and Flower doing nothing); the bench's own commands are "
        "taken out. Memory left: used_memory once the worker and Flower are stopped, less a fresh Redis's, both "
        "read after SLOWLOG RESET and CONFIG RESETSTAT (which frees Redis 7's per-command latency histograms); "
        "queued: used_memory after `genfleet enqueue` with no worker, at two prompt sizes. Celery events: a "
        "subscriber of `/0.celeryev/*`. Worker and Flower CPU: `/proc/<pid>/stat`.",
        "- **Routing (8)**: `bench/affinity.py`: " + (results.affinity["workload"] if results.affinity else "") + "; "
        "per host count and routing mode (`GENFLEET_ROUTING`), fresh simulators with a prefix cache each and one "
        "worker over all of them: the prompt tokens the hosts prefilled (`/sim/stats` `prefill_tokens_computed`) "
        "and the wall time from the first enqueue to the last prompt done.",
        "- **Shared tail (9)**: " + shared_tail.method(results.shared_tail),
        "- **One box (11)**: `bench/onebox.py`: the workload of 1-2, on a fresh simulator each: `genfleet run "
        "--short-concurrency 150` (no GENFLEET_REDIS_URL: it starts its embedded redis-server) timed from the "
        "command to its exit, its first record timed by polling its shard directory every 50 ms; the script "
        "as in 1.1. The order alternates across runs.",
        "- Every process is started fresh per run, in its own session, and stopped at the end (Ctrl-C too). "
        "Medians are over the runs; each ratio is taken within one run, then the median of the ratios.",
    ]


def _runs(results: Results) -> list[str]:
    lines = []
    if results.throughput:
        lines += ["Throughput (genfleet | baseline):", "",
                  "| run | order | tok/s | wall s | tokens | occupancy | whole job | client CPU s | µs/token | "
                  "peak RSS MB | sim CPU s | machine busy (cores) |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for i, c in enumerate(results.throughput, 1):
            order = "baseline first" if i % 2 == 0 else "genfleet first"
            g, b = c.genfleet, c.baseline
            lines.append(
                f"| {i} | {order} | {g.tokens_per_s:,.0f} \\| {b.tokens_per_s:,.0f} | {g.wall_s:.1f} \\| "
                f"{b.wall_s:.1f} | {g.completion_tokens:,} \\| {b.completion_tokens:,} | "
                f"{format_percent(g.occupancy or 0)} \\| {format_percent(b.occupancy or 0)} | "
                f"{format_percent(g.job_occupancy)} \\| {format_percent(b.job_occupancy)} | {g.client_cpu_s:.1f} \\| "
                f"{b.client_cpu_s:.1f} | {g.cpu_us_per_token:.1f} \\| {b.cpu_us_per_token:.1f} | "
                f"{g.client_peak_rss_bytes / MB:,.0f} \\| {b.client_peak_rss_bytes / MB:,.0f} | "
                f"{g.sim_cpu_s:.1f} \\| {b.sim_cpu_s:.1f} | {g.machine_busy_cores:.2f} \\| "
                f"{b.machine_busy_cores:.2f} |")
        lines.append("")
    if results.scaling:
        lines += ["Scaling (steady-state tok/s, relative to 1 host):", "",
                  "| run | " + " | ".join(f"{r.hosts} host{'s' if r.hosts > 1 else ''}"
                                         for r in results.scaling[0].results) + " |",
                  "|---:|" + "---:|" * len(results.scaling[0].results)]
        for i, s in enumerate(results.scaling, 1):
            lines.append(f"| {i} | " + " | ".join(f"{r.tokens_per_s:,.0f} ({s.relative(r.hosts):.2f}×, "
                                                  f"{r.occupancy:.1%})" for r in s.results) + " |")
        lines.append("")
    if results.enqueue:
        lines += ["Enqueue rate: " + ", ".join(f"{r['end_to_end_per_s']:,}/s end to end ({r['enqueue_per_s']:,}/s "
                                               f"enqueue alone, {r['wall_s']} s)" for r in results.enqueue), ""]
    if results.useful:
        lines += ["Useful tokens (naive | genfleet):", "",
                  "| run | GPU tokens | useful tokens | wall s | looped | truncated | aborted requests |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]
        for i, run in enumerate(results.useful, 1):
            n, g = run["results"]["naive"], run["results"]["genfleet"]
            lines.append(f"| {i} | {n['gpu_tokens']:,} \\| {g['gpu_tokens']:,} | {n['useful_tokens']:,} \\| "
                         f"{g['useful_tokens']:,} | {n['wall_s']:.1f} \\| {g['wall_s']:.1f} | {n['looped']} \\| "
                         f"{g['looped']} | {n['truncated']} \\| {g['truncated']} | {n['aborted_requests']} \\| "
                         f"{g['aborted_requests']} |")
        lines.append("")
    if results.control:
        lines += ["Control plane (per completion, idle rate taken out):", "",
                  "| prompts | completions/s | Redis commands | Redis CPU µs | worker CPU ms | Flower CPU ms | "
                  "Celery events | run's keys left | whole-job occupancy |", "|---:" * 9 + "|"]
        for r in results.control["model"]["runs"]:
            cpu = r["cpu_ms_marginal"]
            lines.append(f"| {r['prompts']:,} | {r['completions_per_s']:,.0f} | {r['commands_marginal']:.1f} | "
                         f"{r['redis_cpu_us_marginal']:.0f} | {cpu['worker']:.2f} | {cpu.get('flower', 0):.2f} | "
                         f"{r['task_events']:.1f} | {r['retained_key_bytes']:,} B | {r['job_occupancy']:.1%} |")
        lines.append("")
    if results.export:
        lines += ["Export (`bench/export_memory.py`, every variant):", "",
                  "| variant | records | s | records/s | peak RSS MB |", "|---|---:|---:|---:|---:|"]
        for v in results.export["variants"]:
            rate = f"{v['records_per_s']:,}" if v.get("records_per_s") else "—"
            lines.append(f"| {v['variant']} | {v['records']:,} | {v['seconds']} | {rate} | {v['peak_rss_mb']} |")
        lines.append("")
    return lines


REAL_SECTION = "## On SGLang's own server, beside the simulator (section 10)"
VLLM_SECTION = "## On vLLM's own server (section 12)"
SECTION_HEADINGS = {"10": REAL_SECTION, "12": VLLM_SECTION,
                    **{sweep.SECTIONS[key]: heading for key, heading in sweep.HEADINGS.items()}}
MISSED_SECTION = "## Missed targets: why, and what would fix them"


def _real_server_section(results: Results) -> list[str]:
    """Section 10's provenance and, per comparison, the real server's figure beside the sim's: the
    numbers a claim about SGLang quotes (bench/real_server.py)."""
    outcome, m = results.real_server, results.machine
    measured = outcome["measurements"]
    rows = []
    if "throughput" in measured:
        real, sim = measured["throughput"]["real"], measured["throughput"]["sim"]
        rows += [("throughput, genfleet ÷ baseline", f"{real['throughput_ratio']:.2f}×",
                  f"{sim['throughput_ratio']:.2f}×"),
                 ("occupancy (running ÷ 150)", format_percent(real["occupancy"]), format_percent(sim["occupancy"]))]
    if "affinity" in measured:
        real, sim = measured["affinity"]["real"], measured["affinity"]["sim"]
        rows += [("prefill tokens, affinity ÷ least-busy (2 hosts)", f"{real['prefill_ratio']:.2f}×",
                  f"{sim['prefill_ratio']:.2f}×"),
                 ("wall time, affinity ÷ least-busy (2 hosts)", f"{real['wall_ratio']:.2f}×",
                  f"{sim['wall_ratio']:.2f}×")]
    if "loops" in measured:
        real, sim = measured["loops"]["real"], measured["loops"]["sim"]
        rows.append(("tokens decoded, loop guard abort ÷ off", f"{real['decoded_ratio']:.2f}×",
                     f"{sim['decoded_ratio']:.2f}×"))
    lines = [REAL_SECTION, "",
             f"Measured {m.date} at commit {m.commit} on SGLang {outcome['sglang']}'s own server (the real-server "
             "tier's: its CPU engine, only the model's forward pass replaced by a deterministic plan), each "
             f"beside `genfleet sim` on the same inputs; {outcome['workload']}. Where the two disagree, quote the "
             "real server's figure. Its step time is the CPU engine's on this machine's 2 cores, which the client "
             "shares: a model of no GPU; what carries over is SGLang's scheduler, radix cache and stream.", "",
             "| figure | SGLang 0.5.23 | genfleet sim |", "|---|---:|---:|"]
    lines += [f"| {name} | {real} | {sim} |" for name, real, sim in rows]
    if "admission" in measured:
        lines += [""] + _admission_tables(measured["admission"]["real"], measured["admission"]["sim"])
    return lines + [""]


def _vllm_server_section(results: Results) -> list[str]:
    """Section 12's provenance (bench/vllm_server.py): what ran, on what, and how it is read."""
    outcome, m = results.vllm_server, results.machine
    return [VLLM_SECTION, "",
            f"Measured {m.date} at commit {m.commit} on vLLM {outcome['vllm']}'s own OpenAI server (the vLLM tier's "
            "venv; `python -m vllm.entrypoints.openai.api_server`, its CPU engine, float32, eager) serving the tier's "
            "bench model (`tests/vllm_real/model_dir.py` `build_bench`: 6 layers of hidden size 512, random weights, "
            f"10 ordinary ids that end a completion, so lengths vary with a long tail: median ~250 tokens, mean ~340); "
            f"{outcome['workload']}; `VLLM_CPU_KVCACHE_SPACE=4`. genfleet: one short "
            "worker, `/v1/completions` on the prompt's ids, `stream_interval` 32. The baseline: "
            "`bench/baseline_client.py --api completions` (asyncio + httpx, 150 at once, a chunk per token). "
            "Running and waiting: `vllm:num_requests_running` / `_waiting` from its `/metrics` every 0.1 s; steady "
            "state: while the server's `vllm:generation_tokens_total` went from 10% to 50% of what the side added "
            "(the queue still held prompts). The prefix cache is reset between sides (`/reset_prefix_cache`, dev "
            "mode). The server's step time is the CPU engine's on the 2 cores the clients share: what carries "
            "over is vLLM's scheduler, its stream and its counts.", ""]


def _admission_tables(real: dict, sim: dict) -> list[str]:
    """Per server shape, every configuration on SGLang's scheduler, the sim's ratio beside it."""
    fixed, per_request, per_token = real["step_s"]
    lines = ["### Admission: staged first caps and `--in-flight auto` (the last three figures of section 10)", "",
             f"{real['prompts']} prompts of the seeds' length shape (lognormal, median 646, mean 1,416, cap 10,240), "
             f"scaled by {real['length_scale']:g} in tokens, and so are the caps, the KV sizes and SGLang's estimation "
             "clip (`SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION` 512) and the decode steps over which SGLang's "
             "new_token_ratio falls from 0.7 to 0.098 (`SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS` 75). "
             "**The step time is a model**: the forward patch "
             f"sleeps {fixed * 1000:g} ms + {per_request * 1000:g} ms per request in the batch + "
             f"{per_token * 1e6:g} µs per prefilled token on top of the CPU engine's own step; the admission, "
             "waiting, retraction and continuation are SGLang's. tok/s: the records' tokens ÷ wall; decode: the "
             "server's rate from 10% to 80% of what it decoded; running, waiting, usage: `/v1/loads`, middle 80%; "
             "decoded twice: tokens the scheduler decoded beyond the records'; identical: records equal, token "
             "for token, to the defaults'. Target and first cap: the worker's, every 10 s (second: value); ratio: "
             "the scheduler's new_token_ratio (`sglang:new_token_ratio`, as SGLang last set it at a prefill "
             "batch: at 0 s it may be the previous configuration's on the same server; the sim's own, modelled "
             "on it). "
             "The sim (its own lengths from the same lognormal) shows its tok/s ratio.", ""]
    for shape, measured in real["shapes"].items():
        sim_configs = sim["shapes"][shape]["configs"]
        lines += [f"**{shape}** (`--max-total-tokens {measured['max_total_tokens']:,}`)", "",
                  "| configuration | tok/s | ÷ defaults | sim ÷ defaults | decode tok/s | running | waiting | usage "
                  "| retracted | decoded twice | prefilled | continued | TTFT p50 / p95 | identical | target over time "
                  "| first cap over time | ratio over time |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|---|"]
        for name, c in measured["configs"].items():
            ttft = (f"{c['ttft_p50_s']:.1f} / {c['ttft_p95_s']:.1f} s" if c["ttft_p50_s"] is not None else "—")
            lines.append(
                f"| {name} | {c['tokens_per_s']:,.0f} | {c['tokens_per_s_ratio']:.2f}× | "
                f"{sim_configs[name]['tokens_per_s_ratio']:.2f}× | {c['decode_rate']:,.0f} | {c['running']:.0f} | "
                f"{c['waiting']:.0f} | {format_percent(c['token_usage'])} | {c['retracted_peak']} | "
                f"{c['decoded_twice']:,} | {c['prefilled_tokens']:,} | {c['continued']} | {ttft} | "
                f"{c['identical_records']} of {c['records']} | {_series(c['target_over_time'])} | "
                f"{_series(c['first_cap_over_time'])} | {_series(c.get('ratio_over_time', []))} |")
        lines.append("")
    return lines


def _series(points: list) -> str:
    return " ".join(f"{at}s:{value}" for at, value in points[:12]) or "—"


def splice(existing: str, fresh: str) -> str:
    """`existing` (a whole report) with the sections `fresh` (a report of `--only ...`) measured
    taken from it: their rows of the results table (in numeric order), their notes on missed targets
    and their own sections (10: SGLang's server, 12: vLLM's) replace the old ones; everything else
    is kept, the heading included."""
    def section_of(line: str, prefix: str) -> str | None:
        match = re.match(re.escape(prefix) + r"(\d+)\.\d+[ *]", line)
        return match.group(1) if match else None

    measured = {number for line in fresh.splitlines() if (number := section_of(line, "| "))}
    lines = existing.splitlines()
    for i in reversed(range(len(lines))):  # a missed target's note, and the blank line after it
        if section_of(lines[i], "- **") in measured:
            del lines[i:i + 2 if i + 1 < len(lines) and not lines[i + 1] else i + 1]
    lines = [line for line in lines if section_of(line, "| ") not in measured]
    for number in measured:
        heading = SECTION_HEADINGS.get(number)
        if heading and heading in lines:
            start = lines.index(heading)
            end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
            del lines[start:end]
    for row in (line for line in fresh.splitlines() if section_of(line, "| ")):
        table = [i for i, line in enumerate(lines) if section_of(line, "| ")]
        later = [i for i in table if _row_key(lines[i]) > _row_key(row)]
        lines.insert(later[0] if later else table[-1] + 1, row)
    if new_notes := [line for line in fresh.splitlines() if section_of(line, "- **") in measured]:
        # At the end of the missed targets' notes (a section of their own after the table, where
        # the report had none).
        if MISSED_SECTION not in lines:
            table_end = max(i for i, line in enumerate(lines) if section_of(line, "| "))
            after_table = next(i for i in range(table_end, len(lines)) if lines[i].startswith("## "))
            lines[after_table:after_table] = [MISSED_SECTION, ""]
        missed = lines.index(MISSED_SECTION)
        end = next((i for i in range(missed + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        while lines[end - 1] == "":
            end -= 1
        lines[end:end] = [part for note in new_notes for part in ("", note)]
    methods = lines.index("## How each figure is measured") if "## How each figure is measured" in lines else len(lines)
    fresh_lines = fresh.splitlines()
    for number in sorted(measured, key=int):
        heading = SECTION_HEADINGS.get(number)
        if heading and heading in fresh_lines:
            start = fresh_lines.index(heading)
            end = next((i for i in range(start + 1, len(fresh_lines)) if fresh_lines[i].startswith("## ")),
                       len(fresh_lines))
            lines[methods:methods] = fresh_lines[start:end]
            methods += end - start
    return "\n".join(lines) + "\n"


def _row_key(row: str) -> tuple[int, int]:
    """A results row's number ("| 10.3 | ...") as (10, 3)."""
    section, index = row.split("|")[1].strip().split(".")
    return int(section), int(index)
