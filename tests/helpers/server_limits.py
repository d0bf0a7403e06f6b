"""What the real-server tiers' cap tests assert once a server's own running cap holds its batch:
`status` raises a server-limited alarm naming the flag within a minute, and `doctor` warns with the
same figure (common/server_limits.py words both)."""
from __future__ import annotations

import json
import re

from helpers.fleet import Fleet
from helpers.waits import wait_until


def assert_the_cap_is_named(fleet: Fleet, run: str, url: str, flag: str, cap: int) -> None:
    """`flag cap` (e.g. `--max-num-seqs 4`) in `status`'s alarm within a minute of requests waiting
    (a beacon every few seconds carries the load), and in `doctor`'s warning on the upstream."""
    def alarm() -> str | None:
        status = json.loads(fleet.genfleet("status", "--run", run, "--json").stdout)
        return next((line for line in status["alarms"] if line.startswith("server-limited:")), None)

    line = wait_until(alarm, 60, 0.5, "a server-limited alarm")
    assert f"{flag} {cap}" in line and url in line, line

    result = fleet.genfleet("doctor", "--json", "--upstream", url, check=False)
    rows = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    row = rows[f"upstream {url}"]
    assert row["status"] == "warn", row
    # Its running count may read within the cap's slack of it (fleet_stats.running_cap_slack).
    assert re.search(rf"the server limits the batch: \d+ running, its cap \({re.escape(flag)} {cap}\)",
                     row["detail"]), row
