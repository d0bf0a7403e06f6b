"""`genfleet status`'s table fits the width it is printed at (rich consoles of 80 to 200 columns,
recorded): no line is longer, each dataset keeps its name and numbers on one line, long names are
ellipsised, the least needed columns go first where the width is short and a caption names them;
`--wide` keeps every column and exact counts. Snapshots are built by hand, with a million-prompt
run's numbers."""
from __future__ import annotations

import io
import sys

import pytest
from rich.console import Console

from genfleet.status.eta import FLEET, OWN, Eta
from genfleet.status.read_model import (
    DatasetProgress,
    DatasetStatus,
    LengthStats,
    PartitionStatus,
    RunProgress,
    RunStatus,
    Throughput,
    UpstreamStatus,
)
from genfleet.status.render import STATUS_WIDTH, WIDE_WIDTH, fitted_dataset_table, render, short_count, status_console

BUSY = {"1m": Throughput(12_345.0, 123_456.0, 40.0, 12_345.0, 3.0, 0.0), "10m": Throughput(11_000.0, 99_000.0, 41.0,
                                                                                         110_000.0, 20.0, 0.0)}
LONG_NAME = "math_olympiad_reasoning_traces_v3_deduplicated_filtered_by_length_2024_12"
# name -> (total, done, failed); the names' lengths vary from 4 to 74 characters
DATASETS = {
    "chat": (1_000_000, 1_000_000, 0),
    "code_contests_python_and_cpp": (1_000_000, 812_345, 1_234),
    LONG_NAME: (250_000, 99_999, 17),
    "webtext_multilingual_cleaned_v2_en_de_fr_es_it_pt_nl_pl_ja_zh": (2_500_000, 5, 0),
    **{f"synthetic_dialogues_shard_{n:02d}": (40_000, 1_000 * n, n) for n in range(1, 9)},
}
# What a row shows in `done/total` and `%` (done rounded down: 99.9 until every prompt is done).
SHOWN = {"chat": ("1.00M/1.00M", "100.0"), "code_contests_python_and_cpp": ("812.3k/1.00M", "81.2"),
         LONG_NAME: ("99,999/250.0k", "39.9"), "webtext_multilingual_cleaned_v2_en_de_fr_es_it_pt_nl_pl_ja_zh":
         ("5/2.50M", "0.0"), "synthetic_dialogues_shard_03": ("3,000/40,000", "7.5")}


