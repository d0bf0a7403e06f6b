"""genfleet's reasoning split against SGLang 0.5.23 itself (run by `make oracle`, in .oracle-venv;
not collected by the project's `pytest`, whose testpaths is tests/).

Pins what docs/reasoning-formats.md says: that the formats' markers, forcing and toggles are
SGLang's, that the fixes made to match SGLang hold, and each documented difference class with
its example, on both sides, so a new SGLang or a change to common/reasoning.py that moves any of
them fails here.
"""
from __future__ import annotations

import pytest
import sglang_side as sg
import sides
from cases import KWARGS_CHOICES, THINK_FORMATS
from difference_classes import explain
from outcomes import run_cases

from genfleet.common.reasoning import PARSER_NAMES, REASONING_FORMATS, starts_in_reasoning

THINK = sorted(THINK_FORMATS)


def test_sglang_is_the_version_the_doc_describes():
    import sglang

    assert sglang.__version__ == sg.SGLANG_VERSION


@pytest.mark.parametrize("parser", [p for p in PARSER_NAMES if p != "none"])
def test_every_parser_name_is_an_sglang_parser_name(parser):
    assert parser in sg.REASONING_PARSER_NAMES


@pytest.mark.parametrize("parser", THINK)
def test_markers_are_sglangs(parser):
    fmt, facts = REASONING_FORMATS[parser], sg.detector_facts(parser)
    assert (fmt.start, fmt.end) == (facts["start"], facts["end"])
    assert fmt.also_ends == ((facts["tool_start"],) if facts["tool_start"] else ())


@pytest.mark.parametrize("kwargs", KWARGS_CHOICES, ids=repr)
@pytest.mark.parametrize("parser", THINK)
def test_output_starts_in_reasoning_exactly_when_sglangs_server_forces_it(parser, kwargs):
    """Which formats are forced and what the toggles do: SGLang's detector state after the server
    built it for this request (force_reasoning from serving_chat, then the detector's override)."""
    detector = sg._parser(parser, kwargs, stream=True).detector
    assert starts_in_reasoning(REASONING_FORMATS[parser], kwargs) == detector._in_reasoning


# One example per documented class: (class, mode, parser, kwargs, chunks, genfleet, SGLang).
EXAMPLES = [
    ("ws-before-start", "non-stream", "kimi_k2", None, ["\n", "<think>", "plan", "</think>", "answer"],
     ("\nplan", "answer"), ("\n<think>plan", "answer")),
    ("stray-start-marker", "non-stream", "qwen3", {"enable_thinking": False},
     ["The tag ", "<think>", " opens reasoning."],
     ("", "The tag <think> opens reasoning."), ("The tag <think> opens reasoning.", "")),
    ("stray-start-marker", "stream", "qwen3", {"enable_thinking": False},
     ["The tag ", "<think>", " opens reasoning."],
     ("", "The tag <think> opens reasoning."), (" opens reasoning.", "The tag ")),
    ("stray-start-marker", "stream", "deepseek-r1", None, ["a", "</think>", "Write ", "<think>", " in HTML."],
     ("a", "Write <think> in HTML."), ("a in HTML.", "Write ")),
    ("tool-call-then-end-marker", "non-stream", "qwen3", None,
     ["plan\n", "<tool_call>", '\n{"name": "f"}\n', "</tool_call>", "</think>", "done"],
     ("plan\n", '<tool_call>\n{"name": "f"}\n</tool_call></think>done'),
     ('plan\n<tool_call>\n{"name": "f"}\n</tool_call>', "done")),
    ("harmony-held-tail", "non-stream", "gpt-oss", None,
     ["<|channel|>analysis<|message|>need weather<|end|>",
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
      '{"city": "Paris"}'],
     ("need weather",
      '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'),
     ("need weather", "")),
    ("harmony-no-channel-markers", "non-stream", "gpt-oss", None, ["Hello", " there"],
     ("", "Hello there"), ("", "")),
    ("harmony-no-channel-markers-yet", "stream", "gpt-oss", None,
     ["The analysis", " is done.", "<|channel|>final<|message|>Hi"],
     ("", "The analysis is done.Hi"), ("", "The analysis is done.<|channel|>final<|message|>Hi")),
    ("harmony-channel-terminators", "non-stream", "gpt-oss", None,
     ["<|channel|>final<|message|>Hi", "<|end|>", "<|start|>assistant<|channel|>final<|message|>", "again"],
     ("", "Hiagain"), ("", "Hi<|end|><|start|>assistant<|channel|>final<|message|>again")),
    ("harmony-stray-structural-token", "non-stream", "gpt-oss", None,
     ["<|channel|>final<|message|>x", "<|return|>", "y", "<|message|>", "z"],
     ("", "xy<|message|>z"), ("", "xyz")),
    ("harmony-commentary-filter", "non-stream", "gpt-oss", None,
     ["<|channel|>analysis<|message|>plan<|end|>", "<|start|>assistant<|channel|>commentary<|message|>", "\n\n",
      "<|end|>", "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>", "{}",
      "<|call|>"],
     ("plan", "\n\n<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>"),
     ("plan", "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>")),
    ("harmony-stream-analysis-tool-call", "stream", "gpt-oss", None,
     ["<|channel|>", "analysis to=browser.search ", "<|constrain|>", "json", "<|message|>", '{"q": ', '"x"}',
      "<|call|>"],
     ("", '<|channel|>analysis to=browser.search <|constrain|>json<|message|>{"q": "x"}<|call|>'),
     ('{"q": "x"}', "<|channel|>analysis to=browser.search <|constrain|>json<|message|><|call|>")),
    ("stream-split-marker", "stream", "gpt-oss", None,
     ["<|channel|>analysis<|message|>think<|e", "nd|><|start|>assistant<|channel|>final<|message|>Hi"],
     ("think", "Hi"), ("think<|end|><|start|>assistant<|channel|>final<|message|>Hi", "")),
]


