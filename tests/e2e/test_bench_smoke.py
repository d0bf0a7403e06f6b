"""`make bench` must not rot: a quick throughput run (genfleet and the baseline script against the
simulator, tiny sizes) writes the results table. Measures nothing; checks the harness."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO


@pytest.mark.timeout(180)
def test_quick_bench_writes_the_results_table(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: `apt-get install redis-server` (make test does it as root)")
    out = tmp_path / "results.md"
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--quick", "--repeats", "1", "--only", "throughput",
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=170,
    )
    assert result.returncode == 0, f"bench/run.py failed:\n{result.stdout}\n{result.stderr[-4000:]}"
    report = out.read_text()

    assert "Quick run" in report
    assert re.search(r"\*\*Date\*\*: \d{4}-\d\d-\d\d", report) and "**commit**" in report
    table = [line for line in report.splitlines() if re.match(r"\| [12]\.\d \|", line)]
    names = " ".join(table)
    for figure in ("Throughput, genfleet ÷ baseline", "Steady-state occupancy", "Wall time",
                   "CPU per generated token", "Peak RSS"):
        assert figure in names, f"no '{figure}' row in:\n{report}"
    throughput = next(line for line in table if "Throughput" in line)
    assert re.search(r"\| \d+\.\d\d× \|", throughput), throughput
    assert "≥ 1.0×" in throughput and ("met" in throughput or "missed" in throughput)
    # Both sides did the same work: same prompts, same token ids, so the same completions.
    assert "different token totals" not in report
