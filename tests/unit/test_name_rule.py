"""The one name rule (`common/names.py`) and the shard path builder that relies on it."""
from __future__ import annotations

from pathlib import Path

import pytest

from genfleet.common.names import UnsafeName, inside, name_problem, task_problem
from genfleet.common.shards import shard_dir

GOOD = ["r1", "B1_glaive", "demo-20260101-120000", "run.v2", "-x", "_", "a" * 128, "r1-cfg0123abcd"]
BAD = ["", ".", "..", ".hidden", "../../trav", "a/b", "a\\b", "/abs", "x:y", "with space", "ünï", "a" * 129,
       "nul\x00", "tab\t", None, 7]


@pytest.mark.parametrize("name", GOOD)
def test_good_names_pass(name):
    assert name_problem(name) is None


@pytest.mark.parametrize("name", BAD)
def test_bad_names_are_refused_with_a_reason(name):
    assert name_problem(name)


@pytest.mark.parametrize(("run", "dataset"), [("../../trav", "d"), ("r", ".."), ("r", "."), ("/etc", "d"),
                                              ("r", "d/../../x")])
def test_shard_dir_refuses_a_name_that_leaves_the_root(run, dataset, tmp_path):
    with pytest.raises(UnsafeName):
        shard_dir(tmp_path, run, dataset)


def test_shard_dir_keeps_a_good_name_under_the_root(tmp_path):
    assert shard_dir(tmp_path, "r1", "B1_glaive") == tmp_path / "r1" / "B1_glaive"
    assert shard_dir(Path("out"), "r1", "d") == Path("out/r1/d")  # a relative root stays relative


def test_inside_refuses_the_root_itself_and_anything_above_it(tmp_path):
    for parts in (("..",), (".",), ("a", "..", ".."), ("/elsewhere",)):
        with pytest.raises(UnsafeName):
            inside(tmp_path, *parts)
    assert inside(tmp_path, "a", "b") == tmp_path / "a" / "b"


def test_a_task_id_must_belong_to_its_dataset():
    assert task_problem("r", "d", "d/0") is None
    assert task_problem("r", "d", "d/../../anything") is None  # an id is data, never a path
    assert "prompt id" in task_problem("r", "d", "e/0")
    assert "prompt id" in task_problem("r", "d", "d/")
    assert "run name" in task_problem("..", "d", "d/0")
    assert "dataset name" in task_problem("r", ".", "./0")