def progress(name: str, total: int, done: int, failed: int) -> DatasetProgress:
    return DatasetProgress(dataset=name, total=total, done=done, failed=failed, rejected=3, skipped=0,
                           prompt_tokens=50 * done, completion_tokens=900 * done, reasoning_tokens=400 * done,
                           truncated=done // 9, empty_reasoning=done // 40, empty_content=0, aborted=0, integrity=0,
                           looped=done // 70, looped_tokens=16_000 * (done // 70))


def row(d: DatasetProgress, eta: Eta | None) -> DatasetStatus:
    return DatasetStatus(d, {"short": d.done // 3, "long": d.done - d.done // 3}, 64, BUSY,
                         LengthStats(d.done, 850.0, 900.0, 15_000.0), eta)


def big_run() -> RunStatus:
    datasets = [progress(name, *numbers) for name, numbers in DATASETS.items()]
    run = RunProgress("prod-2024-12-01", datasets, {"short": 1_500_000, "long": 250_000}, 2_048)
    slow = Eta(3_900.0, 5_000.0, 7_900.0, FLEET, 12)  # "65m–2h11m*"
    rows = [row(d, None if d.finished else slow) for d in datasets]
    return RunStatus(run="prod-2024-12-01", time=1_000.0, progress=run, datasets=rows,
                     partitions=[PartitionStatus("short", 1_500_000, 1_536, 1_536, 24, BUSY),
                                 PartitionStatus("long", 250_000, 512, 512, 8, BUSY)],
                     upstreams=[UpstreamStatus("http://10.0.0.7:30000", 32, 0, 2_048)], workers=32,
                     created_at=0.0, first_finished=10.0, last_finished=999.0,
                     totals=row(run.totals(), Eta(86_000.0, 90_000.0, 120_000.0, OWN, 1_000)))


def printed(status: RunStatus, width: int, *, wide: bool = False) -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(render(status, wide=wide))
    return console.export_text().splitlines()


def row_line(lines: list[str], name: str) -> str:
    """The one line whose first cell is `name`, whole or ellipsised in the middle to 12 characters or more."""
    def names(cell: str) -> bool:
        head, mark, tail = cell.partition("…")
        return cell == name or (bool(mark) and len(cell) >= 12 and name.startswith(head) and name.endswith(tail))
    found = [line for line in lines if len(cells := line.split()) > 2 and names(cells[0]) and "/" in cells[1]]
    assert len(found) == 1, f"{name}:\n" + "\n".join(lines)
    return found[0]


def shown_columns(width: int) -> list[str]:
    return [column.header.replace("\n", " ") for column in fitted_dataset_table(big_run()).fit(width).columns]


@pytest.mark.parametrize("width", [80, 100, 120, 200])
def test_every_line_fits_the_width_and_every_dataset_keeps_its_numbers_on_one_line(width):
    lines = printed(big_run(), width)
    assert max(len(line) for line in lines) <= width
    for name in DATASETS:
        row_line(lines, name)
    for name, (done_total, percent) in SHOWN.items():
        assert row_line(lines, name).split()[1:3] == [done_total, percent]
    assert row_line(lines, "chat").split()[-1] == "done"
    assert row_line(lines, "code_contests_python_and_cpp").split()[-1] == "65m–2h11m*"
    totals = row_line(lines, "all").split()
    assert totals[1:3] == ["1.95M/5.07M", "38.4"]  # 1,948,349 of 5,070,000


@pytest.mark.parametrize("width", [80, 100, 120])
def test_a_long_name_is_ellipsised_in_the_middle_not_wrapped(width):
    lines = printed(big_run(), width)
    name = row_line(lines, LONG_NAME).split()[0]
    head, _, tail = name.partition("…")
    assert len(name) < len(LONG_NAME) and LONG_NAME.startswith(head) and LONG_NAME.endswith(tail) and tail


def test_names_that_differ_only_at_their_end_stay_apart_when_shortened():
    lines = printed(big_run(), 80)
    shards = [row_line(lines, f"synthetic_dialogues_shard_{n:02d}").split()[0] for n in range(1, 9)]
    assert len(set(shards)) == 8 and all("…" in shard for shard in shards)


def test_at_200_columns_the_longest_name_is_whole():
    assert row_line(printed(big_run(), 200), LONG_NAME).split()[0] == LONG_NAME


@pytest.mark.parametrize("width", [100, 120, 200])
def test_from_100_columns_every_default_column_is_shown(width):
    lines = printed(big_run(), width)
    assert shown_columns(width) == ["dataset", "done/total", "%", "failed", "req/min 1m", "tok/s 1m", "trunc %",
                                    "loop %", "empty reas. %", "ETA"]
    assert not any("hidden at" in line for line in lines)
    cells = row_line(lines, "code_contests_python_and_cpp").split()
    # done/total, %, failed, req/min, tok/s, trunc %, loop %, empty reas. %, ETA
    assert cells[1:] == ["812.3k/1.00M", "81.2", "1,234", "12,345", "123.5k", "11.1", "1.4", "2.5", "65m–2h11m*"]


def test_at_80_columns_the_loop_and_empty_reasoning_shares_and_req_per_min_go_first_named_in_a_caption():
    lines = printed(big_run(), 80)
    assert shown_columns(80) == ["dataset", "done/total", "%", "failed", "tok/s 1m", "trunc %", "ETA"]
    assert " ".join(lines).count("req/min 1m, loop %, empty reas. %: hidden at 80 columns (--wide shows every") == 1
    assert any(line.startswith("ALARM") for line in lines)  # the shares' alarms still show


def test_at_60_columns_progress_throughput_and_eta_remain():
    lines = printed(big_run(), 60)
    assert max(len(line) for line in lines) <= 60
    assert shown_columns(60) == ["dataset", "done/total", "%", "tok/s 1m", "ETA"]
    assert row_line(lines, "code_contests_python_and_cpp").split()[1:] == ["812.3k/1.00M", "81.2", "123.5k",
                                                                           "65m–2h11m*"]


def test_the_partitions_fit_too_with_in_flight_over_slots():
    lines = printed(big_run(), 80)
    short = next(line for line in lines if line.startswith("short "))
    assert short.split() == ["short", "1.50M", "1,536/1,536", "24", "12,345", "123.5k"]


def test_wide_shows_every_column_with_exact_counts():
    lines = printed(big_run(), WIDE_WIDTH, wide=True)
    heading = next(line for line in lines if "dataset" in line)
    for column in ("partition", "total", "done", "in flight", "rejected", "skipped", "req/min 1m·10m",
                   "tok/s 1m·10m", "tokens p50·mean·p99", "trunc %", "loop %", "empty reas. %", "ETA"):
        assert column in heading
    assert any(line.startswith("│ code_contests") and "812,345" in line and "1,000,000" in line
               and "12,345 · 11,000" in line and "850 · 900 · 15,000" in line for line in lines)


@pytest.mark.parametrize(("count", "shown"), [
    (0, "0"), (99_999, "99,999"), (100_000, "100.0k"), (999_949, "999.9k"), (999_950, "1.00M"),
    (1_000_000, "1.00M"), (9_994_999, "9.99M"), (9_995_000, "10.0M"), (99_949_999, "99.9M"),
    (99_950_000, "100M"), (1_234_567_890, "1,235M"),
])
def test_counts_are_shortened_to_six_characters_or_so(count, shown):
    assert short_count(count) == shown


def test_into_a_file_the_console_is_120_columns_and_wide_220():
    if sys.stdout.isatty():
        pytest.skip("stdout is a terminal (pytest -s): this is about a pipe or a file")
    assert (status_console().width, status_console(wide=True).width) == (STATUS_WIDTH, WIDE_WIDTH) == (120, 220)


def test_an_admission_bound_host_is_named_with_its_load_and_what_to_run():
    from dataclasses import replace

    from genfleet.common.fleet_stats import ServerLoad
    from genfleet.status.alarms import alarms

    bound = UpstreamStatus("http://10.0.0.7:30000", 2, 0, 150, target=150,
                           load=ServerLoad(running=7, waiting=143, token_usage=0.11, retracted=0, gen_throughput=812.0))
    status = replace(big_run(), upstreams=[bound])
    text = " ".join(printed(status, 200))
    assert "target 150; server 7 running, 143 waiting, KV 11%, 0 retracted, 812 tok/s) ADMISSION-BOUND" in text
    assert any(line.startswith("admission-bound: http://10.0.0.7:30000 has 143 requests waiting at 11% KV use")
               and "--first-max-new-tokens auto" in line for line in alarms(status))
    busy = replace(bound, load=ServerLoad(running=140, waiting=5, token_usage=0.93, retracted=0, gen_throughput=9e3))
    assert not any("admission-bound" in line for line in alarms(replace(status, upstreams=[busy])))


def test_a_host_at_its_own_running_cap_is_an_alarm_naming_the_flag_not_admission_bound():
    from dataclasses import replace

    from genfleet.common.fleet_stats import SGLANG, VLLM, ServerLoad
    from genfleet.status.alarms import alarms

    capped = ServerLoad(running=8, waiting=40, token_usage=0.12, retracted=0, gen_throughput=300.0, max_running=8,
                        server=SGLANG)
    status = replace(big_run(), upstreams=[UpstreamStatus("http://10.0.0.7:30000", 2, 0, 48, target=48, load=capped)])
    lines = alarms(status)
    assert ("server-limited: http://10.0.0.7:30000: 8 running, its cap (--max-running-requests 8), with 40 waiting "
            "at 12% KV use: restart the server with a higher --max-running-requests") in " ".join(lines)
    assert not any("admission-bound" in line for line in lines)
    on_vllm = replace(status, upstreams=[replace(status.upstreams[0], load=replace(capped, server=VLLM))])
    assert any("(--max-num-seqs)" in line for line in alarms(on_vllm))


def test_a_skewed_worker_clock_and_a_lost_run_state_are_alarms_that_say_what_to_do():
    from dataclasses import replace

    from genfleet.status.alarms import alarms

    quiet = alarms(big_run())
    assert not any(line.startswith(("clock:", "state lost:")) for line in quiet)
    status = replace(big_run(), skewed_clocks={"short-gpu3-41": -90.0}, lost_by=["short-gpu3-41"])
    lines = alarms(status)
    assert any(line.startswith("clock: worker short-gpu3-41's host is 90.0 s ahead of Redis") and "NTP" in line
               for line in lines)
    assert any(line.startswith(f"state lost: Redis no longer has run {status.run}")
               and f"genfleet recover --run {status.run} --from OUTPUT_DIR" in line for line in lines)


def test_a_run_whose_every_row_was_rejected_says_nothing_enqueued_not_finished():
    """A run with datasets but no prompt (every row rejected) once read "0/0 done · finished"."""
    empty = progress("all-rejected", 0, 0, 0)
    run = RunProgress("r", [empty], {"short": 0, "long": 0}, 0)
    status = RunStatus(run="r", time=1.0, progress=run, datasets=[row(empty, None)], partitions=[], upstreams=[],
                       workers=0, created_at=0.0, first_finished=None, last_finished=None,
                       totals=row(run.totals(), None))
    title = printed(status, 120)[0]
    assert "0/0 done" in title and "nothing enqueued" in title and "finished" not in title
