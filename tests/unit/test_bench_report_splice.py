"""`bench/run.py --only ... --into-existing` replaces the measured sections of a report (their rows,
their notes on missed targets, their own sections) and keeps the rest."""
from __future__ import annotations

import sys

from helpers.paths import REPO

sys.path.insert(0, str(REPO))

from bench.report import MISSED_SECTION, REAL_SECTION, VLLM_SECTION, splice  # noqa: E402

EXISTING = "\n".join([
    "# genfleet benchmarks", "", "| # | figure | median |", "|---|---|---:|", "| 9.1 | tail | 0.91× |",
    "| 10.1 | real, old | 1.00× |", "", MISSED_SECTION, "", "- **2.1 cpu**: old cpu note", "",
    "- **10.1 real, old**: old real note", "", "## What limits scaling", "", "scaling body", "", REAL_SECTION,
    "", "old body", "", "## How each figure is measured", "",
    "- methods", "", "| records | s |", "|---:|---:|", "| 1,000,000 records | 18.2 |", ""])


def fresh(value: str) -> str:
    return "\n".join(["# x", "", "| # | figure | median |", "|---|---|---:|", f"| 10.1 | real, new | {value} |",
                      f"| 10.2 | real, second | {value} |", "", MISSED_SECTION, "",
                      f"- **10.2 real, second**: missed at {value}", "", REAL_SECTION, "", f"new body {value}", "",
                      "## How each figure is measured", ""])


def test_section_ten_is_replaced_and_every_other_line_kept():
    out = splice(EXISTING, fresh("1.50×"))
    lines = out.splitlines()
    assert "| 9.1 | tail | 0.91× |" in lines and "- methods" in lines
    assert [line for line in lines if line.startswith("| 10.")] == ["| 10.1 | real, new | 1.50× |",
                                                                    "| 10.2 | real, second | 1.50× |"]
    assert "old body" not in out and "new body 1.50×" in out
    # The notes on missed targets: section 10's are the fresh ones, after the others.
    notes = [line for line in lines if line.startswith("- **")]
    assert notes == ["- **2.1 cpu**: old cpu note", "- **10.2 real, second**: missed at 1.50×"], notes
    assert lines.index(notes[1]) < lines.index("## What limits scaling")
    # Into the results table, not after another table's row that starts with a digit.
    assert lines.index("| 9.1 | tail | 0.91× |") + 1 == lines.index("| 10.1 | real, new | 1.50× |")
    assert lines[-1] == "| 1,000,000 records | 18.2 |"
    assert lines.count(REAL_SECTION) == 1 and lines.index(REAL_SECTION) < lines.index("## How each figure is measured")


def test_splicing_twice_leaves_one_section_ten():
    once = splice(EXISTING, fresh("1.50×"))
    twice = splice(once, fresh("2.00×"))
    assert len(twice.splitlines()) == len(once.splitlines())
    assert "1.50×" not in twice and twice.count(REAL_SECTION) == 1


def test_a_new_section_goes_into_its_place():
    """Section 12 (vLLM) into a report that has 9 and 10, and 11 (one box) between them: rows in
    numeric order, its own section before the methods, section 10 untouched."""
    fresh12 = "\n".join(["# x", "", "| # | figure | median |", "|---|---|---:|", "| 12.1 | vllm | 1.02× |",
                         "", VLLM_SECTION, "", "vllm body", "", "## How each figure is measured", ""])
    out = splice(EXISTING, fresh12)
    fresh11 = "\n".join(["# x", "", "| # | figure | median |", "|---|---|---:|", "| 11.1 | one box | 0.99× |",
                         "| 11.2 | first record | 2.1 s |", "", "## How each figure is measured", ""])
    out = splice(out, fresh11).splitlines()
    rows = [line.split(" | ")[0] for line in out if line.startswith("| ") and "." in line.split(" | ")[0]]
    assert rows == ["| 9.1", "| 10.1", "| 11.1", "| 11.2", "| 12.1"], rows
    assert "old body" in out and "vllm body" in out
    assert out.index(REAL_SECTION) < out.index(VLLM_SECTION) < out.index("## How each figure is measured")
