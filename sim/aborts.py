"""Ending a request before its finish, as SGLang 0.5.23 does: `POST /abort_request`, and a client
that disconnects.

`/abort_request` (`{"rid": ..., "abort_all": false}`; `entrypoints/http_server.py` `abort_request`
-> `TokenizerManager.abort_request`, `managers/tokenizer_manager.py`) answers 200 with an empty body,
whatever happened: an empty rid without abort_all is ignored, and so is a rid the server does not
hold. A rid it holds (waiting, running, or decoding on after its client left) goes to the scheduler,
which aborts every request whose rid STARTS WITH it (`Scheduler.abort_request`,
`managers/scheduler.py`: `req.rid.startswith(recv_req.rid)`); `abort_all` aborts them all; a rid
already aborted is not sent again (`abort_sent`). An aborted request frees its slot at once and ends
with an ordinary last chunk (then `[DONE]`), or a 200 body when not streaming (an abort without a
status_code is no error: `_handle_abort_finish_reason`):

- running: `FINISH_ABORT().to_json()` (`managers/schedule_batch.py`), `{"type": "abort", "message":
  "Aborted", "status_code": null, "err_type": null}`, with every token decoded so far. (SGLang runs
  one more decode pass first, "Abort method 3", and sends its token too; the sim stops at once.)
- waiting for a slot, or holding one but still queued for prefill (sim.prefill_lane; both are
  SGLang's waiting queue): `{"type": "abort", "message": "Abort in waiting queue"}` and no tokens
  (`_handle_abort_req`; SGLang's meta_info then lacks prompt_tokens and the other counts, the sim's
  has them). One in the prefill batch running now is running: the batch runs on without it.

A client that disconnects does not free its slot at once: the request decodes on (its tokens count
in `tokens_generated`) until SGLang notices and aborts it, counted in `aborted_requests`:

- a stream: Starlette runs the response's background task once the client is gone, and
  `create_abort_task` sleeps 2 s before it aborts (`--disconnect-abort-s`, 0 for at once);
- a non-streaming request: `_stream_one_response` asks `request.is_disconnected()` when an output
  arrives, which the scheduler sends every 50 tokens (`SGLANG_FORCE_STREAM_INTERVAL`,
  `managers/scheduler_components/output_streamer.py`), or when its 4 s wait times out
  (`SGLANG_REQUEST_STATE_WAIT_TIMEOUT`): the sim aborts at the next 50-token output or the next 4 s
  since arrival (SGLang restarts that wait at each output; rarely sooner than 50 tokens).

A request that finishes before that finishes (no abort). Nothing is sent to a client that left, and
no completion log line is written for it.
"""
from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from genfleet.sim.capacity import Capacity

if TYPE_CHECKING:
    from genfleet.sim.engine import Served
    from genfleet.sim.prefill_lane import PrefillTurn

ABORTED: dict[str, Any] = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
ABORTED_WHILE_WAITING: dict[str, Any] = {"type": "abort", "message": "Abort in waiting queue"}
FORCE_STREAM_INTERVAL = 50  # tokens between a non-streaming request's outputs
STATE_WAIT_TIMEOUT_S = 4.0  # how often a silent non-streaming request looks for its client


class Progress(Protocol):
    """The generated-token count a request has reached (the engine's decode clock)."""

    def ready(self, limit: int) -> int: ...


