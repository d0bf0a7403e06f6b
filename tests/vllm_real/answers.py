"""What each record must be: vLLM's own non-streamed answer for the record's prompt ids (templated
again here, as the producer did), split with the parser the workers split with."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from server import VllmProcess

from genfleet.common.reasoning import split_reasoning
from genfleet.producer.prompts import PromptTemplater


class Oracle:
    def __init__(self, server: VllmProcess, model: Path, parser: str) -> None:
        self.server, self.parser = server, parser
        self.templater = PromptTemplater(str(model))

    def prompt_ids(self, record: dict[str, Any]) -> list[int]:
        return self.templater.render([record["messages"]])[0]

    def answer(self, record: dict[str, Any], max_tokens: int, **sampling: Any) -> dict[str, Any]:
        return self.server.complete(self.prompt_ids(record), max_tokens, **sampling)

    def split(self, text: str) -> tuple[str, str]:
        split = split_reasoning(text, self.parser, None)
        return split.reasoning, split.content
