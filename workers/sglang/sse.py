"""The `data:` payloads of a server-sent event stream, read from its body's bytes as they arrive.

SGLang's streams are `data: <json>\\n\\n` events ending with `data: [DONE]` (0.5.23
`entrypoints/http_server.py` `stream_results`). Reading bytes and splitting lines here, rather than
through httpx's `iter_lines` (an incremental UTF-8 decoder, then a line decoder over text), keeps
each chunk to one split and one `json.loads` of bytes: the chunk is the unit of a worker's
streaming cost. Line ends are LF, CRLF or a lone CR, as the event-stream format allows
(WHATWG HTML, "Server-sent events", parsing an event stream); any block boundary gives the same lines.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator


def data_payloads(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """Each `data:` line's payload, stripped, in order; other lines (comments, `event:`) skipped."""
    pending = b""
    for block in blocks:
        if pending:
            block = pending + block
        # A CR that ends the block may be the first half of a CRLF cut between blocks.
        end = len(block) - 1 if block.endswith(b"\r") else len(block)
        lines = block[:end].replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        pending = lines.pop() + block[end:]
        for line in lines:
            if line.startswith(b"data:"):
                yield line[5:].strip()
    last = pending.rstrip(b"\r")  # a last line without its line end
    if last.startswith(b"data:"):
        yield last[5:].strip()
