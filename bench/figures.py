"""The figures of `make bench`: each a median over the runs, its target and, for a missed target,
the note that says why (`bench/target_notes.py`). Each figure's target is set here."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from statistics import median

from bench import target_notes
from bench.scaling import Scaling
from bench.target_notes import ThroughputMedians
from bench.throughput import SLOTS, Comparison

MB = 1e6


@dataclass
class Figure:
    name: str
    values: list[float]  # one per run
    fmt: Callable[[float], str]
    detail: str = ""
    target: str = "—"
    meets: Callable[[float], bool] | None = None
    note: Callable[[], str] | None = None  # why it missed and what would fix it

    @property
    def median(self) -> float:
        return median(self.values)

    @property
    def status(self) -> str:
        if self.meets is None:
            return ""
        return "met" if self.meets(self.median) else "**missed**"

    def cell(self) -> str:
        text = self.fmt(self.median)
        if len(self.values) > 1:
            text += f" ({self.fmt(min(self.values))} – {self.fmt(max(self.values))})"
        return text


def format_ratio(v: float) -> str:
    return f"{v:.2f}×"


def format_percent(v: float) -> str:
    return f"{100 * v:.1f}%"


def throughput_figures(runs: list[Comparison]) -> tuple[list[Figure], list[Figure]]:
    """Section 1 (throughput, occupancy, wall time) and section 2 (CPU per token, peak RSS)."""
    medians = ThroughputMedians.of(runs)
    return _speed_figures(runs, medians), _cost_figures(runs, medians)


def _speed_figures(runs: list[Comparison], m: ThroughputMedians) -> list[Figure]:
    return [
        Figure("Throughput, genfleet ÷ baseline (completion tokens/s over the wall time)",
               [c.throughput_ratio for c in runs], format_ratio,
               detail=f"genfleet {m.genfleet_tok_s:,.0f} tok/s, baseline {m.baseline_tok_s:,.0f} tok/s",
               target="≥ 1.0×", meets=lambda v: v >= 1.0, note=partial(target_notes.throughput_note, m)),
        Figure("Steady-state occupancy, genfleet (time-averaged running ÷ 150)", m.genfleet_occupancies,
               format_percent, detail=f"baseline {m.baseline_occupancy:.1%}", target="≥ 99%",
               meets=lambda v: v >= 0.99, note=partial(target_notes.occupancy_note, m)),
        Figure("Wall time, genfleet ÷ baseline", [c.wall_ratio for c in runs], format_ratio,
               detail=f"{median([c.genfleet.wall_s for c in runs]):.1f} s vs "
                      f"{median([c.baseline.wall_s for c in runs]):.1f} s"),
    ]


def _cost_figures(runs: list[Comparison], m: ThroughputMedians) -> list[Figure]:
    rss = [c.genfleet.client_peak_rss_bytes / MB for c in runs]
    fewer = "" if m.peak_running >= SLOTS else f" (fewer than {SLOTS})"
    return [
        Figure("CPU per generated token, worker process ÷ baseline process", [c.cpu_ratio for c in runs],
               format_ratio,
               detail=f"{m.genfleet_cpu_us_per_token:.1f} vs {m.baseline_cpu_us_per_token:.1f} µs/token",
               target="≤ 0.20×", meets=lambda v: v <= 0.20, note=partial(target_notes.cpu_note, m)),
        Figure(f"Peak RSS of a worker with {SLOTS} streams (VmHWM)", rss, lambda v: f"{v:,.0f} MB",
               detail=f"streams in flight at peak: {m.peak_running}{fewer}",
               target="≤ 400 MB", meets=lambda v: v <= 400, note=target_notes.rss_note),
    ]


def onebox_figures(runs: list[dict]) -> list[Figure]:
    """Section 11: `genfleet run` on one host, start-up included, against the seeds' script."""
    return [
        Figure("Wall time, `genfleet run` (one command, start-up and shutdown included) ÷ the script",
               [r["wall_ratio"] for r in runs], format_ratio,
               detail=f"{median([r['onebox_wall_s'] for r in runs]):.1f} s vs "
                      f"{median([r['baseline_wall_s'] for r in runs]):.1f} s, {runs[0]['prompts']:,} prompts",
               target="≤ 1.0×", meets=lambda v: v <= 1.0, note=target_notes.onebox_note),
        Figure("Time from `genfleet run` to its first record on disk", [r["first_record_s"] for r in runs],
               lambda v: f"{v:.1f} s"),
    ]


