"""Polling, written once: every test that waits for something to become true waits through here."""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TypeVar

import httpx
import redis

T = TypeVar("T")

# What a service still starting, or caught between two states, answers with: worth another look.
NOT_YET = (httpx.HTTPError, redis.RedisError, json.JSONDecodeError)


class WaitTimeout(AssertionError):
    """The condition did not hold in time (a test failure, reported as an assertion)."""


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.1,
               message: str | Callable[[], str] = "condition not met", *,
               ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Calls `predicate` every `interval` seconds until it returns something truthy, and returns that.

    An exception of a type in `ignore` counts as "not yet" (a server still starting). After
    `timeout` seconds raises WaitTimeout with `message` (a string, or a callable run only then, for
    details such as a log tail) and the last value or error seen. The predicate runs at least once.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = predicate()
            if last:
                return last
        except ignore as error:
            last = error
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise WaitTimeout(f"{text} (after {timeout:g} s; last: {last!r})")
        time.sleep(interval)
