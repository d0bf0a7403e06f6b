"""The sweep's arithmetic (bench/sweep.py): which fixed point is best, the ratios auto is judged by,
records compared across the modes of a cell, and the report's figures and section from them."""
from __future__ import annotations

import sys

from helpers.paths import REPO

sys.path.insert(0, str(REPO))

from bench import sweep, sweep_halves  # noqa: E402
from bench.figures import sweep_figures  # noqa: E402

OUTPUTS = {"a": [1, 2, 3], "b": [4, 5]}


def side(rate: float, running: float = 50.0, outputs: dict | None = None) -> dict:
    return {"decode_rate": rate, "tokens_per_s": rate / 2, "running": running, "waiting": 3.0, "token_usage": 0.4,
            "retracted_peak": 0, "decoded_twice": 0, "records": 2, "target_over_time": [(0, 150)],
            "outputs": outputs or OUTPUTS}


def cell(rates: dict[str, list[float]], offline_rate: float = 1000.0, **odd: dict) -> dict:
    runs = {mode.name: [side(rate, outputs=odd.get(mode.name)) for rate in rates.get(mode.name, [500.0, 520.0])]
            for mode in sweep.MODES}
    return sweep.summarize_cell(runs, {"wall_s": 10.0, "completion_tokens": 10_000, "tokens_per_s": offline_rate / 2,
                                       "decode_rate": offline_rate, "outputs": dict(OUTPUTS)})


def test_the_best_fixed_point_and_auto_against_it_and_against_150():
    summary = cell({"fixed 256": [900.0, 1000.0, 800.0], "fixed 150": [600.0, 640.0], "auto": [880.0, 920.0]})
    assert summary["best_fixed"] == "fixed 256"
    assert summary["modes"]["fixed 256"]["decode_rate"] == 900.0  # the median, not the best run
    assert (summary["modes"]["fixed 256"]["min"], summary["modes"]["fixed 256"]["max"]) == (800.0, 1000.0)
    ratios = summary["ratios"]["auto"]
    assert ratios["best_fixed"] == 900.0 / 900.0
    assert ratios["fixed_150"] == 900.0 / 620.0
    assert ratios["offline"] == 900.0 / 1000.0
    assert ratios["fixed_150_wall"] == 450.0 / 310.0  # the wall rates, beside
    assert "auto, ceiling 400" in summary["ratios"]


def test_a_mode_whose_records_differ_counts_its_worst_run():
    summary = cell({}, **{"fixed 64": {"a": [1, 2, 9], "b": [4, 5]}})
    assert summary["modes"]["fixed 64"]["identical"] == 1
    assert summary["modes"]["fixed 400"]["identical"] == 2
    assert summary["offline"]["identical"] == 2 and "outputs" not in summary["offline"]


def outcome(summary: dict, half: str = "sglang") -> dict:
    server = sweep_halves.half_named(half)
    measured = {"server": server.title, "server_key": half, "cap_flag": server.cap_flag,
                "running_cap": server.running_cap,
            "profile": {"repeats": 2, "remedy_prompts": 10}, "workload": "w", "step_s": (0.03, 0.0001, 0.00002),
            "cells": {"short chat, kv-limited": {"flags": " ".join(sweep.server_flags(server, "kv-limited", 500)),
                                                 "max_new_tokens": 128, **summary}},
            "remedy": {"low_cap": 8, "raised_cap": 16, "cap_flag": server.cap_flag, "ratio": 1.8, "wall_ratio": 1.5,
                       "identical": 10,
                       "low": {"decode_rate": 210.0, "tokens_per_s": 200.0, "running": 8, "waiting": 40,
                               "alarm": "server-limited: x", "alarm_after_s": 6.0, "records": 10},
                       "raised": {"decode_rate": 380.0, "tokens_per_s": 360.0, "running": 16, "waiting": 30,
                                  "alarm": None, "records": 10}}}
    return {**measured, "provenance": server.provenance(measured)}