def enqueue_figures(runs: list[dict]) -> list[Figure]:
    alone = median([r["enqueue_per_s"] for r in runs])
    end_to_end = median([r["end_to_end_per_s"] for r in runs])
    prompts = runs[0]["prompts"]
    return [Figure(f"Enqueue rate, {prompts:,} short prompts (templating and counting included, "
                   "process start included)",
                   [r["end_to_end_per_s"] for r in runs], lambda v: f"{v:,.0f} prompts/s",
                   detail=f"enqueue alone {alone:,.0f}/s", target="≥ 10,000/s", meets=lambda v: v >= 10_000,
                   note=partial(target_notes.enqueue_note, end_to_end, alone)),
            *chat_enqueue_figures(runs)]


def chat_enqueue_figures(runs: list[dict]) -> list[Figure]:
    """The same chat-length prompts through a custom-code tokenizer (Kimi-K2.5's shape, a Python
    tokenizer templated in processes) and a fast one (Qwen3's), where the run measured them."""
    chats = [r["chat"] for r in runs if r.get("chat")]
    if not chats:
        return []
    figures = []
    for shape, kind, target in (("kimi-k2.5", "custom-code tokenizer (Kimi-K2.5's shape: tiktoken, "
                                 "tokenization_kimi.py)", 1_000), ("qwen3", "fast tokenizer (Qwen3's shape)", None)):
        rates = [chat[shape] for chat in chats if shape in chat]
        if not rates:
            continue
        first = rates[0]
        tokens = first.get("mean_prompt_tokens")
        mean = f" (~{tokens:,} tokens)" if tokens else ""
        figures.append(Figure(
            f"Enqueue rate, {first['prompts']:,} chat-length prompts{mean}, {kind}, process start included",
            [r["end_to_end_per_s"] for r in rates], lambda v: f"{v:,.0f} prompts/s",
            detail=f"enqueue alone {median([r['enqueue_per_s'] for r in rates]):,.0f}/s",
            target=f"≥ {target:,}/s" if target else "—",
            meets=(lambda v, t=target: v >= t) if target else None))
    return figures


def scaling_figures(runs: list[Scaling]) -> list[Figure]:
    figures = []
    counts = [r.hosts for r in runs[0].results if r.hosts != 1]
    for hosts in counts:
        tps = median([next(r.tokens_per_s for r in s.results if r.hosts == hosts) for s in runs])
        occ = median([next(r.occupancy for r in s.results if r.hosts == hosts) for s in runs])
        own = median([next(r.own_cores for r in s.results if r.hosts == hosts) for s in runs])
        busy = median([next(r.machine_busy_cores for r in s.results if r.hosts == hosts) for s in runs])
        one = median([next(r.tokens_per_s for r in s.results if r.hosts == 1) for s in runs])
        target = hosts == 4  # the one host count with a target
        figures.append(Figure(
            f"Scaling, {hosts} hosts ÷ 1 host (steady-state tokens/s)",
            [s.relative(hosts) for s in runs], format_ratio,
            detail=f"{tps:,.0f} vs {one:,.0f} tok/s; occupancy {occ:.1%}; {own:.2f} cores used by the fleet",
            target="≥ 3.9×" if target else "—", meets=(lambda v: v >= 3.9) if target else None,
            note=partial(target_notes.scaling_note, hosts, occ, own, busy) if target else None))
    return figures


def export_figures(export: dict) -> list[Figure]:
    main = export["main"]
    small = next((v for v in export["variants"] if v["records"] and v["records"] < main["records"]), None)
    flat = f"; {small['records']:,} records: {small['peak_rss_mb']:,.0f} MB" if small else ""
    return [
        Figure(f"Export rate, {main['records']:,} small records (`genfleet export --format specforge`)",
               [main["records_per_s"]], lambda v: f"{v:,.0f} records/s", detail=f"{main['seconds']} s; 1 run"),
        Figure(f"Export peak memory, {main['records']:,} records (ru_maxrss)", [main["peak_rss_mb"]],
               lambda v: f"{v:,.0f} MB", detail=f"1 run{flat}"),
    ]


