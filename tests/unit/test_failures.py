"""The retry / dead-letter policy (`workers/failures.py`) with a stand-in Celery task whose
`.retry()` records what it was asked, and the dead letters read back through `RunState` from a
real Redis: which errors retry and which are dead-lettered with which class, the retried payload,
and the backoff's bounds."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import redis
from celery.exceptions import Reject, Retry
from kombu.exceptions import OperationalError

from genfleet.common.records import TaskPayload
from genfleet.common.run_state import RunState
from genfleet.common.settings import Settings
from genfleet.workers import failures
from genfleet.workers.errors import (
    DeadlineExceeded,
    IntegrityError,
    NoFreeSlot,
    PermanentError,
    StreamStalled,
    TransientError,
    UpstreamAborted,
)

MAX_ATTEMPTS = 3
HOST = "http://gpu-1:30000"


class FakeTask:
    """Records each `.retry(...)` call; returns Celery's Retry as the real one does (or raises
    `broker_error`, as when the retry cannot be published)."""

    def __init__(self, broker_error: Exception | None = None) -> None:
        self.retries: list[dict] = []
        self.broker_error = broker_error

    def retry(self, **options: object) -> Retry:
        if self.broker_error is not None:
            raise self.broker_error
        self.retries.append(options)
        return Retry(exc=options["exc"], when=options["countdown"])


@pytest.fixture
def runtime(redis_client):
    """What the policy reads of a worker's runtime: its settings and the run state."""
    settings = Settings(max_attempts=MAX_ATTEMPTS, retry_backoff_s=0.5, retry_backoff_max_s=4.0)
    return SimpleNamespace(settings=settings, run_state=lambda run: RunState(redis_client, run))


def payload(attempt: int) -> TaskPayload:
    return TaskPayload(run="r", id="d/7", dataset="d", row=7, partition="short", prompt_tokens=9,
                       max_new_tokens=10, messages=[{"role": "user", "content": "a secret prompt"}],
                       attempt=attempt)


def fail(runtime, error: Exception, attempt: int, task: FakeTask | None = None) -> BaseException:
    """Runs the policy on `error` at `attempt`; returns what it raised (it always raises)."""
    error.upstream = HOST
    with pytest.raises(BaseException) as raised:
        failures.handle_failure(task or FakeTask(), payload(attempt), runtime, error)
    return raised.value


def test_a_transient_error_is_retried_as_the_next_attempt_away_from_the_host_that_failed(runtime):
    task = FakeTask()
    error = TransientError("HTTP 503")
    assert isinstance(fail(runtime, error, 1, task), Retry)
    (retry,) = task.retries
    again = TaskPayload.from_dict(retry["args"][0])
    assert (again.attempt, again.failed_upstream) == (2, HOST)
    assert again.messages == payload(1).messages and again.id == "d/7"
    assert retry["exc"] is error and 0 <= retry["countdown"] <= 0.5
    assert "attempt 2" in retry["argsrepr"] and "secret" not in retry["argsrepr"]
    state = runtime.run_state("r")
    assert state.read_dead_letters() == [] and state.counters("d")["failed"] == 0


@pytest.mark.parametrize(("error", "attempt", "dead_class"), [
    (PermanentError("HTTP 400: context too long"), 1, "permanent"),
    (TransientError("HTTP 503"), MAX_ATTEMPTS, "exhausted"),
    (StreamStalled("no byte for 30 s"), MAX_ATTEMPTS, "exhausted"),
    (UpstreamAborted("queue full"), MAX_ATTEMPTS, "exhausted"),
    (DeadlineExceeded("past the task deadline"), MAX_ATTEMPTS, "exhausted"),
    (IntegrityError("ids do not decode to the text"), MAX_ATTEMPTS, "integrity"),
], ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value))
def test_an_error_that_cannot_or_may_no_longer_be_retried_is_dead_lettered_with_its_class(
        runtime, error, attempt, dead_class):
    task = FakeTask()
    raised = fail(runtime, error, attempt, task)
    assert raised is error and task.retries == []
    after = f"{dead_class} after {attempt} attempts" if error.retryable else dead_class
    assert repr(raised) == f"{type(error).__name__}({f'{after}, dead-lettered: {error}'!r})"  # what Flower shows
    state = runtime.run_state("r")
    (letter,) = state.read_dead_letters()
    assert (letter.id, letter.error_class, letter.message, letter.attempts, letter.upstream) == (
        "d/7", dead_class, str(error), attempt, HOST)
    assert letter.payload == payload(attempt)
    assert state.counters("d")["failed"] == 1


