"""Turns a generation into reasoning and content, exactly as the model produced them.

- `/v1/chat/completions`: the server split them already.
- `/generate` with the model's tokenizer at hand: the ids are decoded and must give the server's
  text (`IntegrityError` otherwise); the split runs on the decoding with special tokens kept, so it
  does not depend on the server's `skip_special_tokens`.
- `/generate` without it: split the text, which is why requests ask `skip_special_tokens: false`.

SGLang's text leaves out the matched stop token while its `output_ids` keep it (0.5.23
`managers/detokenizer_manager.py::trim_matched_stop` drops the last id before decoding when
`finish_reason.matched` is a token id; `schedule_batch.py` sets `finished_len = matched_pos + 1`),
so the decoding is compared both with and without that last id. A matched stop *string* is cut
from the text, so there the text need only be a prefix of the decoding.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from genfleet.common.reasoning import ReasoningSplit, split_reasoning
from genfleet.workers.errors import IntegrityError
from genfleet.workers.generation.client import Generation

# Tokens that end a turn or a sequence; they carry no text of the model's.
TURN_END_TOKENS = ("<|im_end|>", "[EOS]", "[EOT]", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>",
                   "<｜end▁of▁sentence｜>", "<|return|>", "</s>")


class CompletionSplitter:
    def __init__(self, parser: str, tokenizer: Any | None = None, *, skip_special_tokens: bool = False) -> None:
        self.parser = parser
        self.tokenizer = tokenizer
        # What the requests asked the server for: the text it sent is decoded that way.
        self.skip_special_tokens = skip_special_tokens
        strip = set(TURN_END_TOKENS)
        if tokenizer is not None:
            strip |= {t for t in (tokenizer.eos_token, tokenizer.bos_token, tokenizer.pad_token) if t}
        self._strip = tuple(sorted(strip, key=len, reverse=True))

    def split(self, generation: Generation, chat_template_kwargs: Mapping[str, Any] | None) -> ReasoningSplit:
        if generation.reasoning is not None or generation.content is not None:
            return ReasoningSplit(generation.reasoning or "", generation.content or "",
                                  closed=bool(generation.content))
        text = generation.text
        if self.tokenizer is not None and generation.output_ids:
            text = self.checked_text(generation)
        split = split_reasoning(text, self.parser, chat_template_kwargs)
        return ReasoningSplit(self._clean(split.reasoning), self._clean(split.content), split.closed)

    def checked_text(self, generation: Generation) -> str:
        """The completion's text with special tokens kept, once the ids are shown to decode to the
        server's text; raises IntegrityError when they do not."""
        assert self.tokenizer is not None  # called only with a tokenizer: by split, and by doctor with one
        ids, text = generation.output_ids or [], generation.text
        matched = generation.finish_reason.get("matched")
        surfaces = [ids[:-1], ids] if isinstance(matched, int) and not isinstance(matched, bool) else [ids]
        # A stream the loop guard cut ended on a chunk whose text may lag its ids (SGLang holds back
        # an incomplete character until a later chunk): the ids' decoding extends the text then.
        cut = generation.finish_reason.get("type") == "loop"
        for surface in surfaces:
            shown = self.tokenizer.decode(surface, skip_special_tokens=self.skip_special_tokens)
            if shown == text or ((isinstance(matched, str) or cut) and shown.startswith(text)):
                if cut and not self.skip_special_tokens:
                    return shown
                return text if not self.skip_special_tokens else self._kept(surface, matched)
        raise IntegrityError(f"stream integrity: the {len(ids)} output ids do not decode to the streamed text "
                             f"({len(text)} characters; {_first_difference(shown, text)})")

    def _kept(self, ids: list[int], matched: object) -> str:
        """The ids decoded with special tokens kept, cut where the server cut a matched stop string."""
        assert self.tokenizer is not None  # called by checked_text only
        kept = self.tokenizer.decode(ids, skip_special_tokens=False)
        at = kept.find(matched) if isinstance(matched, str) and matched else -1
        return kept if at == -1 else kept[:at]

    def _clean(self, text: str) -> str:
        # Only at the end: a model may write "</s>" inside its answer (HTML), and that is data.
        stripped = True
        while stripped:
            stripped = False
            for token in self._strip:
                if text.endswith(token):
                    text, stripped = text[: -len(token)], True
        return text


def _first_difference(decoded: str, text: str) -> str:
    at = next((i for i, (a, b) in enumerate(zip(decoded, text, strict=False)) if a != b), min(len(decoded), len(text)))
    return f"they differ at character {at}: decoded {decoded[at:at + 20]!r}, streamed {text[at:at + 20]!r}"
