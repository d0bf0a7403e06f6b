"""The `tokenized` export format: `{"id", "input_ids", "loss_mask"}`, built with the run's tokenizer.

The mask rule: `loss_mask` is 1 on exactly the tokens the model generated, 0 on everything the chat
template wrote. The template itself draws the line: for each generated turn, the text the template
renders for the prompt with the generation prompt (`add_generation_prompt=True`) is the prompt, and
what the conversation with that turn added after it, up to and including the end-of-turn token, is
the model's. For the sim's model (Kimi-like template) a turn is

    <|im_assistant|>assistant<|im_middle|><think>  {reasoning}</think>{content}<|im_end|>
    └────────── prompt, mask 0 ───────────────────┘└───────────── mask 1 ─────────────────┘

so reasoning, the `</think>` marker, the content and `<|im_end|>` are 1; the role header and the
`<think>` the template opened are 0. With thinking off the template writes `<think></think>` itself
and only `{content}<|im_end|>` is 1. A turn cut at max_new_tokens (finish_reason "length") ends at
its last generated token: the markers the template would have closed it with were never generated,
so they are left out, and the sequence ends there. Earlier turns the model did not generate (the
prompt's own assistant turns) are prompt, mask 0. With `--regenerate all` every generated turn is 1
and the template text between them 0; the sequence ends with the last generated token.

Where `output_ids` were kept, a turn's tokens are those ids as the model produced them, never
re-tokenized: token-exact. SGLang 0.5.23 keeps the matched stop token in `output_ids` (only the
text drops it: `managers/detokenizer_manager.py::trim_matched_stop`); records whose ids lack it
(written by genfleet before it checked this) get it put back. Without
them, each stretch of text is tokenized on its own (no special tokens added: the template holds
them all), which is exactly how the producer tokenized the prompt.

A template that renders an earlier turn differently once a later one follows (one that drops past
reasoning, say) has no single token sequence holding every turn; such records are refused with an
error naming them, as are turns whose reasoning or content the template does not render.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from genfleet.export.conversation import Conversation, FormatError, GeneratedTurn, Record, conversation_of


class TokenizedFormat:
    def __init__(self, tokenizer: Any, chat_template_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
                 *, default_kwargs: Mapping[str, Any] | None = None) -> None:
        """`chat_template_kwargs`: per dataset, as the run was enqueued; `default_kwargs` for the
        rest (and over every dataset's when given on the command line)."""
        self.tokenizer = tokenizer
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.default_kwargs = default_kwargs
        backend = getattr(tokenizer, "backend_tokenizer", None)
        # The Rust tokenizer's batch encode, skipping the offsets nobody here reads.
        self._encode_batch = getattr(backend, "encode_batch_fast", None) or getattr(backend, "encode_batch", None)

    def __call__(self, record: Record) -> dict[str, Any]:
        conversation = conversation_of(record)
        input_ids, loss_mask = self.tokens(conversation)
        return {"id": record["id"], "input_ids": input_ids, "loss_mask": loss_mask}

    def tokens(self, conversation: Conversation) -> tuple[list[int], list[int]]:
        kwargs = dict(self._kwargs(conversation.dataset))
        full = self._render(conversation.messages, generation_prompt=False, kwargs=kwargs)
        # (text or ids, mask) pieces in order; text pieces are tokenized together at the end.
        pieces: list[tuple[str | list[int], int]] = []
        cursor = 0
        for index, turn in zip(conversation.generated, conversation.turns, strict=True):
            prompt = self._render(conversation.messages[:index], generation_prompt=True, kwargs=kwargs)
            with_turn = full if index == len(conversation.messages) - 1 else self._render(
                conversation.messages[: index + 1], generation_prompt=False, kwargs=kwargs)
            if len(prompt) < cursor or not full.startswith(prompt) or not full.startswith(with_turn):
                raise FormatError(f"{conversation.id}: the chat template renders earlier turns differently "
                                  "once later ones follow, so no single token sequence holds every turn")
            start = len(prompt)
            end = start + self._generated_length(conversation.id, turn, full[start:len(with_turn)])
            pieces.append((full[cursor:start], 0))
            pieces.append((self._turn_ids(turn) if turn.output_ids is not None else full[start:end], 1))
            cursor = end
        return self._assemble(pieces)

    def _kwargs(self, dataset: str) -> Mapping[str, Any]:
        if self.default_kwargs is not None:
            return self.default_kwargs
        return self.chat_template_kwargs.get(dataset, {})

    def _render(self, messages: list[dict[str, Any]], *, generation_prompt: bool, kwargs: dict[str, Any]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                                  **kwargs)

    def _generated_length(self, record_id: str, turn: GeneratedTurn, rendered: str) -> int:
        """How much of the template's rendering of a turn (after its generation prompt) the model
        generated: through the end-of-turn token if it stopped, through its last text if cut off."""
        for part, name in ((turn.reasoning, "reasoning"), (turn.content, "content")):
            if part and part not in rendered:
                raise FormatError(f"{record_id}: the chat template does not render the turn's {name} "
                                  "(reasoning_content / content), so its tokens cannot be masked")
        if turn.finish_reason == "stop":
            for marker in self._stop_markers(turn):
                position = rendered.rfind(marker)
                if position >= 0:
                    return position + len(marker)
            return len(rendered)
        if turn.content:
            return rendered.rfind(turn.content) + len(turn.content)
        if turn.reasoning:
            return rendered.find(turn.reasoning) + len(turn.reasoning)
        return 0

    def _stop_markers(self, turn: GeneratedTurn) -> list[str]:
        """The end-of-turn text to look for: the stop SGLang matched, else the tokenizer's EOS."""
        markers = []
        stop = turn.matched_stop
        if isinstance(stop, int):
            markers.append(self.tokenizer.decode([stop], skip_special_tokens=False))
        elif isinstance(stop, str):
            markers.append(stop)
        if self.tokenizer.eos_token:
            markers.append(self.tokenizer.eos_token)
        return [marker for marker in markers if marker]

    def _turn_ids(self, turn: GeneratedTurn) -> list[int]:
        """The turn's own token ids, the stop token the model generated included."""
        ids = list(turn.output_ids or [])
        if turn.finish_reason == "stop":
            stop = turn.matched_stop
            if isinstance(stop, int):
                if ids[-1:] != [stop]:
                    ids.append(stop)
            elif isinstance(stop, list):
                if ids[-len(stop):] != stop:
                    ids += stop
            elif isinstance(stop, str):
                ids += self._encode([stop])[0]
        return ids

    def _assemble(self, pieces: list[tuple[str | list[int], int]]) -> tuple[list[int], list[int]]:
        texts = [piece for piece, _ in pieces if isinstance(piece, str)]
        encoded = iter(self._encode(texts))
        input_ids: list[int] = []
        loss_mask: list[int] = []
        for piece, mask in pieces:
            ids = next(encoded) if isinstance(piece, str) else piece
            input_ids += ids
            loss_mask += [mask] * len(ids)
        return input_ids, loss_mask

    def _encode(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        if self._encode_batch is not None:
            return [encoding.ids for encoding in self._encode_batch(texts, add_special_tokens=False)]
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]