@pytest.mark.parametrize("name, mode, parser, kwargs, chunks, ours, theirs", EXAMPLES,
                         ids=[f"{e[0]}-{e[1]}-{e[2]}" for e in EXAMPLES])
def test_documented_difference(name, mode, parser, kwargs, chunks, ours, theirs):
    assert sides.ours_whole(parser, "".join(chunks), kwargs) == ours
    assert sides.ours_stream(parser, chunks, kwargs) == ours
    assert sides.theirs(mode, parser, chunks, kwargs) == theirs
    assert name in explain(mode, parser, chunks, kwargs)
    assert "UNEXPLAINED" not in explain(mode, parser, chunks, kwargs)


# Cases where genfleet was changed to do what SGLang's server does (see the doc): both agree.
AGREED = [
    ("qwen3-thinking", None, ["plan\n", "<tool_call>", "\n{}\n", "</tool_call>"],
     ("plan\n", "<tool_call>\n{}\n</tool_call>")),
    ("gpt-oss", None, ["<|channel|>analysis<|message|>plan<|end|>",
                       "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>",
                       "<|start|>assistant<|channel|>final<|message|>Sunny."], ("plan", "Checking.Sunny.")),
    ("gpt-oss", None, ["<|channel|>analysis to=browser.search <|constrain|>json<|message|>{}<|call|>"],
     ("", "<|channel|>analysis to=browser.search <|constrain|>json<|message|>{}<|call|>")),
    ("gpt-oss", None, ["<|channel|>analysis<|message|>a<|end|>", "\n",
                       "<|start|>assistant<|channel|>analysis<|message|>b<|end|>"], ("ab", "\n")),
    ("kimi_k2", None, ["\n", "<think>", "plan", "</think>", "answer"], ("\nplan", "answer")),
    ("kimi", None, [" ", "◁think▷", "hmm", "◁/think▷", "ok"], ("hmm", " ok")),
    ("glm45", None, ["plan", "<"], ("plan<", "")),
]


@pytest.mark.parametrize("parser, kwargs, chunks, expected", AGREED, ids=[f"{a[0]}-{i}" for i, a in enumerate(AGREED)])
def test_aligned_with_sglang(parser, kwargs, chunks, expected):
    assert sides.ours_whole(parser, "".join(chunks), kwargs) == expected
    # The server's answer for these: non-streaming for complete messages, the stream otherwise.
    agree = [m for m in sides.MODES if sides.theirs(m, parser, chunks, kwargs) == expected]
    assert agree, {m: sides.theirs(m, parser, chunks, kwargs) for m in sides.MODES}


def test_a_fresh_seed_has_no_unexplained_difference():
    outcomes = run_cases(150, seed=7)
    bad = [(o.parser, o.mode, o.case.text, o.case.chunks) for o in outcomes if "UNEXPLAINED" in o.classes]
    assert not bad, bad[:5]