def test_the_figures_judge_auto_as_it_ships_and_explain_a_miss():
    summary = cell({"fixed 400": [1000.0, 1000.0], "fixed 150": [700.0, 700.0], "auto": [700.0, 700.0]})
    figures = sweep_figures(outcome(summary))
    statuses = [(figure.name.split(": ")[-1], figure.status) for figure in figures]
    assert statuses == [("steady tok/s, `--in-flight auto` ÷ the best fixed point", "**missed**"),
                        ("steady tok/s, `--in-flight auto` ÷ fixed 150", "met"),
                        ("steady tok/s raised ÷ capped", "met")]
    assert "fixed 400" in figures[0].note()


def test_the_section_names_every_mode_and_the_offline_ceiling():
    lines = "\n".join(sweep.section_lines(outcome(cell({})), "today", "abc1234"))
    assert sweep.HEADING in lines and "SGLang offline (no HTTP, no client)" in lines
    for mode in sweep.MODES:
        assert f"| {mode.name}" in lines
    assert "Raised ÷ capped 1.80×" in lines and "`server-limited: x`" in lines


def test_the_vllm_half_has_its_own_section_flags_and_offline_row():
    lines = "\n".join(sweep.section_lines(outcome(cell({}), half="vllm"), "today", "abc1234"))
    assert sweep.HEADINGS["vllm"] in lines and sweep.HEADING not in lines
    assert "vLLM offline (no HTTP, no client)" in lines and "| preempted |" in lines
    assert "`--num-gpu-blocks-override 64 --max-num-seqs 500`" in lines
    assert "At `--max-num-seqs 8`" in lines and "--max-running-requests" not in lines
    remedy = sweep_figures(outcome(cell({}), half="vllm"))[-1]
    assert remedy.name.startswith("A server capped at `--max-num-seqs 8`"), remedy.name


def test_only_sweep_runs_both_halves():
    import bench.run as bench_run

    argv = sys.argv
    try:
        sys.argv = ["run.py", "--only", "sweep,real", "--out", "/dev/null"]
        _, only = bench_run._parse_args()
    finally:
        sys.argv = argv
    assert only == ["sweep-sglang", "sweep-vllm", "real"]


def test_a_missed_cell_names_what_its_own_server_did_when_the_kv_ran_out():
    summary = cell({"fixed 128": [1000.0, 1000.0], "fixed 150": [900.0, 900.0], "auto": [800.0, 800.0]})
    summary["modes"]["auto"]["retracted"] = 6
    notes = {half: sweep_figures(outcome(summary, half=half))[0].note() for half in ("sglang", "vllm")}
    assert "SGLang retracted 6 under auto" in notes["sglang"]
    assert "vLLM preempted 6 under auto" in notes["vllm"] and "SGLang" not in notes["vllm"]


def test_a_capped_servers_runs_give_medians_and_the_soonest_alarm():
    def run(rate: float, alarm: str | None, after: float | None) -> dict:
        return {"decode_rate": rate, "tokens_per_s": rate / 2, "running": 8, "waiting": 40, "token_usage": 0.01,
                "records": 10, "alarm": alarm, "alarm_after_s": after}

    side = sweep.remedy_side([run(700.0, None, None), run(800.0, "server-limited: late", 20.0),
                              run(900.0, "server-limited: soon", 6.0)])
    assert (side["decode_rate"], side["min"], side["max"]) == (800.0, 700.0, 900.0)
    assert (side["alarm"], side["alarm_after_s"], side["alarmed"]) == ("server-limited: soon", 6.0, "2 of 3")
    measured = outcome(cell({}))
    measured["remedy"].update(repeats=2, low={**measured["remedy"]["low"], **side})
    lines = "\n".join(sweep.section_lines(measured, "today", "abc1234"))
    assert "each cap 2 time(s)" in lines and "800 steady tok/s (700 – 900)" in lines
    assert "an alarm in 2 of 3 runs" in lines
