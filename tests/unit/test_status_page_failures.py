"""The status page's dead-letter list: a hash has no order, so past the cap the page says it shows
the newest of those it read, not of the run."""
from __future__ import annotations

from genfleet.common.keys import RunKeys
from genfleet.common.records import TaskPayload
from genfleet.common.run_state import DeadLetter
from genfleet.status.page import _failures, read_failures


def letter(row: int) -> DeadLetter:
    payload = TaskPayload(run="r", id=f"d/{row}", dataset="d", row=row, partition="short", prompt_tokens=3,
                          max_new_tokens=8, messages=[{"role": "user", "content": "hi"}])
    return DeadLetter.of(payload, "permanent", "bad request", None, now=1_000.0 + row)


def page_text(failures) -> str:
    status = type("Status", (), {"run": "r"})()
    return _failures(type("Data", (), {"failures": failures, "flower_url": "http://flower", "status": status}))


def test_past_the_cap_the_page_says_it_shows_the_newest_of_those_read(redis_client):
    for row in range(8):
        redis_client.hset(RunKeys("r").dead_letters, f"d/{row}", letter(row).encode())
    capped = read_failures(redis_client, "r", limit=3, scanned=5)
    assert capped.total == 8 and capped.read == 5 and len(capped.recent) == 3
    assert [f.time for f in capped.recent] == sorted((f.time for f in capped.recent), reverse=True)
    assert "8 dead letters, the latest 3 of 5 read below" in page_text(capped)

    whole = read_failures(redis_client, "r", limit=3, scanned=500)
    assert [f.id for f in whole.recent] == ["d/7", "d/6", "d/5"]
    assert "8 dead letters, the latest 3 below" in page_text(whole)
