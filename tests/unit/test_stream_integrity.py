"""Every chunking SGLang 0.5.23 can produce assembles back to exactly what the model generated, in
every stream mode, whether the server reported its mode or not; every corruption is caught.

Streams are rendered here the way sglang 0.5.23 sends them: `output_streamer.py::accept` sends the
first token at once, then a chunk whenever at least `stream_interval` tokens are unsent (a step may
add several tokens, speculative decoding), and the finished request always gets a last chunk;
`tokenizer_manager.py::_handle_batch_output` makes each chunk cumulative (default) or a delta
(`--incremental-streaming-output`); the ids include the matched stop token, the text does not
(`detokenizer_manager.py::trim_matched_stop`); the detokenizer may hold back text of incomplete
characters, so a chunk's text can lag its ids. 0.5.2 sent cumulative text with delta ids.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from genfleet.common.reasoning import REASONING_FORMATS, split_reasoning
from genfleet.workers.errors import IntegrityError
from genfleet.workers.servers.sglang import StreamAssembler
from genfleet.workers.servers.sglang_info import StreamMode
from genfleet.workers.servers.streaming import ChatStreamAssembler

CUMULATIVE, INCREMENTAL, V0_5_2 = "cumulative", "incremental", "0.5.2"
MODES = (CUMULATIVE, INCREMENTAL, V0_5_2)
STOP_ID = 2
MARKERS = sorted({m for f in REASONING_FORMATS.values() for m in (f.start, f.end, *f.also_ends)}
                 | {"<|start|>", "<|message|>", "<|return|>", "<|call|>"})


@dataclass(frozen=True)
class Completion:
    pieces: list[str]  # the text of each generated token, the stop token excluded
    stopped: bool  # finished by the stop token (its id is the last id, its text is trimmed)

    @property
    def ids(self) -> list[int]:
        ids = list(range(100, 100 + len(self.pieces)))
        return [*ids, STOP_ID] if self.stopped else ids

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def finish(self) -> dict:
        return {"type": "stop", "matched": STOP_ID} if self.stopped else {"type": "length", "length": len(self.ids)}


def sglang_boundaries(total: int, interval: int, steps: list[int]) -> list[int]:
    """Token counts at which SGLang 0.5.23 sends a chunk: the first token alone, then whenever at least
    `interval` are unsent after a decode step of `steps[k]` tokens; the last count is `total`."""
    sent, generated, ends, step = 0, 0, [], 0
    while generated < total:
        generated = min(total, generated + steps[step % len(steps)])
        step += 1
        unsent = generated - sent
        if generated == total or interval == 1 or unsent >= interval or (sent == 0 and unsent > 0):
            ends.append(generated)
            sent = generated
    return ends


def render(completion: Completion, ends: list[int], mode: str, text_lag: list[int] | None = None) -> list[dict]:
    """The `/generate` chunks for token counts `ends` (the last one final)."""
    ids, pieces = completion.ids, completion.pieces
    chunks, prev_end, prev_chars = [], 0, 0
    for k, end in enumerate(ends):
        final = k == len(ends) - 1
        # Text of the tokens sent so far (the stop token has none), held back by a lag except at the end.
        chars = len("".join(pieces[:end]))
        if not final and text_lag:
            chars = max(prev_chars, chars - text_lag[k % len(text_lag)])
        text = completion.text[:chars]
        meta = {"id": "r", "finish_reason": completion.finish if final else None, "prompt_tokens": 7,
                "completion_tokens": end, "cached_tokens": 0}
        if mode != V0_5_2:
            meta.update(reasoning_tokens=0, num_retractions=0, weight_version="default")
        if mode == CUMULATIVE:
            chunk = {"text": text, "output_ids": ids[:end]}
        elif mode == INCREMENTAL:
            chunk = {"text": text[prev_chars:], "output_ids": ids[prev_end:end]}
        else:
            chunk = {"text": text, "output_ids": ids[prev_end:end]}
        chunks.append({**chunk, "meta_info": meta})
        prev_end, prev_chars = end, chars
    return chunks


def assemble(chunks: list[dict], known: bool | None) -> StreamAssembler:
    assembler = StreamAssembler(incremental=known)
    for chunk in chunks:
        assembler.feed(chunk)
    assert assembler.finished
    return assembler


def reported(mode: str, server_says: bool) -> bool | None:
    """What `/server_info` reports for the mode (0.5.2 had no such field), or None if not asked."""
    return None if not server_says or mode == V0_5_2 else mode == INCREMENTAL


# -- completions: reasoning, a marker, content, with multi-byte and whitespace-only parts ----------------
words = st.text(alphabet=st.sampled_from(list("ab \n\t") + ["é", "中", "文", "🙂", "ß", " ", "\u200b"]),
                max_size=12)
pieces = st.lists(st.one_of(words, st.sampled_from(MARKERS)), min_size=1, max_size=60)
completions = st.builds(Completion, pieces=pieces, stopped=st.booleans())
schedules = st.tuples(st.sampled_from([1, 2, 3, 8, 32, 1000]), st.lists(st.integers(1, 6), min_size=1, max_size=5))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(completions, schedules, st.sampled_from(MODES), st.booleans(),
       st.lists(st.integers(0, 3), min_size=1, max_size=4))
def test_any_sglang_chunking_assembles_to_the_exact_completion(completion, schedule, mode, server_says, lag):
    interval, steps = schedule
    ends = sglang_boundaries(len(completion.ids), interval, steps)
    assembler = assemble(render(completion, ends, mode, lag), reported(mode, server_says))
    assert assembler.output_ids == completion.ids
    assert assembler.text == completion.text


@settings(max_examples=300, deadline=None)
@given(completions, st.data(), st.sampled_from(MODES), st.booleans())
def test_any_chunk_boundaries_at_all_assemble_to_the_exact_completion(completion, data, mode, server_says):
    total = len(completion.ids)
    cuts = data.draw(st.sets(st.integers(1, max(total - 1, 1)), max_size=total)) if total > 1 else set()
    ends = sorted({*cuts, total})
    assembler = assemble(render(completion, ends, mode), reported(mode, server_says))
    assert (assembler.output_ids, assembler.text) == (completion.ids, completion.text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40), st.text(max_size=40), st.sampled_from(sorted(REASONING_FORMATS)),
       schedules, st.sampled_from(MODES), st.booleans())
def test_reasoning_and_content_survive_every_mode_and_chunking(reasoning, content, parser, schedule, mode, server_says):
    fmt = REASONING_FORMATS[parser]
    assume(not fmt.harmony)
    assume(not any(m in reasoning or m in content for m in MARKERS))
    assume(not any(m.startswith(reasoning[-k:]) for m in MARKERS for k in range(1, len(reasoning) + 1)))
    prefix = "" if fmt.forced else fmt.start
    text_pieces = [*([prefix] if prefix else []), *reasoning, fmt.end, *content]
    completion = Completion(text_pieces, stopped=True)
    interval, steps = schedule
    ends = sglang_boundaries(len(completion.ids), interval, steps)
    assembler = assemble(render(completion, ends, mode), reported(mode, server_says))
    split = split_reasoning(assembler.text, parser)
    assert (split.reasoning, split.content) == (reasoning, content)


# -- the regression of issue 12: two chunks, the second one final ----------------------------------------
@pytest.mark.parametrize("server_says", [True, False], ids=["mode-reported", "mode-inferred"])
@pytest.mark.parametrize("mode", MODES)
def test_a_completion_in_exactly_two_chunks_keeps_its_first_chunk(mode, server_says):
    """SGLang sends the first token alone; a completion of 2 to stream_interval + 1 tokens then ends
    with one final chunk. Inferring the mode only from non-final chunks kept just the final delta."""
    completion = Completion(["<think>", "Let", " me", " think", "</think>", "Hi"], stopped=True)
    chunks = render(completion, sglang_boundaries(len(completion.ids), 32, [1]), mode)
    assert len(chunks) == 2 and chunks[1]["meta_info"]["finish_reason"] is not None
    assembler = assemble(chunks, reported(mode, server_says))
    assert assembler.text == "<think>Let me think</think>Hi"
    assert assembler.output_ids == completion.ids


@pytest.mark.parametrize("mode", MODES)
def test_single_chunk_and_single_token_completions(mode):
    for completion in (Completion([], stopped=True), Completion(["x"], stopped=False), Completion(["x"], stopped=True)):
        for known in (None, reported(mode, True)):
            assembler = assemble(render(completion, [len(completion.ids)], mode), known)
            assert (assembler.output_ids, assembler.text) == (completion.ids, completion.text)


def test_an_empty_final_delta_is_not_mistaken_for_a_cumulative_chunk():
    completion = Completion(["a", "b", "c"], stopped=False)
    chunks = render(completion, [1, 3], INCREMENTAL)
    empty_final = {"text": "", "output_ids": [], "meta_info": {**chunks[-1]["meta_info"]}}
    chunks[-1]["meta_info"] = {**chunks[-1]["meta_info"], "finish_reason": None}
    assembler = assemble([*chunks, empty_final], None)
    assert (assembler.output_ids, assembler.text) == (completion.ids, "abc")


# -- corruption is caught, never written -----------------------------------------------------------------
long_completions = st.builds(Completion, pieces=st.lists(words.filter(bool), min_size=6, max_size=60),
                             stopped=st.booleans())


@settings(max_examples=200, deadline=None)
@given(long_completions, st.sampled_from([INCREMENTAL, V0_5_2]), st.booleans(), st.data())
def test_a_dropped_delta_chunk_is_an_integrity_error(completion, mode, server_says, data):
    ends = sglang_boundaries(len(completion.ids), 2, [1])
    chunks = render(completion, ends, mode)
    assume(len(chunks) >= 3)
    drop = data.draw(st.integers(0, len(chunks) - 2))
    with pytest.raises(IntegrityError):
        assemble(chunks[:drop] + chunks[drop + 1:], reported(mode, server_says))


@settings(max_examples=200, deadline=None)
@given(long_completions, st.sampled_from(MODES), st.booleans(), st.integers(-3, 3).filter(bool))
def test_a_final_completion_tokens_that_disagrees_is_an_integrity_error(completion, mode, server_says, off):
    chunks = render(completion, sglang_boundaries(len(completion.ids), 4, [1, 2]), mode)
    final = chunks[-1]["meta_info"]
    assume(final["completion_tokens"] + off >= 0)
    # The one blind spot of inferring the mode (why the server's word comes first): a final count
    # off by exactly the ids already received makes a cumulative chunk read as a consistent delta.
    assume(reported(mode, server_says) is not None or len(chunks) > 2 or abs(off) != len(chunks[0]["output_ids"]))
    chunks[-1]["meta_info"] = {**final, "completion_tokens": final["completion_tokens"] + off}
    with pytest.raises(IntegrityError):
        assemble(chunks, reported(mode, server_says))


@pytest.mark.parametrize("server_says", [True, False])
def test_a_repeated_delta_chunk_is_an_integrity_error(server_says):
    completion = Completion(list("abcdefgh"), stopped=True)
    chunks = render(completion, [1, 4, 9], INCREMENTAL)
    with pytest.raises(IntegrityError):
        assemble([chunks[0], chunks[1], chunks[1], chunks[2]], reported(INCREMENTAL, server_says))


def test_a_cumulative_chunk_whose_text_does_not_extend_the_last_is_an_integrity_error():
    completion = Completion(list("abcdefgh"), stopped=True)
    chunks = render(completion, [1, 4, 9], CUMULATIVE)
    chunks[1] = {**chunks[1], "text": "aXc"}
    with pytest.raises(IntegrityError, match="text does not extend"):
        assemble(chunks, False)


def test_a_server_that_reports_cumulative_but_sends_deltas_is_caught():
    completion = Completion(list("abcdefgh"), stopped=True)
    with pytest.raises(IntegrityError):
        assemble(render(completion, [1, 4, 9], INCREMENTAL), False)


def test_a_final_chunk_without_completion_tokens_is_an_integrity_error():
    chunks = render(Completion(list("abc"), stopped=False), [1, 3], CUMULATIVE)
    del chunks[-1]["meta_info"]["completion_tokens"]
    with pytest.raises(IntegrityError, match="no completion_tokens"):
        assemble(chunks, None)


# -- the server's word on its mode ------------------------------------------------------------------------
@pytest.mark.parametrize("info, expected", [
    ({"incremental_streaming_output": True, "stream_interval": 32}, StreamMode(True, 32)),
    ({"incremental_streaming_output": False, "stream_interval": 1}, StreamMode(False, 1)),
    ({"stream_interval": 8}, StreamMode(None, 8)),  # 0.5.2: no such field, infer
    ({"incremental_streaming_output": "yes"}, StreamMode(None, None)),
    ([], StreamMode(None, None)),
])
def test_the_stream_mode_is_read_from_server_info(info, expected):
    assert StreamMode.from_server_info(info) == expected


# -- /v1/chat/completions -----------------------------------------------------------------------------
def chat_chunk(reasoning=None, content=None, finish=None, usage=None):
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
             "choices": [] if usage else [{"index": 0, "delta": {"reasoning_content": reasoning, "content": content},
                                           "logprobs": None, "finish_reason": finish, "matched_stop": None}]}
    if usage:
        chunk["usage"] = usage
    return chunk


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), words), max_size=30))
def test_chat_deltas_concatenate_exactly(deltas):
    assembler = ChatStreamAssembler()
    for is_reasoning, text in deltas:
        assembler.feed(chat_chunk(reasoning=text if is_reasoning else None, content=None if is_reasoning else text))
    assembler.feed(chat_chunk(finish="stop"))
    assembler.feed(chat_chunk(usage={"prompt_tokens": 3, "completion_tokens": max(len(deltas), 1)}))
    assembler.verify()
    assert assembler.reasoning == "".join(t for r, t in deltas if r)
    assert assembler.content == "".join(t for r, t in deltas if not r)


def test_a_chat_stream_without_its_usage_chunk_is_an_integrity_error():
    assembler = ChatStreamAssembler()
    assembler.feed(chat_chunk(content="hi"))
    assembler.feed(chat_chunk(finish="stop"))
    with pytest.raises(IntegrityError, match="usage"):
        assembler.verify()


def test_a_chat_stream_with_text_but_zero_tokens_is_an_integrity_error():
    assembler = ChatStreamAssembler()
    assembler.feed(chat_chunk(content="hi"))
    assembler.feed(chat_chunk(finish="stop"))
    assembler.feed(chat_chunk(usage={"prompt_tokens": 3, "completion_tokens": 0}))
    with pytest.raises(IntegrityError):
        assembler.verify()
