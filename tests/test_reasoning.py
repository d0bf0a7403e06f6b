"""Reasoning parsers: every shape the output can take, split exactly (no whitespace lost)."""
import pytest

from common.reasoning import PARSER_NAMES, UnknownParserError, split_reasoning


def test_forced_open_think_splits_on_the_bare_end_marker():
    # Kimi-K2.5: the template opened <think> in the prompt, the output holds only </think>.
    split = split_reasoning(" the user asks hi.</think>Hello there", "kimi_k2")
    assert (split.reasoning, split.content, split.closed) == (" the user asks hi.", "Hello there", True)


def test_model_opened_think_is_stripped_and_split():
    split = split_reasoning("<think>step one\n</think>\n\nanswer", "deepseek-r1")
    assert (split.reasoning, split.content) == ("step one\n", "\n\nanswer")


def test_truncated_inside_reasoning_keeps_everything_as_reasoning():
    split = split_reasoning("still thinking about", "kimi_k2")
    assert (split.reasoning, split.content, split.closed) == ("still thinking about", "", False)


def test_thinking_turned_off_gives_plain_content():
    split = split_reasoning("just the answer", "kimi_k2", {"thinking": False})
    assert (split.reasoning, split.content) == ("", "just the answer")
    split = split_reasoning("just the answer", "qwen3", {"enable_thinking": False})
    assert (split.reasoning, split.content) == ("", "just the answer")


def test_tool_call_marker_ends_reasoning_and_stays_in_content():
    text = "plan it<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
    split = split_reasoning(text, "kimi_k2")
    assert split.reasoning == "plan it"
    assert split.content.startswith("<|tool_calls_section_begin|>")


def test_kimi_vl_markers_and_no_forced_reasoning():
    assert split_reasoning("◁think▷hmm◁/think▷ok", "kimi").reasoning == "hmm"
    assert split_reasoning("no markers here", "kimi").content == "no markers here"


def test_none_parser_keeps_text_as_content():
    assert split_reasoning("a</think>b", "none").content == "a</think>b"


def test_reasoning_plus_marker_plus_content_reproduces_the_text():
    text = "  spaced reasoning \n</think>\n content  "
    split = split_reasoning(text, "qwen3-thinking")
    assert split.reasoning + "</think>" + split.content == text


def test_unknown_parser_is_a_clear_error():
    with pytest.raises(UnknownParserError, match="choose one of"):
        split_reasoning("x", "qwen4")
    assert "kimi_k2" in PARSER_NAMES