class RequestControl:
    """One request's slot, naps and end, which an abort or the client's leaving may cut short.

    The engine takes the slot, waits for its prefill batch, naps through decoding, and reports the
    end (`end`) with what it served; `abort` frees the slot at once and wakes the engine, which
    then sends the abort's last chunk. `sent` is what the client has been written so far."""

    def __init__(
        self,
        rid: str,
        *,
        stream: bool,
        capacity: Capacity,
        disconnect_abort_s: float,
        on_served: Callable[[Served], None] | None = None,
        on_cut: Callable[[int], None] | None = None,
    ) -> None:
        self.rid, self.stream = rid, stream
        self._capacity = capacity
        self._disconnect_abort_s = disconnect_abort_s
        self._on_served, self._on_cut = on_served, on_cut
        # Held, not looked up per nap: asyncio.get_running_loop() costs a getpid() syscall on
        # Python 3.11, and streams nap thousands of times a second.
        self._loop = asyncio.get_running_loop()
        self._arrived = self._loop.time()
        self.abort_finish: dict[str, Any] | None = None
        self.decoded_at_abort = 0
        self.struck: tuple[str, ...] = ()  # faults that struck before an abort (the log's "faults")
        self.client_gone = self.ended = False
        self.sent = 0
        self._sent_before_leaving = 0
        self._holds_slot = False
        self._prefill: PrefillTurn | None = None  # while it waits for its prefill batch
        self._progress: Progress | None = None
        self._end = self._recorded = 0
        self._nap: asyncio.Future[None] | None = None
        self._waiting: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def aborted(self) -> bool:
        return self.abort_finish is not None

    @property
    def decoded(self) -> int:
        """Tokens decoded so far, as recorded (`record_decoded`, or an abort's count)."""
        return self._recorded

    # -- the engine's side --------------------------------------------------------------------

    async def take_slot(self) -> bool:
        """Wait for a running slot; False if aborted first (then it holds none)."""
        if self.aborted:
            return False
        waiting = self._waiting = asyncio.ensure_future(self._capacity.acquire())
        try:
            await asyncio.wait((waiting,))
        finally:
            self._waiting = None
            waiting.cancel()  # only if we were cancelled ourselves; a finished wait ignores it
        if waiting.cancelled():
            return False
        waiting.result()  # surface a crash in the capacity model
        self._holds_slot = True
        return True

    def release_slot(self) -> None:
        if self._holds_slot:
            self._holds_slot = False
            self._capacity.release()

    def start_decoding(self, progress: Progress, end: int) -> None:
        self._progress, self._end = progress, end

    def record_decoded(self, count: int) -> None:
        """`count` tokens decoded so far: the new ones count in tokens_generated."""
        if count > self._recorded:
            self._capacity.record_tokens(count - self._recorded)
            self._recorded = count

    async def nap(self, delay: float | None, *, until: asyncio.Future[None] | None = None) -> None:
        """Sleep `delay` seconds (None: no limit) or until `until` is done, or less if an abort
        wakes it."""
        if self.aborted:
            return
        woken = self._loop.create_future()
        timer = self._loop.call_later(delay, _wake, woken) if delay is not None else None

        def wake(_: asyncio.Future[None]) -> None:
            _wake(woken)

        if until is not None:
            until.add_done_callback(wake)
        self._nap = woken
        try:
            await woken
        finally:
            self._nap = None
            if timer is not None:
                timer.cancel()
            if until is not None:
                until.remove_done_callback(wake)

    async def await_prefill(self, turn: PrefillTurn) -> None:
        """Wait until the request's prefill batch has run (sim.prefill_lane), or less if aborted:
        aborted while still queued, it leaves the queue as if waiting for a slot."""
        self._prefill = turn
        try:
            await self.nap(None, until=turn.done)
        finally:
            self._prefill = None

    def end(self, served: Served) -> None:
        """The response's last bytes are about to go out: `on_cut` learns how many tokens the client
        got (all it carried, or what went out before the client left), `on_served` what was served
        (not once the client left). Both before the bytes: a client that has them finds the record."""
        self.ended = True
        self._cancel_timer()
        if self._on_cut is not None:
            self._on_cut(self._sent_before_leaving if self.client_gone else served.generated)
        if self._on_served is not None and not self.client_gone:
            self._on_served(served)

    # -- what ends it early -------------------------------------------------------------------

    def abort(self) -> None:
        """Abort now (a no-op once ended or aborted): free the slot, count what was decoded."""
        if self.aborted or self.ended:
            return
        self._cancel_timer()
        if self._holds_slot and self._prefill is not None and self._prefill.withdraw():
            self.abort_finish = ABORTED_WHILE_WAITING  # queued for prefill: nothing computed
            self.release_slot()
        elif self._holds_slot:  # running (in a prefill batch included)
            self.decoded_at_abort = self._progress.ready(self._end) if self._progress is not None else 0
            self.record_decoded(self.decoded_at_abort)
            self.abort_finish = ABORTED
            self.release_slot()
        else:
            self.abort_finish = ABORTED_WHILE_WAITING
            if self._waiting is not None:
                self._waiting.cancel()
        self._capacity.record_aborted()
        self._wake()

    def client_left(self) -> None:
        """The client disconnected: abort when SGLang would notice (see the module's docstring)."""
        self._capacity.record_disconnected()
        self.client_gone, self._sent_before_leaving = True, self.sent
        if self.ended or self.aborted:
            return
        if self.stream:
            delay = self._disconnect_abort_s
        else:
            waited = self._loop.time() - self._arrived
            delay = STATE_WAIT_TIMEOUT_S * (math.floor(waited / STATE_WAIT_TIMEOUT_S) + 1) - waited
        if delay <= 0:
            self.abort()
        else:
            self._timer = self._loop.call_later(delay, self.abort)

    def close(self) -> None:
        self._cancel_timer()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wake(self) -> None:
        if self._nap is not None:
            _wake(self._nap)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class InFlight:
    """The requests the server holds, by rid (SGLang's `rid_to_state`): duplicates and aborts."""

    def __init__(self) -> None:
        self._controls: dict[str, RequestControl] = {}

    def __contains__(self, rid: str) -> bool:
        return rid in self._controls

    def add(self, control: RequestControl) -> None:
        self._controls[control.rid] = control

    def remove(self, control: RequestControl) -> None:
        if self._controls.get(control.rid) is control:
            del self._controls[control.rid]

    def abort_request(self, rid: str | None, abort_all: bool = False) -> None:
        """`TokenizerManager.abort_request` then `Scheduler.abort_request`: by rid prefix, or all."""
        if abort_all:
            targets = list(self._controls.values())
        elif rid and rid in self._controls:
            targets = [control for held, control in self._controls.items() if held.startswith(rid)]
        else:
            return  # an empty rid, or one no longer (or never) held: nothing to do
        for control in targets:
            control.abort()

    def abort_left(self) -> None:
        """Abort the requests whose clients left, at once: a stopping server need not wait for
        their aborts, which nobody would see."""
        for control in list(self._controls.values()):
            if control.client_gone:
                control.abort()
