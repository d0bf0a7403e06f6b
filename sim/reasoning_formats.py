"""How the simulated model marks reasoning and content, for each reasoning parser SGLang names.

A model writes `reasoning_open` + reasoning + `reasoning_close` + `content_open` + content, then
its stop token. The markers are text, encoded with the model's tokenizer: most are single special
tokens, but Harmony's headers also hold ordinary words (`analysis`, `assistant`, `final`), which
survive `skip_special_tokens` as they do on a real gpt-oss server.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from genfleet.sim.vocab import EOS, THINK_END, THINK_START, SimVocab

# The marker pieces that must be special tokens, so that `skip_special_tokens` drops them.
_SPECIAL_PIECE = re.compile(r"<\|[^|<>]+\|>|</?think>|◁/?think▷")


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    reasoning_open: str = ""
    reasoning_close: str = ""
    # Opens the answer, with or without reasoning before it (Harmony's `final` channel header).
    content_open: str = ""
    stop: str = EOS
    # A prompt ending in `reasoning_open` has opened the reasoning already (Kimi-K2.5's template
    # ends in <think>), so the output holds only the close marker.
    prompt_may_open: bool = False

    @property
    def reasons(self) -> bool:
        return bool(self.reasoning_open)

    def markers(self) -> tuple[str, ...]:
        """Every marker this format writes, stop token included."""
        return tuple(m for m in (self.reasoning_open, self.reasoning_close, self.content_open, self.stop) if m)

    def check(self, vocab: SimVocab) -> None:
        """ValueError unless the tokenizer has every special token this format writes."""
        for marker in self.markers():
            for piece in _SPECIAL_PIECE.findall(marker):
                vocab.special_id(piece)


def _think(name: str) -> ReasoningFormat:
    return ReasoningFormat(name, THINK_START, THINK_END, prompt_may_open=True)


HARMONY_REASONING_OPEN = "<|channel|>analysis<|message|>"
HARMONY_CONTENT_OPEN = "<|channel|>final<|message|>"

REASONING_FORMATS: dict[str, ReasoningFormat] = {
    f.name: f
    for f in (
        _think("kimi_k2"),
        _think("deepseek-r1"),
        _think("qwen3"),
        _think("qwen3-thinking"),
        _think("glm45"),
        ReasoningFormat("kimi", "◁think▷", "◁/think▷"),  # Kimi-VL: never opened by the prompt
        ReasoningFormat(
            "gpt-oss",
            HARMONY_REASONING_OPEN,
            "<|end|><|start|>assistant",
            HARMONY_CONTENT_OPEN,
            stop="<|return|>",
        ),
        ReasoningFormat("none"),
    )
}
REASONING_FORMAT_NAMES = tuple(REASONING_FORMATS)
DEFAULT_REASONING_FORMAT = "kimi_k2"


def reasoning_format(name: str) -> ReasoningFormat:
    try:
        return REASONING_FORMATS[name]
    except KeyError:
        raise ValueError(
            f"unknown reasoning format {name!r}; choose one of {', '.join(REASONING_FORMAT_NAMES)}"
        ) from None
