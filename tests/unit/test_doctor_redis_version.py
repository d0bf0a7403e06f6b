"""`genfleet doctor`'s Redis version row: workers need 6.2 (BLMOVE, ZMSCORE)."""
from __future__ import annotations

import pytest

from genfleet.doctor.checks import version_check


@pytest.mark.parametrize(("version", "passes"), [("6.0.16", False), ("5.0.7", False), ("6.2.0", True),
                                                  ("7.0.15", True), ("10.1.2", True)])
def test_a_redis_older_than_6_2_fails_the_preflight(version, passes):
    check = version_check("redis://127.0.0.1:6379/0", version)
    assert (check.status == "ok") is passes
    if not passes:
        assert "6.2" in check.fix
