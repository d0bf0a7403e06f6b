"""`data_payloads`, the workers' event-stream reader, against httpx's own line decoder (the one
`Response.iter_lines` uses) over any line ends and any cut of the body into blocks."""
from __future__ import annotations

from httpx._decoders import LineDecoder, TextDecoder
from hypothesis import given
from hypothesis import strategies as st

from genfleet.workers.servers.transport import data_payloads

# A payload never holds CR or LF (JSON escapes them); it may hold what str.splitlines also splits at,
# which JSON leaves raw (U+0085, U+2028, U+2029; orjson and json.dumps(ensure_ascii=False) alike).
SPLITLINES_ONLY = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
def texts(excluded: str) -> st.SearchStrategy[str]:
    """Text a JSON payload may hold raw: no surrogate (not UTF-8), none of `excluded`."""
    return st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters=excluded), max_size=40)


payloads = texts("\r\n")
plain_payloads = texts("\r\n" + SPLITLINES_ONLY)
other_lines = st.sampled_from([": keep-alive", "event: message", "id: 7", "retry: 1000"])
line_ends = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def event_streams(draw, payloads=payloads) -> tuple[bytes, list[bytes]]:
    events = draw(st.lists(st.tuples(payloads.map(str.strip), st.lists(other_lines, max_size=2)), max_size=12))
    end = draw(line_ends)
    text = "".join("".join(line + end for line in extra) + f"data: {payload}{end}{end}" for payload, extra in events)
    if draw(st.booleans()):
        text += "data: [DONE]" + end * draw(st.integers(0, 2))  # the last line's end may be missing
        events.append(("[DONE]", []))
    return text.encode(), [payload.encode() for payload, _ in events]


def cut(body: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({0, len(body), *(p % (len(body) + 1) for p in points)})
    return [body[a:b] for a, b in zip(edges, edges[1:], strict=False)]


@given(event_streams(), st.lists(st.integers(0, 10_000), max_size=30))
def test_any_cut_of_the_body_gives_every_payload_in_order(stream, points):
    body, expected = stream
    assert list(data_payloads(cut(body, points))) == expected


@given(event_streams(plain_payloads), st.lists(st.integers(0, 10_000), max_size=30))
def test_the_payloads_are_those_of_httpxs_own_line_decoder_where_it_splits_at_cr_and_lf_only(stream, points):
    body, _ = stream
    text, decoder = TextDecoder(), LineDecoder()  # iter_text's, then iter_lines'
    lines = [line for block in cut(body, points) for line in decoder.decode(text.decode(block))]
    lines += decoder.decode(text.flush()) + decoder.flush()
    theirs = [line[5:].strip().encode() for line in lines if line.startswith("data:")]
    assert list(data_payloads(cut(body, points))) == theirs


def test_unicode_line_separators_inside_a_payload_do_not_end_its_line():
    """httpx's decoder (`iter_lines`) splits there, as `str.splitlines` does; the event-stream
    format ends lines at CR and LF only."""
    body = 'data: {"text": "a\u2028b\x85c\u2029"}\n\n'.encode()
    assert list(data_payloads([body])) == ['{"text": "a\u2028b\x85c\u2029"}'.encode()]
    decoder = LineDecoder()
    assert len(decoder.decode(body.decode()) + decoder.flush()) > 2


def test_a_multibyte_character_cut_between_blocks_is_joined_before_it_is_decoded():
    body = 'data: {"text": "é😀"}\n\n'.encode()
    blocks = [body[:15], body[15:17], body[17:]]  # inside é, inside the emoji
    assert list(data_payloads(blocks)) == ['{"text": "é😀"}'.encode()]
