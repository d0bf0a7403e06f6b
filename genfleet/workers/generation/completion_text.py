"""A completion's text from its token ids, as the server itself detokenized it, and its split into
reasoning and content (`CompletionSplitter`).

Both servers detokenize a request's output with the prompt's last ids in front and send only the
text that follows them: SGLang 0.5.23 (`managers/schedule_batch.py` `init_incremental_detokenize`:
the last `INIT_INCREMENTAL_DETOKENIZATION_OFFSET = 5` prompt ids, then
`managers/detokenizer_manager.py`: `decode(surr + new)[len(decode(surr)):]`), vLLM 0.32.0
(`v1/engine/detokenizer.py`: `FastIncrementalDetokenizer` primes tokenizers' `DecodeStream` with the
prompt's ids, `SlowIncrementalDetokenizer` starts 5 tokens back, `tokenizers/detokenizer_utils.py`
`INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET`). For a byte-level decoder that changes nothing. For a
space-joining one (SentencePiece's `Strip(" ", 1, 0)` decoder, as Llama-2 and Mistral have; a
WordPiece decoder) it does: a lone `▁word` decodes to "word" but after any prefix to " word", so the
server's text starts with a space that `decode(output_ids)` drops. The worker decodes the same way
(`decode_after`), with the same 5 prompt ids in front (`Generation.prompt_context`), and so compares
with, and records, exactly what the server sent.

Splitting a generation into reasoning and content, exactly as the model produced them:
- over the chat API: the server split them already.
- with token ids and the model's tokenizer at hand: the ids are decoded and must give the server's
  text (`IntegrityError` otherwise); the split runs on the decoding with special tokens kept, so it
  does not depend on the server's `skip_special_tokens`.
- with text alone: split the text, which is why requests ask `skip_special_tokens: false`.
The server's text leaves out a matched stop token while its ids keep it (SGLang 0.5.23
`managers/detokenizer_manager.py::trim_matched_stop` drops the last id before decoding when the
match is a token id; `schedule_batch.py` sets `finished_len = matched_pos + 1`), so the decoding is
compared both with and without that last id. A matched stop *string* is cut from the text, so there
the text need only be a prefix of the decoding.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tokenizers.decoders import DecodeStream

from genfleet.common.reasoning import ReasoningSplit, split_reasoning
from genfleet.workers.errors import IntegrityError
from genfleet.workers.servers.api import Generation

# The prompt ids both servers decode a completion after (SGLang's surrogate offset, vLLM's slow
# path's prefix offset; vLLM's fast path primes with the whole prompt, which gives the same text:
# a decoder's output depends on its prefix only through whether there is one).
PROMPT_CONTEXT_IDS = 5


def decode_after(tokenizer: Any, context: Sequence[int], ids: Sequence[int], *, skip_special_tokens: bool) -> str:
    """`ids`' text as a server sends it after `context`: the decoding of both, less the context's."""
    if not context:
        return tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
    before = tokenizer.decode(list(context), skip_special_tokens=skip_special_tokens)
    return tokenizer.decode([*context, *ids], skip_special_tokens=skip_special_tokens)[len(before):]


# tokenizers' `DecodeStream.step` raises this when a decoding no longer extends the text already sent
# (0.23 `tokenizers/src/tokenizer/mod.rs`): a byte-fallback byte that a later byte turns from U+FFFD
# into part of another character.
INVALID_PREFIX = "Invalid prefix encountered"


def decode_streamed(tokenizer: Any, context: Sequence[int], ids: Sequence[int], *,
                    skip_special_tokens: bool) -> str | None:
    """`ids`' text as vLLM 0.32.0's fast detokenizer streams it after `context`
    (`v1/engine/detokenizer.py` `FastIncrementalDetokenizer`), or None for a tokenizer without a Rust
    backend (vLLM decodes those with its slow path, which `decode_after` follows).

    It is tokenizers' `DecodeStream` primed with the prompt's ids, stepped id by id, and differs from
    `decode_after` where that stream raises `INVALID_PREFIX`: vLLM then starts a fresh stream at the
    id that raised (`_protected_step`, vLLM issue #17448), so the text the old stream held back, a
    U+FFFD and what followed it in that step, is never sent, though the ids keep it. With
    `spaces_between_special_tokens` false (what the worker asks: servers/vllm.py) an added token right
    after another is sent as its bare content (`decode_next`)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    stream = DecodeStream(ids=list(context), skip_special_tokens=skip_special_tokens)
    added = {} if skip_special_tokens else {i: t.content for i, t in backend.get_added_tokens_decoder().items()}
    pieces: list[str] = []
    after_added = False
    for token in ids:
        try:
            piece = stream.step(backend, token)
        except Exception as error:  # tokenizers raises a bare Exception
            if not str(error).startswith(INVALID_PREFIX):
                raise
            stream = DecodeStream(skip_special_tokens=skip_special_tokens)
            piece = stream.step(backend, token)
        content = added.get(token)
        if content is not None and after_added:
            piece = content
        after_added = content is not None
        pieces.append(piece or "")
    return "".join(pieces)


# What a decoder shows for bytes that are not (yet) a whole UTF-8 character.
REPLACEMENT = "\ufffd"

# Tokens that end a turn or a sequence; they carry no text of the model's.
TURN_END_TOKENS = ("<|im_end|>", "[EOS]", "[EOT]", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>",
                   "<｜end▁of▁sentence｜>", "<|return|>", "</s>")


class CompletionSplitter:
    def __init__(self, parser: str, tokenizer: Any | None = None, *, skip_special_tokens: bool = False) -> None:
        self.parser = parser
        self.tokenizer = tokenizer
        # What the requests asked the server for: the text it sent is decoded that way.
        self.skip_special_tokens = skip_special_tokens
        self._strip_tokens: tuple[str, ...] | None = None

    @property
    def _strip(self) -> tuple[str, ...]:
        """The end tokens stripped from a completion's end: read from the tokenizer at first use (a
        worker's may still be loading when it is built: common/tokenizer.py)."""
        if self._strip_tokens is None:
            strip = set(TURN_END_TOKENS)
            if self.tokenizer is not None:
                strip |= {t for t in (self.tokenizer.eos_token, self.tokenizer.bos_token, self.tokenizer.pad_token)
                          if t}
            self._strip_tokens = tuple(sorted(strip, key=len, reverse=True))
        return self._strip_tokens

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
        matched = generation.matched_stop
        surfaces = [ids[:-1], ids] if generation.stop_token else [ids]
        # A stream the loop guard cut ended on a chunk whose text may lag its ids (SGLang holds back
        # an incomplete character until a later chunk): the ids' decoding extends the text then.
        cut = generation.finish == "loop"
        decodings = self._decodings(generation, surfaces)
        for surface, shown in decodings:
            if shown == text or ((isinstance(matched, str) or cut) and shown.startswith(text)):
                if cut and not self.skip_special_tokens:
                    return shown
                return text if not self.skip_special_tokens else self._kept(generation.prompt_context, surface, matched)
            # The stream ended inside a character: the cap, or a stop token, came after its first
            # bytes. vLLM leaves what it cannot show yet out of its text, and ends there (0.32.0
            # `v1/engine/detokenizer.py` `FastIncrementalDetokenizer`: tokenizers' DecodeStream yields
            # text only for whole characters; `tokenizers/detokenizer_utils.py` holds back a text
            # that ends in U+FFFD), the stop token's own text left out as well. Its record is its
            # text; a continuation decodes the joined ids whole.
            ended_inside = generation.finish == "length" or (generation.stop_token and len(surface) < len(ids))
            if ended_inside and shown.startswith(text) and not shown[len(text):].strip(REPLACEMENT):
                if not self.skip_special_tokens:
                    return text
                return self._kept(generation.prompt_context, surface, matched).rstrip(REPLACEMENT)
        decoded = decodings[len(surfaces) - 1][1]  # all the ids, decoded after the prompt's
        raise IntegrityError(f"stream integrity: the {len(ids)} output ids do not decode to the streamed text "
                             f"({len(text)} characters; {_first_difference(decoded, text)})")

    def _decodings(self, generation: Generation, surfaces: list[list[int]]) -> list[tuple[list[int], str]]:
        """Each surface's text as the server would have sent it: decoded after the prompt's ids and,
        from vLLM's fast detokenizer, as its stream decodes them (`decode_streamed`)."""
        context, skip = generation.prompt_context, self.skip_special_tokens
        decodings = [(surface, self._decode(context, surface, skip_special_tokens=skip)) for surface in surfaces]
        if generation.decode_stream:
            for surface in surfaces:
                streamed = decode_streamed(self.tokenizer, context, surface, skip_special_tokens=skip)
                if streamed is not None:
                    decodings.append((surface, streamed))
        return decodings

    def _decode(self, context: Sequence[int], ids: list[int], *, skip_special_tokens: bool) -> str:
        return decode_after(self.tokenizer, context, ids, skip_special_tokens=skip_special_tokens)

    def _kept(self, context: Sequence[int], ids: list[int], matched: object) -> str:
        """The ids decoded with special tokens kept, cut where the server cut a matched stop string."""
        assert self.tokenizer is not None  # called by checked_text only
        kept = self._decode(context, ids, skip_special_tokens=False)
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
