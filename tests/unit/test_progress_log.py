"""`genfleet run`'s plain progress (status/render.py `ProgressLog`): one total line per interval, a
dataset's line only where its figures moved since its last one (one when it finishes, none after),
a host's line when it goes down and when it answers again. Drawn over many runs' histories."""
from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from genfleet.status.eta import OWN, Eta
from genfleet.status.read_model import (
    DatasetProgress,
    DatasetStatus,
    LengthStats,
    RunProgress,
    RunStatus,
    Throughput,
    UpstreamStatus,
)
from genfleet.status.render import ProgressLog

RATES = {window: Throughput(30.0, 600.0, 1.0, 600.0, 0.0, 0.0) for window in ("1m", "10m")}
ETA = Eta(3_600.0, 3_600.0, 3_600.0, OWN, 10)
HOST = "http://10.0.0.7:30000"
LINE = re.compile(r"^12:00:00 (?P<name>\S+): (?P<done>[\d,]+)/(?P<total>[\d,]+) done \([\d.-]+%\) · [\d,]+ req/min · "
                  r"[\d,]+ tok/s · (?P<failed>[\d,]+) failed · (?P<state>done|waiting|ETA .+)$")


def snapshot(figures: dict[str, tuple[int, int, int]], down: int) -> RunStatus:
    """A status with each dataset's (total, done, failed), and `down` of 4 workers finding the host down."""
    datasets = [DatasetProgress(dataset=name, total=total, done=done, failed=failed, rejected=0, skipped=0,
                                prompt_tokens=0, completion_tokens=0, reasoning_tokens=0, truncated=0,
                                empty_reasoning=0, empty_content=0, aborted=0, integrity=0)
                for name, (total, done, failed) in figures.items()]
    run = RunProgress("r", datasets, {"short": 0}, 0)

    def row(d: DatasetProgress) -> DatasetStatus:
        return DatasetStatus(d, {}, 0, RATES, LengthStats(0, None, None, None), None if d.finished else ETA)

    return RunStatus(run="r", time=0.0, progress=run, datasets=[row(d) for d in datasets], partitions=[],
                     upstreams=[UpstreamStatus(HOST, 4, down, 0)], workers=4, created_at=0.0, first_finished=None,
                     last_finished=None, totals=row(run.totals()))


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[dict[str, tuple[int, int, int]], int]]:
    """Intervals of a run of 1-10 datasets: each dataset's done and failed only grow, often not at all."""
    totals = draw(st.lists(st.integers(0, 40), min_size=1, max_size=10))
    settled = [[0, 0] for _ in totals]
    history = []
    for _ in range(draw(st.integers(1, 30))):
        for index, total in enumerate(totals):
            left = total - sum(settled[index])
            settled[index][0] += draw(st.integers(0, left))
            settled[index][1] += draw(st.integers(0, total - sum(settled[index])))
        history.append(({f"d{i}": (total, *settled[i]) for i, total in enumerate(totals)}, draw(st.integers(0, 4))))
    return history


@given(histories())
def test_one_total_line_per_interval_and_a_dataset_line_only_where_it_changed(history):
    log, last, last_down = ProgressLog(), {}, 0
    finished_lines = dict.fromkeys(history[0][0], 0)
    for figures, down in history:
        lines = log.lines(snapshot(figures, down), "12:00:00")
        assert [line for line in lines if line.startswith("12:00:00 total: ")] == lines[:1]
        shown = {}
        for line in lines[1:]:
            if line.startswith(f"12:00:00 upstream {HOST}: "):
                continue
            match = LINE.match(line)
            assert match, line
            shown[match["name"]] = (int(match["total"].replace(",", "")), int(match["done"].replace(",", "")),
                                    int(match["failed"].replace(",", "")))
            finished_lines[match["name"]] += match["state"] == "done"
        assert set(shown) == {name for name, numbers in figures.items() if last.get(name) != numbers}
        assert all(shown[name] == figures[name] for name in shown)
        host_lines = [line for line in lines if "upstream" in line]
        assert len(host_lines) == (down != last_down)
        if host_lines:
            assert host_lines[0].endswith("answers again" if not down else "(no answer: its prompts wait)")
        last, last_down = {**last, **shown}, down
    # A finished dataset's line is printed once, whatever came after.
    assert all(count <= 1 for count in finished_lines.values())


def test_a_ten_dataset_job_writes_a_line_an_interval_once_its_datasets_are_done():
    log = ProgressLog()
    done = {f"set{i}": (100, 100, 0) for i in range(10)}
    first = log.lines(snapshot(done, 0), "12:00:00")
    assert len(first) == 11 and all(line.endswith("· done") for line in first)
    for _ in range(100):
        assert log.lines(snapshot(done, 0), "12:00:00") == [first[0]]