def useful_token_figures(runs: list[dict], guard: dict | None) -> list[Figure]:
    """GPU tokens and wall time of the loop guard + continuation against the naive policy, and the
    loop guard's own cost (bench/useful_tokens.py, bench/loop_guard.py)."""
    def side(name: str, key: str) -> float:
        return median([run["results"][name][key] for run in runs])

    same = all(run["same_useful_output"] for run in runs)
    figures = [
        Figure("GPU tokens per useful output, `--loop-guard abort --on-truncated continue` ÷ `--loop-guard off "
               "--on-truncated regenerate`", [run["gpu_tokens_ratio"] for run in runs], format_ratio,
               detail=f"{side('genfleet', 'gpu_tokens'):,.0f} vs {side('naive', 'gpu_tokens'):,.0f} tokens decoded "
                      f"for {side('genfleet', 'useful_tokens'):,.0f} useful; same useful output: "
                      f"{'yes' if same else '**no**'}",
               target="≤ 0.70×", meets=lambda v: v <= 0.70 and same),
        Figure("Wall time, the same two policies", [run["wall_ratio"] for run in runs], format_ratio,
               detail=f"{side('genfleet', 'wall_s'):.1f} s vs {side('naive', 'wall_s'):.1f} s"),
    ]
    if guard is not None:
        ns, late = guard["ns_per_token"], guard["overrun_tokens"]
        figures.append(Figure("Loop guard CPU per token (chunks of 32 ids)", [ns["chunk_32"]],
                              lambda v: f"{v:,.0f} ns", detail=f"chunks of 1: {ns['chunk_1']:,.0f} ns; text "
                              f"(chat API): {ns['text_chunk_8']:,.0f} ns; 1 run"))
        figures.append(Figure(f"Loop found, tokens past the repetition's start (periods {late['periods']})",
                              [late["max"]], lambda v: f"max {v:,.0f}",
                              detail=f"median {late['median']:,.0f}; bound {late['bound']}",
                              target="≤ 600", meets=lambda v: v <= 600))
    return figures


def control_figures(control: dict) -> list[Figure]:
    """The control plane's cost per completion and its ceilings (bench/control_plane.py, run once)."""
    m = control["model"]
    big, fit, plan = m["runs"][-1], m["queue_fit"], m["plan"]
    top = ", ".join(f"{name} {us:.0f} µs" for name, us in list(big["usec"].items())[:4])
    flower = m["ceilings"].get("flower_tasks_per_s")
    redis_cores = ", ".join(f"{part.replace('_', ' ')} {cores:.2f}" for part, cores in plan["redis_cores"].items())
    figures = [
        Figure("Completions/s one Redis core sustains (1 ÷ Redis CPU per completion, enqueue to ack, idle "
               "rate taken out)", [m["ceilings"]["redis_completions_per_core"]], lambda v: f"{v:,.0f}/s",
               detail=f"{big['redis_cpu_us_marginal']:.0f} µs and {big['commands_marginal']:.1f} commands per "
                      f"completion ({m['enqueue_commands']:.1f} at enqueue); inside commands: {top}; 1 run",
               target="≥ 2,000/s", meets=lambda v: v >= 2000,
               note=lambda: f"Redis CPU per completion is {big['redis_cpu_us_marginal']:.0f} µs; the commands "
                            f"that take it: {top}. See docs/scaling.md."),
        Figure("Redis memory retained per finished prompt, beyond a fixed amount per run (used_memory after "
               f"the drain, {m['runs'][0]['prompts']:,} vs {big['prompts']:,} prompts)", [m["retained"]["slope"]],
               lambda v: f"{v:.2f} B", detail=f"the run's keys alone: {m['retained_keys']['slope']:.2f} B per "
               f"prompt beyond {m['retained_keys']['fixed']:,.0f} B; slowlog and per-command latency histograms "
               f"(bounded, not per prompt) freed first: with them {m['retained_with_fixed']['slope']:.1f} B",
               target="≤ 1 B", meets=lambda v: v <= 1.0,
               note=lambda: "the keys each run leaves, by pattern, are in the raw JSON (`keys_after`)"),
        Figure("Redis memory per queued prompt (used_memory, no worker)", [fit["a"]],
               lambda v: f"{v:,.0f} B + {fit['b']:.1f} B/token",
               detail=f"the message on the wire: {fit['wire_a']:,.0f} B + {fit['wire_b']:.1f} B/token"),
        Figure("Worker CPU per task, control plane (20-60-token completions)",
               [big["cpu_ms_marginal"]["worker"]], lambda v: f"{v:.2f} ms",
               detail=f"{m['ceilings']['worker_tasks_per_core']:,.0f} tasks/s per core"),
        Figure("Redis cores for 10M prompts on 100 hosts in a day", [plan["redis_cores_total"]],
               lambda v: f"{v:.2f}", detail=f"{plan['completions_per_s']:.0f} completions/s: {redis_cores}"),
    ]
    if flower:
        figures.insert(3, Figure(
            "Tasks/s one Flower process keeps up with (1 ÷ its CPU per task)", [flower], lambda v: f"{v:,.0f}/s",
            detail=f"{big['cpu_ms_marginal']['flower']:.2f} ms per task; {big['task_events']:.1f} events per "
                   f"task in {big['event_publishes']:.2f} PUBLISHes; the target fleet sends "
                   f"{plan['flower']['events_per_s']:,.0f} events/s"))
    return figures


