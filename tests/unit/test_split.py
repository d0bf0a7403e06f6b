"""`CompletionSplitter` with the model's tokenizer (sim/model): ids that decode to the streamed text
split into reasoning and content, the matched stop token is in the ids but not in the text, and
ids that contradict the text are an IntegrityError, never a record."""
from __future__ import annotations

import pytest

from genfleet.workers.errors import IntegrityError
from genfleet.workers.generation.completion_text import CompletionSplitter
from genfleet.workers.servers.api import Generation

REASONING, CONTENT = " the user asks hi.", "Hello there"
TEXT = f"{REASONING}</think>{CONTENT}"  # kimi_k2: the template opened <think>, the output closes it


def generation(text: str, ids: list[int] | None, finish: str = "length", matched: int | str | None = None,
               ) -> Generation:
    return Generation(finish=finish, matched_stop=matched,
                      granted_tokens=len(ids or []) if finish == "length" else None, prompt_tokens=3,
                      completion_tokens=len(ids or []), reasoning_tokens=0, cached_tokens=0, first_token_s=None,
                      duration_s=0.1, text=text, output_ids=ids)


@pytest.fixture
def stopped(tokenizer) -> tuple[list[int], int]:
    """The ids of TEXT through the stop token <|im_end|>, and that token (the finish's matched stop)."""
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return tokenizer.encode(TEXT, add_special_tokens=False) + [eos], eos


def test_ids_through_the_matched_stop_token_split_like_the_text_without_it(tokenizer, stopped):
    ids, eos = stopped
    split = CompletionSplitter("kimi_k2", tokenizer).split(generation(TEXT, ids, "stop", eos), None)
    assert (split.reasoning, split.content, split.closed) == (REASONING, CONTENT, True)


def test_with_special_tokens_skipped_the_ids_still_split_exactly(tokenizer, stopped):
    ids, eos = stopped
    shown = tokenizer.decode(ids[:-1], skip_special_tokens=True)  # what the server streamed
    assert "</think>" not in shown
    splitter = CompletionSplitter("kimi_k2", tokenizer, skip_special_tokens=True)
    split = splitter.split(generation(shown, ids, "stop", eos), None)
    assert (split.reasoning, split.content) == (REASONING, CONTENT)


@pytest.mark.parametrize("tamper", ["text", "ids", "stop id without a stop finish"])
def test_ids_that_do_not_decode_to_the_streamed_text_are_an_integrity_error(tokenizer, stopped, tamper):
    ids, eos = stopped
    text, finish, matched = TEXT, "stop", eos
    if tamper == "text":
        text = TEXT.replace("there", "world")
    elif tamper == "ids":
        ids = ids[:3] + ids[4:]  # a token lost on the way
    else:
        finish, matched = "length", None  # then the stop token's text should be there
    with pytest.raises(IntegrityError, match="do not decode to the streamed text"):
        CompletionSplitter("kimi_k2", tokenizer).split(generation(text, ids, finish, matched), None)


def test_a_matched_stop_string_is_cut_from_the_text_so_the_text_need_only_start_the_decoding(tokenizer):
    ids = tokenizer.encode(f"{TEXT} STOP", add_special_tokens=False)
    split = CompletionSplitter("kimi_k2", tokenizer).split(
        generation(TEXT, ids, "stop", " STOP"), None)
    assert (split.reasoning, split.content) == (REASONING, CONTENT)


def test_without_a_tokenizer_the_text_is_split_and_turn_end_tokens_are_trimmed_only_at_the_end():
    splitter = CompletionSplitter("kimi_k2")
    split = splitter.split(generation(f"{TEXT} a </s> in html</s><|im_end|>", None), None)
    assert (split.reasoning, split.content) == (REASONING, f"{CONTENT} a </s> in html")
    # No ids to check against: the text is taken as it came, reasoning still split from it.
    assert splitter.split(generation(TEXT, [1, 2, 3]), None).content == CONTENT


def test_a_chat_generation_is_already_split_by_the_server(tokenizer):
    chat = generation("", None)
    chat.reasoning, chat.content = "thought", "answer"
    split = CompletionSplitter("kimi_k2", tokenizer).split(chat, None)
    assert (split.reasoning, split.content, split.closed) == ("thought", "answer", True)
    chat.content = None
    assert CompletionSplitter("kimi_k2").split(chat, None).closed is False


def test_with_special_tokens_skipped_a_matched_stop_string_is_cut_where_the_server_cut_it(tokenizer):
    ids = tokenizer.encode(f"{TEXT} STOP and more", add_special_tokens=False)
    skipped_text = tokenizer.decode(ids, skip_special_tokens=True)
    server_text = skipped_text[: skipped_text.find(" STOP")]
    split = CompletionSplitter("kimi_k2", tokenizer, skip_special_tokens=True).split(
        generation(server_text, ids, "stop", " STOP"), None)
    assert (split.reasoning, split.content) == (REASONING, CONTENT)


def test_a_stream_the_loop_guard_cut_may_lag_its_ids_and_is_written_as_the_ids_decode(tokenizer):
    """SGLang holds back the text of an incomplete character until a later chunk: a stream cut by
    the loop guard can end with ids whose text has not arrived yet (the review's CJK case)."""
    full = f"{TEXT} 中文"
    ids = tokenizer.encode(full, add_special_tokens=False)
    lagging = tokenizer.decode(ids[:-1], skip_special_tokens=False).rstrip("\ufffd")
    cut = generation(lagging, ids, "loop")
    split = CompletionSplitter("kimi_k2", tokenizer).split(cut, None)
    assert (split.reasoning, split.content) == (REASONING, f"{CONTENT} 中文")
    with pytest.raises(IntegrityError):  # a finished stream gets no such leeway
        CompletionSplitter("kimi_k2", tokenizer).split(generation(lagging, ids), None)
