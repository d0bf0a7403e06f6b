"""A worker process's own mechanics around Celery: a signal ends its event loop's wait at once, and
its tokenizer loads beside Celery's start (genfleet/workers/lifecycle.py, common/tokenizer.py)."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from helpers.paths import TOKENIZER
from kombu.asynchronous import Hub

from genfleet.common.tokenizer import BackgroundTokenizer, TokenizerNotFoundError
from genfleet.workers.errors import ShutdownRequested
from genfleet.workers.lifecycle import wake_on_signals

TIMER_S = 30.0  # the only timer: without the wake, the poll waits for it (kombu caps a poll at 2 s)


def test_a_signal_ends_the_event_loops_wait_at_once():
    """Celery's shutdown handler only sets a flag, read between polls; a poll a signal interrupts is
    resumed for the rest of its timeout (PEP 475). Without the wake, the poll went on for 1.7 s
    after the signal here."""
    hub = Hub()
    hub.call_later(TIMER_S, lambda: None)
    reader, writer = os.pipe()  # a reader the hub polls (it polls nothing otherwise)
    hub.add_reader(reader, lambda: None)
    received: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, _frame: received.append(signum))
    try:
        wake_on_signals(hub)
        loop = hub.create_loop()
        next(loop)  # the first iteration fires no timer; the next one polls until the signal
        sent: list[float] = []

        def send() -> None:
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGUSR1)

        threading.Timer(0.3, send).start()
        next(loop)
        waited = time.monotonic() - sent[0]
    finally:
        signal.signal(signal.SIGUSR1, previous)
        signal.set_wakeup_fd(-1)
        hub.close()
        os.close(reader)
        os.close(writer)
    assert received == [signal.SIGUSR1]
    assert waited < 1.0, f"the loop waited {waited:.1f} s after the signal"


def test_a_tokenizer_that_is_not_there_fails_at_once(tmp_path):
    with pytest.raises(TokenizerNotFoundError, match=str(tmp_path)):
        BackgroundTokenizer(tmp_path, on_failure=lambda error: None, unavailable=ShutdownRequested)


def test_the_tokenizer_is_there_once_loaded():
    tokenizer = BackgroundTokenizer(TOKENIZER, on_failure=lambda error: pytest.fail(str(error)),
                                    unavailable=ShutdownRequested)
    ids = tokenizer("hello world", add_special_tokens=False)["input_ids"]  # a call waits for the load
    assert tokenizer.decode(ids) == "hello world"  # so does an attribute


def test_a_tokenizer_that_fails_to_load_stops_the_worker_and_gives_prompts_back(tmp_path):
    """A corrupt tokenizer file: the failure is reported (the worker stops), and each use raises the
    caller's local fault (a message given back), never a prompt's failure."""
    (tmp_path / "tokenizer.json").write_text("{not json")
    failures: list[BaseException] = []
    tokenizer = BackgroundTokenizer(tmp_path, on_failure=failures.append, unavailable=ShutdownRequested)
    with pytest.raises(ShutdownRequested, match="did not load"):
        tokenizer.decode([1, 2])
    assert len(failures) == 1 and tokenizer.failed
