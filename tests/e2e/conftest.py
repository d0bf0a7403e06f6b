"""Fixtures of the end-to-end tier (the shared ones are in tests/conftest.py)."""
from __future__ import annotations

import pytest
from helpers.sim_http import FAST
from helpers.sim_process import SimProcess


@pytest.fixture(scope="module")
def sim():
    """A fast simulator (`helpers.sim_http.FAST`), one per test module: the wire-format tests'."""
    with SimProcess(*FAST) as process:
        yield process
