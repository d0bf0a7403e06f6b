"""What the real-server tests share: prompts that carry plan directives, enqueueing with the tier's
tokenizer, and each record's expected completion, computed from the plan alone."""
from __future__ import annotations

from pathlib import Path

from helpers.data import write_jsonl
from plan import PlanVocab, expected_completion

from genfleet.producer.prompts import PromptTemplater

# A mix of plan shapes: short and longer replies, multi-byte words throughout (the plan's words).
MIXED = ("[plan len=12 think=8]", "[plan len=40 think=30]", "[plan len=90 think=15]", "", "[plan len=3 think=70]")


def write_plan_prompts(path: Path, count: int, directives: tuple[str, ...] = MIXED, stem: str = "question") -> Path:
    """`count` rows `{"prompt": "<stem> <i> <directive>"}`, the directives taken in turn."""
    return write_jsonl(path, [{"prompt": f"{stem} {i} {directives[i % len(directives)]}".strip()}
                              for i in range(count)])


def enqueue(fleet, model: Path, run: str, *datasets: str, extra: tuple[str, ...] = ()):
    return fleet.genfleet("enqueue", "--run", run, "--tokenizer", str(model), *extra, *datasets)


class Expectations:
    """Each record's prompt ids (templated as the producer did) and the plan's completion for them."""

    def __init__(self, model: Path, vocab: PlanVocab, chat_template_kwargs: dict | None = None) -> None:
        self.templater = PromptTemplater(str(model), chat_template_kwargs)
        self.vocab = vocab

    def prompt_ids(self, record: dict) -> list[int]:
        return self.templater.render([record["messages"]])[0]

    def output_ids(self, record: dict, max_new_tokens: int) -> list[int]:
        """The ids SGLang generates, its matched stop token included."""
        return expected_completion(self.vocab, self.prompt_ids(record), max_new_tokens)

    def text(self, record: dict, max_new_tokens: int) -> str:
        """The text SGLang returns for them: the matched stop token trimmed (0.5.23
        `detokenizer_manager.py` `trim_matched_stop`)."""
        ids = self.output_ids(record, max_new_tokens)
        if ids and ids[-1] == self.vocab.eos:
            ids = ids[:-1]
        return self.vocab.decode(ids)

    def split(self, record: dict, max_new_tokens: int) -> tuple[str, str]:
        """(reasoning, content) of the plan's text when the prompt opened `<think>`."""
        reasoning, marker, content = self.text(record, max_new_tokens).partition("</think>")
        return (reasoning, content) if marker else (reasoning, "")


def start_pools(fleet, url: str, *pools: str, concurrency: int = 8) -> list:
    """One worker per pool against `url`, started together and not waited for: each takes seconds
    to start, which the enqueue that follows overlaps (a worker that dies fails `wait_finished`)."""
    return [fleet.start_worker(pool, url, concurrency=concurrency, wait=False) for pool in pools]