def affinity_figures(outcome: dict) -> list[Figure]:
    """Prefix-affinity routing ÷ least-busy routing, per host count (bench/affinity.py)."""
    figures = []
    for hosts, ratio in outcome["ratios"].items():
        by_mode = {r["mode"]: r for r in outcome["results"] if str(r["hosts"]) == str(hosts)}
        a, b = by_mode["affinity"], by_mode["least-busy"]
        figures.append(Figure(
            f"Prefill tokens, affinity ÷ least-busy routing, {hosts} hosts", [ratio["prefill_tokens"]],
            format_ratio, detail=f"{a['prefill_tokens']:,} vs {b['prefill_tokens']:,} of {a['prompt_tokens']:,} "
                                 "prompt tokens; 1 run", target="≤ 0.50×", meets=lambda v: v <= 0.5,
            note=partial(target_notes.affinity_note, int(hosts), a["cached_share"], b["cached_share"])))
        figures.append(Figure(
            f"Wall time, affinity ÷ least-busy routing, {hosts} hosts", [ratio["wall"]], format_ratio,
            detail=f"{a['wall_s']:.1f} s vs {b['wall_s']:.1f} s; mean running {a['mean_running']:.0f} vs "
                   f"{b['mean_running']:.0f}", target="≤ 0.90×", meets=lambda v: v <= 0.9))
    return figures


def shared_tail_figures(outcome: dict) -> list[Figure]:
    """Two runs on one host sharing the fleet (B enqueued as A's tail begins) against one after the
    other (bench/shared_tail.py, run once)."""
    apart, shared = outcome["cases"]["apart"], outcome["cases"]["shared"]

    def walls(case: dict) -> str:
        return f"A {case['run_walls']['A']:.1f} s, B {case['run_walls']['B']:.1f} s"

    return [
        Figure("Wall time of two runs on one host, B enqueued as A's tail begins ÷ one after the other",
               [outcome["wall_ratio"]], format_ratio,
               detail=f"{shared['wall_s']:.1f} s vs {apart['wall_s']:.1f} s; each run's own: {walls(shared)} "
                      f"sharing vs {walls(apart)} apart; 1 run"),
        Figure("Whole-job occupancy of the two runs, sharing the fleet (mean running ÷ 150, first enqueue to "
               "last record)", [shared["job_occupancy"]], format_percent,
               detail=f"one after the other {format_percent(apart['job_occupancy'])}; mean running in A's tail "
                      f"(its last {apart['a_tail_s']:.1f} s when alone): {apart['tail_mean_running']:.0f} alone, "
                      f"{shared['tail_mean_running']:.0f} with B's prompts; 1 run"),
    ]


