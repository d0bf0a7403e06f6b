"""The simulated model's vocabulary: which ids are words and markers, and each id's decoded text."""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

DEFAULT_TOKENIZER_DIR = Path(__file__).parent / "model"

THINK_START = "<think>"
THINK_END = "</think>"
EOS = "<|im_end|>"

# "Ġ" is byte-level BPE's leading space, so these ids decode to " word" on their own and
# any sequence of them decodes to the concatenation of their pieces.
_WORD_TOKEN = re.compile(r"^Ġ[a-z]+$")


@dataclass(frozen=True)
class SimVocab:
    """A tokenizer plus the id tables the simulator generates from."""

    path: Path
    pieces: tuple[str, ...]
    word_ids: tuple[int, ...]
    special_ids: frozenset[int]
    think_start_id: int
    think_end_id: int
    eos_id: int
    tokenizer: Tokenizer = field(repr=False, compare=False)
    _markers: dict[str, tuple[int, ...]] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def from_tokenizer_dir(cls, path: Path | str = DEFAULT_TOKENIZER_DIR) -> SimVocab:
        path = Path(path)
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        size = max(vocab.values()) + 1
        special_ids = frozenset(
            token_id for token_id, added in tokenizer.get_added_tokens_decoder().items() if added.special
        )
        return cls(
            path=path,
            # Decoding one id at a time is what makes per-token text exact for the ids we emit.
            pieces=tuple(tokenizer.decode([token_id], skip_special_tokens=False) for token_id in range(size)),
            # Sorted by id: dict order is not a promise, and the completion RNG indexes this tuple.
            word_ids=tuple(sorted(token_id for token, token_id in vocab.items() if _WORD_TOKEN.match(token))),
            special_ids=special_ids,
            think_start_id=_required_id(vocab, THINK_START),
            think_end_id=_required_id(vocab, THINK_END),
            eos_id=_required_id(vocab, EOS),
            tokenizer=tokenizer,
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def marker_ids(self, marker: str) -> tuple[int, ...]:
        """The ids of a marker the model writes (special tokens and words alike), cached."""
        ids = self._markers.get(marker)
        if ids is None:
            ids = self._markers[marker] = tuple(self.encode(marker))
        return ids

    def special_id(self, token: str) -> int:
        """The id of a special token, or ValueError if this tokenizer has none by that name."""
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None or token_id not in self.special_ids:
            raise ValueError(f"the simulator's tokenizer ({self.path}) has no special token {token!r}")
        return token_id

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool) -> str:
        special = self.special_ids if skip_special_tokens else frozenset()
        pieces = self.pieces
        return "".join([pieces[token_id] for token_id in ids if token_id not in special])


def _required_id(vocab: dict[str, int], token: str) -> int:
    try:
        return vocab[token]
    except KeyError:
        raise ValueError(f"the simulator's tokenizer has no {token!r} token") from None
