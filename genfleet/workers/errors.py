"""The workers' errors, under one root: the typed failures of a generation (each says whether
retrying can help; the task reads only that), and the local faults and control flow beside them."""
from __future__ import annotations

from genfleet.common import GenfleetError
from genfleet.common.run_state import EXHAUSTED, INTEGRITY, PERMANENT, TRANSIENT


class WorkerError(GenfleetError):
    """The root of the workers' errors."""


class GenerationError(WorkerError):
    error_class = TRANSIENT
    # The dead-letter class once a retryable error has used up its attempts.
    exhausted_class = EXHAUSTED
    # Counts toward the host's circuit breaker: the host, not the request, is at fault.
    blames_upstream = True

    def __init__(self, message: str, *, upstream: str | None = None) -> None:
        super().__init__(message)
        self.upstream = upstream
        # Set once the prompt is dead-lettered: "permanent" or "exhausted after N attempts".
        self.dead_letter: str | None = None

    @property
    def retryable(self) -> bool:
        return self.error_class == TRANSIENT

    def as_dead_letter(self, dead_letter_class: str, attempts: int) -> GenerationError:
        """This error, marked as the end of the prompt's attempts (what Flower shows for it)."""
        self.dead_letter = (f"{dead_letter_class} after {attempts} attempts" if self.retryable
                            else dead_letter_class)
        return self

    def __repr__(self) -> str:
        # Flower's task list and Celery's log show repr(): the type alone does not say whether a
        # retry follows (transient) or the prompt went to the dead letters, and after how many tries.
        verdict = f"{self.dead_letter}, dead-lettered" if self.dead_letter else self.error_class
        return f"{type(self).__name__}({f'{verdict}: {self}'!r})"


class TransientError(GenerationError):
    """Connect error, timeout, 5xx, abort 503, a stream cut short: another try can succeed."""


class StreamStalled(TransientError):
    """No byte from the server within the stall timeout."""


class StreamCut(TransientError):
    """The stream ended before its final chunk."""


class UpstreamAborted(TransientError):
    """The server aborted the request (queue full, timeouts): finish_reason type 'abort'."""


class DeadlineExceeded(TransientError):
    """The task ran past its own deadline (the threads pool enforces no Celery time limit)."""

    blames_upstream = False


class IntegrityError(TransientError):
    """The stream contradicts itself: the assembled ids do not add up to the final
    `completion_tokens`, a cumulative chunk does not extend the previous one, or the text is not what
    the ids decode to. Nothing is written; another try (preferably on another host) usually gives a
    clean stream, and one that never does is dead-lettered as `integrity`, not silently kept."""

    exhausted_class = INTEGRITY


class PermanentError(GenerationError):
    """400, context too long, invalid request: the same request will fail again."""

    error_class = PERMANENT
    blames_upstream = False


class ShutdownRequested(WorkerError):
    """The worker is stopping: the task gives its message back to the queue."""


class NoFreeSlot(WorkerError):
    """A task waited its whole wait for a slot on an upstream: `healthy` says whether some host was
    up (at this worker's cap) or every one was down. What that means for the prompt is decided in
    workers/failures.py (`handle_error`)."""

    def __init__(self, message: str, *, healthy: bool) -> None:
        super().__init__(message)
        self.healthy = healthy


# -- raised by the transport (workers/servers/transport.py), the routing (workers/upstreams.py), the
# budget check (workers/generation/replies.py) and the shard writer (workers/output.py)


class UpstreamURLError(WorkerError, ValueError):
    """An upstream URL genfleet cannot talk to (scheme, host)."""


class SendFailed(WorkerError):
    """The request did not reach the server (connect, TLS, or the send itself): `cause` says why."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class BudgetSpent(WorkerError):
    """The dataset's completion-token budget is used up: the prompt is skipped, not generated."""


class NoUpstreamError(WorkerError, RuntimeError):
    """The worker's upstream settings cannot work (no URL, an unknown routing)."""


class NoUpstreamAvailable(TransientError):
    """Every upstream was down for longer than the task could wait: an attempt, tried again later."""

    blames_upstream = False


class DiskUnwritable(WorkerError):
    """A local fault: the prompt goes back to the queue untouched, never to the dead letters."""


class ShardWriteFailed(WorkerError, OSError):
    """The record is not on disk: a local fault, not the prompt's; the task gives its message back."""


class ShardWriterClosed(ShardWriteFailed):
    """The worker is shutting down: a record that arrives now is given back like any local fault."""
