"""Reasoning parsers: every shape the output can take, split exactly (no whitespace lost)."""
import pytest

from genfleet.common.reasoning import PARSER_NAMES, UnknownParserError, split_reasoning


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


def test_gpt_oss_analysis_channel_is_reasoning_and_final_is_content():
    text = ("<|channel|>analysis<|message|>Let me think.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>Hello!")
    split = split_reasoning(text, "gpt-oss")
    assert (split.reasoning, split.content, split.closed) == ("Let me think.", "Hello!", True)


def test_gpt_oss_tool_calls_are_kept_verbatim_in_content():
    call = "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}"
    split = split_reasoning("<|channel|>analysis<|message|>plan<|end|>" + call + "<|call|>", "gpt-oss")
    assert split.reasoning == "plan" and split.content == call + "<|call|>"


# --- any chunking gives the same split as the whole text ----------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from genfleet.common.reasoning import ReasoningStream  # noqa: E402

PIECES = ["plain", " words", "\n", "<think>", "</think>", "<", "</", "think>", "◁think▷", "◁/think▷",
          "<|tool_calls_section_begin|>", "<tool_call>", "<|channel|>analysis<|message|>", "<|end|>",
          "<|start|>assistant<|channel|>final<|message|>", "<|", " "]


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.sampled_from(PIECES), max_size=12), cuts=st.lists(st.integers(0, 200), max_size=8),
       parser=st.sampled_from(sorted(PARSER_NAMES)), thinking=st.sampled_from([None, True, False]))
def test_any_chunking_of_the_stream_gives_the_whole_text_split(pieces, cuts, parser, thinking):
    text = "".join(pieces)
    kwargs = None if thinking is None else {"thinking": thinking, "enable_thinking": thinking}
    whole = split_reasoning(text, parser, kwargs)
    stream = ReasoningStream(parser, kwargs)
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    for start, end in zip(bounds, bounds[1:], strict=False):
        stream.feed(text[start:end])
    stream.finish()
    assert stream.result() == whole


@settings(max_examples=200, deadline=None)
@given(reasoning=st.text(alphabet="ab <>/\n", max_size=30), content=st.text(alphabet="ab <>/\n", max_size=30),
       cut=st.integers(0, 80))
def test_forced_reasoning_is_recovered_exactly_for_any_text_and_split_point(reasoning, content, cut):
    if "</think>" in reasoning or reasoning.lstrip().startswith("<think>"):
        return  # the model's own reasoning would contain a marker: not a faithful example
    text = reasoning + "</think>" + content
    stream = ReasoningStream("kimi_k2")
    stream.feed(text[:cut])
    stream.feed(text[cut:])
    stream.finish()
    assert (stream.reasoning, stream.content) == (reasoning, content)


# --- semantics aligned with SGLang 0.5.23's server (found by `make oracle`, docs/reasoning-formats.md) ---
def test_qwen3_thinking_tool_call_ends_reasoning_like_sglangs_qwen3_detector():
    # SGLang maps qwen3-thinking to Qwen3Detector, whose tool_start_token is <tool_call>.
    split = split_reasoning("plan it\n<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "qwen3-thinking")
    assert (split.reasoning, split.content) == ("plan it\n", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>")


def test_whitespace_before_the_models_own_start_marker_is_kept():
    # Forced: the output starts inside reasoning, so the whitespace is reasoning (as SGLang streams it).
    split = split_reasoning("\n<think>step</think>answer", "deepseek-r1")
    assert (split.reasoning, split.content) == ("\nstep", "answer")
    # Not forced: it came before reasoning opened, so it is content.
    split = split_reasoning(" ◁think▷hmm◁/think▷ok", "kimi")
    assert (split.reasoning, split.content) == ("hmm", " ok")


def test_gpt_oss_commentary_preamble_body_is_content():
    text = ("<|channel|>analysis<|message|>plan<|end|>"
            "<|start|>assistant<|channel|>commentary<|message|>Checking the weather.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>Sunny.")
    split = split_reasoning(text, "gpt-oss")
    assert (split.reasoning, split.content) == ("plan", "Checking the weather.Sunny.")


def test_gpt_oss_builtin_tool_call_on_analysis_is_content_not_reasoning():
    call = "<|start|>assistant<|channel|>analysis to=browser.search <|constrain|>json<|message|>{\"q\": \"x\"}<|call|>"
    split = split_reasoning("<|channel|>analysis<|message|>look it up<|end|>" + call, "gpt-oss")
    assert (split.reasoning, split.content, split.closed) == ("look it up", call, True)


def test_gpt_oss_text_between_messages_is_content_and_the_next_message_still_routes():
    text = "<|channel|>analysis<|message|>a<|end|>\n<|start|>assistant<|channel|>analysis<|message|>b<|end|>"
    split = split_reasoning(text, "gpt-oss")
    assert (split.reasoning, split.content) == ("ab", "\n")