def real_server_figures(outcome: dict) -> list[Figure]:
    """On SGLang 0.5.23's own server (bench/real_server.py, run once), each with the simulator's
    figure for the same workload in its detail: where they disagree, this is the one to quote."""
    figures = []
    measured = outcome["measurements"]
    if "throughput" in measured:
        real, sim = measured["throughput"]["real"], measured["throughput"]["sim"]
        figures += [
            Figure("Throughput on SGLang's own server, genfleet ÷ baseline", [real["throughput_ratio"]], format_ratio,
                   detail=f"{real['genfleet']['tokens_per_s']:,.0f} vs {real['baseline']['tokens_per_s']:,.0f} tok/s "
                          f"(CPU engine: client and server share 2 cores); same tokens: "
                          f"{'yes' if real['same_tokens'] else 'no'}; "
                          f"sim, same prompts: {sim['throughput_ratio']:.2f}×",
                   target="≥ 1.0×", meets=lambda v: v >= 1.0),
            Figure("Occupancy on SGLang's own server (its running count ÷ 150, middle 80% of the run)",
                   [real["occupancy"]], format_percent,
                   detail=f"baseline {format_percent(real['baseline_occupancy'])}; sim: genfleet "
                          f"{format_percent(sim['occupancy'])}, baseline {format_percent(sim['baseline_occupancy'])}; "
                          "over the wall time, ramp and drain included: not the steady state of 1.2"),
        ]
    if "affinity" in measured:
        real, sim = measured["affinity"]["real"], measured["affinity"]["sim"]
        a, b = real["affinity"], real["least-busy"]
        figures += [
            Figure("Prefill tokens on SGLang's own radix cache, affinity ÷ least-busy, 2 hosts, `--samples 4`",
                   [real["prefill_ratio"]], format_ratio,
                   detail=f"{a['prefilled_tokens']:,} vs {b['prefilled_tokens']:,} prefilled of {a['prompt_tokens']:,} "
                          f"prompt tokens (the scheduler's extend rows); by the records' cached_tokens "
                          f"{real['reported_prefill_ratio']:.2f}×; sim, same prompts: {sim['prefill_ratio']:.2f}×",
                   target="≤ 0.50×", meets=lambda v: v <= 0.5),
            Figure("Wall time on SGLang's own server, affinity ÷ least-busy, 2 hosts", [real["wall_ratio"]],
                   format_ratio, detail=f"{a['wall_s']:.1f} s vs {b['wall_s']:.1f} s; sim: {sim['wall_ratio']:.2f}×",
                   target="≤ 0.90×", meets=lambda v: v <= 0.9),
        ]
    if "loops" in measured:
        real, sim = measured["loops"]["real"], measured["loops"]["sim"]
        figures.append(Figure(
            "Tokens SGLang's scheduler decoded, `--loop-guard abort` ÷ `off`, a quarter of the prompts looping",
            [real["decoded_ratio"]], format_ratio,
            detail=f"{real['abort']['decoded_tokens']:,} vs {real['off']['decoded_tokens']:,}; {real['looped']} "
                   f"stopped as loops; the {real['stopped']} that stop by themselves identical: "
                   f"{'yes' if real['stopped_records_identical'] else 'no'}; wall {real['wall_ratio']:.2f}×; "
                   f"sim, same prompts (its own loops, `--loop-rate 0.25`): {sim['decoded_ratio']:.2f}×"))
    if "admission" in measured:
        figures += admission_figures(measured["admission"]["real"], measured["admission"]["sim"])
    return figures


