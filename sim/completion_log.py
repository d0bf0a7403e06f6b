"""`--log-completions PATH`: one JSON line per request whose response went out whole.

A line is written when a stream has sent its last chunk (or error chunk) and `[DONE]`, or a
non-streaming response its body; never for a stalled request (unless /abort_request ends it), one
whose client left, or an HTTP 500 answered before anything ran. It says what the server sent, as
the ground truth for a client's integrity checks:

    {"rid": ..., "api": "generate" | "chat",
     "continues": "<rid>",         only on a request that continues a cut completion
                                    (sim.continuation): its output_ids and text are the tail only
     "input_ids": [...]            (or "input_text": "..." for a /generate text prompt;
                                    a chat request logs its chat template's ids),
     "output_ids": [...],          every id sent, a matched stop id included
     "text": "...",                all the text sent, the stop token trimmed, as skip_special_tokens
                                    said (chat: the reasoning and content deltas joined; the line
                                    then also holds "reasoning_content" and "content")
     "finish_reason": {...} | null (null after an error; an abort's, sim.aborts, says "abort"),
     "completion_tokens": n,       == len(output_ids): the true count
     "stream": bool, "stream_interval": n, "incremental": bool,
     "faults": [...]}              "abort", "error_chunk", "stall", "drop_chunk", "miscount"

A request aborted by /abort_request while its client reads gets a line (its last chunk went out);
`faults` then lists what struck before the abort ("stall", "drop_chunk"). A client that left gets
none, even if the request decoded on to its finish.

Corruptions are not applied to the line: a dropped chunk's ids and text are in it, and
`completion_tokens` is the true count even when the response reported one more; `faults` says
how what the client got differs ("miscount" only where a final count was sent: not for a chat
stream without include_usage, nor after an error or a non-streaming abort). `incremental` is
whether the stream carried deltas (a non-streaming response is never incremental);
`stream_interval` is the request's effective one.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from genfleet.sim.completion import CompletionPlan
    from genfleet.sim.engine import Frames, Served


class CompletionLog:
    """Appends lines to a file, flushed per line so a reader (or a killed server) loses none."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8", buffering=1 << 16)

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def served_record(
    head: dict[str, Any],
    plan: CompletionPlan,
    frames: Frames,
    served: Served,
    *,
    stream: bool,
    stream_interval: int,
    incremental: bool,
) -> dict[str, Any]:
    """The line of one served request: `head` (rid, api, continues, prompt), then what was sent."""
    return {
        **head,
        "output_ids": plan.output_ids[: served.generated],
        **frames.streamed(served.generated),
        "finish_reason": served.finish_reason,
        "completion_tokens": min(served.generated, len(plan.output_ids)),
        "stream": stream,
        "stream_interval": stream_interval,
        "incremental": incremental,
        "faults": list(served.faults),
    }


def read_completion_log(path: Path | str) -> list[dict[str, Any]]:
    """Every line of a completion log, in the order the responses finished."""
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]
