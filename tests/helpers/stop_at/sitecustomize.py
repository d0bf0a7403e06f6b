"""A worker that stops itself (SIGSTOP) once, at one point of a message's delivery, as a starved
host stands still there: with this directory on PYTHONPATH, GENFLEET_TEST_STOP_AT naming the point
and GENFLEET_TEST_STOP_MARK a file path (the process stops only while the file is absent, and writes
it first, so it stops once), the worker's own code runs unchanged around the stop. The test sends
SIGCONT (tests/e2e/test_starved_delivery.py). A fault injected into a real worker process.

Points:
- `transit`: the message is on the worker's transit list (BLMOVE), not yet recorded in kombu's
  `unacked` (`Channel.take_in_transit`, which `QoS.append` calls right before recording it);
- `received`: recorded in `unacked`, before the worker's lease keeper takes it (`LeaseKeeper.hold`,
  from Celery's task-received signal).
"""
import os
import signal
from pathlib import Path

_point = os.environ.get("GENFLEET_TEST_STOP_AT")
_mark = os.environ.get("GENFLEET_TEST_STOP_MARK")


def _stop_once() -> None:
    mark = Path(_mark)
    if mark.exists():
        return
    mark.write_text(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGSTOP)


def _wrap(owner, name: str, after: bool) -> None:
    original = getattr(owner, name)

    def stopping(self, *args, **kwargs):
        if not after:
            _stop_once()
        result = original(self, *args, **kwargs)
        if after and result is not None:
            _stop_once()
        return result

    setattr(owner, name, stopping)


if _point and _mark:
    if _point == "transit":
        from genfleet.workers import broker

        _wrap(broker.Channel, "take_in_transit", after=True)
    elif _point == "received":
        from genfleet.workers import delivery

        _wrap(delivery.LeaseKeeper, "hold", after=False)
    else:
        raise SystemExit(f"GENFLEET_TEST_STOP_AT={_point}: want transit or received")