def test_integrity_failures_and_aborts_are_counted_on_every_attempt_retried_or_not(runtime):
    fail(runtime, IntegrityError("miscount"), 1)
    fail(runtime, IntegrityError("miscount"), MAX_ATTEMPTS)
    fail(runtime, UpstreamAborted("queue full"), 1)
    fail(runtime, TransientError("HTTP 500"), 1)
    counters = runtime.run_state("r").counters("d")
    assert (counters["integrity"], counters["aborted"], counters["failed"]) == (2, 1, 1)


def test_a_retry_that_cannot_be_published_gives_the_message_back_untouched(runtime):
    raised = fail(runtime, TransientError("HTTP 503"), 1, FakeTask(OperationalError("broker down")))
    assert isinstance(raised, Reject) and raised.requeue
    assert runtime.run_state("r").read_dead_letters() == []


def test_the_backoff_grows_exponentially_up_to_its_cap_with_full_jitter(monkeypatch):
    samples = [failures.retry_countdown(4, 1.0, 100.0) for _ in range(2000)]
    assert all(0 <= s <= 8 for s in samples)  # 1 s doubled for each attempt after the first
    assert min(samples) < 0.5 and max(samples) > 7.5  # spread over the whole range, not clustered
    bounds: list[tuple[float, float]] = []
    monkeypatch.setattr(random, "uniform", lambda low, high: bounds.append((low, high)) or high)
    assert [failures.retry_countdown(attempt, 0.5, 4.0) for attempt in range(1, 8)] == [0.5, 1, 2, 4, 4, 4, 4]
    assert {low for low, _ in bounds} == {0}


def test_a_redis_that_refuses_the_dead_letter_gives_the_message_back(redis_client):
    """Celery acks a failed task: a failure that cannot be recorded must not be acked away."""
    class RefusingState(RunState):
        def record_dead_letter(self, *_: object) -> None:
            raise redis.ConnectionError("Redis is loading the dataset in memory")

    runtime = SimpleNamespace(settings=Settings(max_attempts=1), run_state=lambda run: RefusingState(redis_client, run))
    raised = fail(runtime, PermanentError("HTTP 400"), 1)
    assert isinstance(raised, Reject) and raised.requeue


def test_a_wait_for_a_slot_on_healthy_hosts_gives_the_message_back_and_counts_no_attempt(runtime):
    task = FakeTask()
    with pytest.raises(Reject) as given_back:
        failures.handle_error(task, payload(1), runtime, NoFreeSlot("no free slot: a (2 in flight)", healthy=True),
                              superseded=False)
    assert given_back.value.requeue and task.retries == []
    assert RunState(runtime.run_state("r").redis, "r").counters("d")["failed"] == 0


def test_a_wait_for_a_slot_while_every_host_was_down_is_an_attempt_tried_again(runtime):
    task = FakeTask()
    with pytest.raises(Retry):
        failures.handle_error(task, payload(1), runtime, NoFreeSlot("no free slot: a (down)", healthy=False),
                              superseded=False)
    assert [retry["args"][0]["attempt"] for retry in task.retries] == [2]


def test_a_copy_whose_message_was_delivered_again_gives_it_back_whatever_failed_it(runtime):
    task = FakeTask()
    for error in (TransientError("cut"), ValueError("a bug"), NoFreeSlot("down", healthy=False)):
        with pytest.raises(Reject) as given_back:
            failures.handle_error(task, payload(1), runtime, error, superseded=True)
        assert given_back.value.requeue
    assert task.retries == [], "a superseded copy publishes no retry beside the delivery that runs it now"