def admission_figures(real: dict, sim: dict) -> list[Figure]:
    """Staged caps and `--in-flight auto` on SGLang's own scheduler (bench/admission.py): the two
    targets of each server shape, and the worst of the new modes against the defaults."""
    def config(outcome: dict, shape: str, name: str) -> dict:
        return outcome["shapes"][shape]["configs"][name]

    kv_new, kv_sim = config(real, "kv-limited", "staged, auto"), config(sim, "kv-limited", "staged, auto")
    kv_base = config(real, "kv-limited", "full cap, fixed 150")
    over = config(real, "over-provisioned", "full cap, auto")
    over_sim = config(sim, "over-provisioned", "full cap, auto")
    over_base = config(real, "over-provisioned", "full cap, fixed 150")
    worst = min(((shape, name, figures["tokens_per_s_ratio"]) for shape, measured in real["shapes"].items()
                 for name, figures in measured["configs"].items()), key=lambda one: one[2])
    records = real["prompts"]
    return [
        Figure("KV-limited SGLang: tok/s, staged caps + `--in-flight auto` ÷ full cap + fixed 150",
               [kv_new["tokens_per_s_ratio"]], format_ratio,
               detail=f"{kv_new['tokens_per_s']:,.0f} vs {kv_base['tokens_per_s']:,.0f} tok/s (step time modelled); "
                      f"running {kv_new['running']:.0f} vs {kv_base['running']:.0f}; records identical "
                      f"{kv_new['identical_records']} of {records}; sim: {kv_sim['tokens_per_s_ratio']:.2f}×",
               target="≥ 1.50×", meets=lambda v: v >= 1.5,
               note=partial(target_notes.kv_limited_note, real)),
        Figure("Over-provisioned SGLang: tok/s, `--in-flight auto` (ceiling 400) ÷ fixed 150",
               [over["tokens_per_s_ratio"]], format_ratio,
               detail=f"{over['tokens_per_s']:,.0f} vs {over_base['tokens_per_s']:,.0f} tok/s; running "
                      f"{over['running']:.0f} vs {over_base['running']:.0f}; decode rate while work waited "
                      f"{over['decode_rate_ratio'] or 0:.2f}×; sim: {over_sim['tokens_per_s_ratio']:.2f}×",
               target="≥ 1.20×", meets=lambda v: v >= 1.2,
               note=partial(target_notes.over_provisioned_note, real)),
        Figure("Slowest new mode ÷ the defaults, either shape", [worst[2]], format_ratio,
               detail=f"{worst[1]} on the {worst[0]} server", target="≥ 0.95× (noise)", meets=lambda v: v >= 0.95),
    ]


def vllm_server_figures(outcome: dict) -> list[Figure]:
    """On vLLM 0.32.0's own server (bench/vllm_server.py, run once): genfleet against the script,
    and `--in-flight auto` against a fixed 150 on two server shapes."""
    figures = []
    measured = outcome["measurements"]
    if "throughput" in measured:
        tp = measured["throughput"]
        fleet, base = tp["genfleet"], tp["baseline"]
        figures += [
            Figure("Throughput on vLLM's own server, genfleet ÷ baseline", [tp["throughput_ratio"]], format_ratio,
                   detail=f"{fleet['tokens_per_s']:,.0f} vs {base['tokens_per_s']:,.0f} tok/s, {fleet['records']:,} "
                          f"prompts (CPU engine: client and server share 2 cores; `--max-num-seqs 256`); same tokens: "
                          f"{'yes' if tp['same_tokens'] else 'no'}",
                   target="≥ 1.0×", meets=lambda v: v >= 1.0, note=partial(target_notes.vllm_throughput_note, tp)),
            Figure("Occupancy on vLLM's own server at steady state (its running count ÷ 150, from 10% to 50% of the "
                   "tokens it generated)", [tp["occupancy"]], format_percent,
                   detail=f"baseline {format_percent(tp['baseline_occupancy'])}; waiting "
                          f"{fleet['mean_waiting']:.1f}; over the middle 80% of the wall time: "
                          f"{format_percent(tp['wall_occupancy'])} vs {format_percent(tp['baseline_wall_occupancy'])}; "
                          "with completions a fifth as long (40 stop ids, median 53 tokens, cap 256; 5aeed9c): "
                          "97.3% vs 97.2%, the handover's step per completion",
                   target="≥ 99%", meets=lambda v: v >= 0.99, note=partial(target_notes.vllm_occupancy_note, tp)),
        ]
    for shape, measured_shape in (measured.get("admission") or {}).items():
        fixed, auto = measured_shape["fixed 150"], measured_shape["auto"]
        figures.append(Figure(
            f"vLLM, {shape} (`--max-num-seqs {measured_shape['max_num_seqs']}`): tok/s, `--in-flight auto` "
            "(ceiling 400) ÷ fixed 150", [measured_shape["tokens_ratio"]], format_ratio,
            detail=f"{auto['tokens_per_s']:,.0f} vs {fixed['tokens_per_s']:,.0f} tok/s; running "
                   f"{auto['steady_running']:.0f} vs {fixed['steady_running']:.0f}, waiting {auto['mean_waiting']:.0f} "
                   f"vs {fixed['mean_waiting']:.0f}; preemptions {auto['server'].get('preemptions', 0)} vs "
                   f"{fixed['server'].get('preemptions', 0)}; records identical {measured_shape['identical']:,} of "
                   f"{measured_shape['records']:,}"))
    return figures


