"""What the fidelity tests share: prompts whose planned completions cover every length, and the
check of records against the simulator's own completion log (what it generated, not our prediction
of it)."""
from __future__ import annotations

from genfleet.common.reasoning import split_reasoning
from genfleet.producer.prompts import PromptTemplater
from genfleet.sim.vocab import SimVocab
from helpers.paths import TOKENIZER
from helpers.sim_in_process import parse_sim_args


def prompts_covering_every_length(flags: tuple[str, ...], max_length: int, max_new_tokens: int) -> list[int]:
    """The numbers n of prompts "question n", one for each completion length 1..max_length, found
    with the simulator's own planner."""
    settings = parse_sim_args(flags)
    vocab = SimVocab.from_tokenizer_dir(TOKENIZER)
    templater = PromptTemplater(str(TOKENIZER), None)
    chosen: dict[int, int] = {}
    batch = 0
    while len(chosen) < max_length:
        numbers = range(batch * 500, (batch + 1) * 500)
        rendered = templater.render([[{"role": "user", "content": f"question {i}"}] for i in numbers])
        for number, ids in zip(numbers, rendered, strict=True):
            length = settings.plan(ids, vocab=vocab, max_new_tokens=max_new_tokens).completion_tokens
            chosen.setdefault(length, number)
        batch += 1
        assert batch < 20, f"only {len(chosen)} lengths found"
    return [chosen[length] for length in sorted(chosen)]


def check_against_log(records: list[dict], log: list[dict]) -> None:
    """Each record's ids and text are those of a clean response in the server's log, byte for byte."""
    templater = PromptTemplater(str(TOKENIZER), None)
    clean = {tuple(line["input_ids"]): line for line in log if not line["faults"] and line["finish_reason"]}
    for record, ids in zip(records, templater.render([r["messages"] for r in records]), strict=True):
        line = clean[tuple(ids)]
        assert record["output_ids"] == line["output_ids"]
        assert record["usage"]["completion_tokens"] == line["completion_tokens"] == len(line["output_ids"])
        expected = split_reasoning(line["text"], "kimi_k2")
        assert (record["reasoning"], record["content"]) == (expected.reasoning, expected.content)
        marker = "</think>" if expected.closed else ""
        assert record["reasoning"] + marker + record["content"] == line["text"]
