"""A host whose wall clock is off: with this directory on PYTHONPATH and GENFLEET_TEST_WALL_CLOCK_SHIFT_S
set, `time.time()` (and `time.time_ns()`) in the process run that many seconds ahead (negative:
behind); the monotonic clock is untouched, as on a host whose NTP is off. A fault injected into a
real worker process (tests/e2e/test_chaos_clock_skew.py), not a stand-in for any part."""
import os
import time

_shift = float(os.environ.get("GENFLEET_TEST_WALL_CLOCK_SHIFT_S") or 0)
if _shift:
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + _shift
    time.time_ns = lambda: _time_ns() + int(_shift * 1e9)