def sweep_figures(outcome: dict) -> list[Figure]:
    """Sections 13 and 14 (bench/sweep.py, run once per server): per cell, `--in-flight auto` as it
    ships against the best fixed point and against a fixed 150; then a capped server raised as
    `status` advised."""
    figures = []
    server_key = outcome.get("server_key", "sglang")
    for name, cell in outcome["cells"].items():
        shipped, raised = cell["ratios"]["auto"], cell["ratios"][f"auto, ceiling {400}"]
        auto, best = cell["modes"]["auto"], cell["modes"][cell["best_fixed"]]
        note = partial(target_notes.sweep_note, server_key, name, cell)
        figures += [
            Figure(f"Sweep, {name}: steady tok/s, `--in-flight auto` ÷ the best fixed point",
                   [shipped["best_fixed"]], format_ratio,
                   detail=f"{auto['decode_rate']:,.0f} vs {best['decode_rate']:,.0f} tok/s ({cell['best_fixed']}); "
                          f"wall {shipped['best_fixed_wall']:.2f}×; "
                          f"running {auto['running']:.0f} vs {best['running']:.0f}, waiting {auto['waiting']:.0f} vs "
                          f"{best['waiting']:.0f}; ceiling 400: {raised['best_fixed']:.2f}×; ÷ engine offline "
                          f"{shipped['offline']:.2f}× (ceiling 400: {raised['offline']:.2f}×)",
                   target="≥ 0.95×", meets=lambda v: v >= 0.95, note=note),
            Figure(f"Sweep, {name}: steady tok/s, `--in-flight auto` ÷ fixed 150", [shipped["fixed_150"]],
                   format_ratio,
                   detail=f"wall {shipped['fixed_150_wall']:.2f}×; ceiling 400: {raised['fixed_150']:.2f}×; records "
                          "identical across modes: "
                          f"{min(m['identical'] for m in cell['modes'].values())} of {auto['records']} (offline "
                          f"{cell['offline']['identical']})",
                   target="≥ 1.0×", meets=lambda v: v >= 1.0, note=note),
        ]
    if remedy := outcome.get("remedy"):
        low = remedy["low"]
        alarmed = f" (in {low['alarmed']} runs)" if "alarmed" in low else ""
        figures.append(Figure(
            f"A server capped at `{remedy.get('cap_flag', '--max-running-requests')} {remedy['low_cap']}`, "
            "restarted with "
            f"{remedy['raised_cap']} as `status` advised: steady tok/s raised ÷ capped", [remedy["ratio"]],
            format_ratio,
            detail=f"{remedy['raised']['decode_rate']:,.0f} vs {low['decode_rate']:,.0f} tok/s (wall "
                   f"{remedy['wall_ratio']:.2f}×); the alarm after "
                   f"{low['alarm_after_s'] or 0:.0f} s: {'named the flag' if low['alarm'] else 'none'}{alarmed}; "
                   "records "
                   f"identical {remedy['identical']} of {remedy['raised']['records']}",
            target="≥ 1.3×", meets=lambda v: v >= 1.3))
    return figures
