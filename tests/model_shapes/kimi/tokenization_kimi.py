"""A stand-in for the Kimi-K2 family's `tokenization_kimi.py`, written here in its public shape (the
class the repositories' `auto_map` names, `TikTokenTokenizer`, a transformers `PreTrainedTokenizer`
over the tiktoken ranks in `tiktoken.model`, with Kimi's `pat_str`, 256 special slots from the rank
count on, named by `added_tokens_decoder`, the rest `<|reserved_token_{id}|>`):

- `encode(text)` with no keyword arguments is tiktoken's with every special string allowed; with any
  keyword it is transformers' slow path (split at added tokens, then `_tokenize`);
- `decode(ids)` with no keyword arguments is tiktoken's exact text; with any, transformers' path
  over the byte-to-unicode strings;
- no BOS is added.

Its imports are the family's (tiktoken, `tiktoken.load.load_tiktoken_bpe`, `tokenizers.AddedToken`,
transformers' `PreTrainedTokenizer`), except GPT-2's `bytes_to_unicode`: the family's file imports it
from `transformers.models.gpt2.tokenization_gpt2`, which transformers 5 no longer defines (5.19 and
5.25 checked; it lives in `convert_slow_tokenizer`), so it is taken from there when that import fails.
Loaded by genfleet, vLLM and SGLang alike only with trust_remote_code. Not genfleet code: a test input.
"""
import os
from typing import Any

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from tokenizers import AddedToken
from transformers import PreTrainedTokenizer

try:
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode
except ImportError:  # transformers 5
    from transformers.convert_slow_tokenizer import bytes_to_unicode

VOCAB_FILES_NAMES = {"vocab_file": "tiktoken.model"}


class TikTokenTokenizer(PreTrainedTokenizer):
    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]
    num_reserved_special_tokens = 256
    pat_str = "|".join([
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ])

    def __init__(self, vocab_file: str, bos_token: Any = "[BOS]", eos_token: Any = "[EOS]", unk_token: Any = None,
                 pad_token: Any = None, additional_special_tokens: Any = None, added_tokens_decoder: Any = None,
                 **kwargs: Any) -> None:
        assert os.path.isfile(vocab_file), vocab_file
        names = {int(i): (t.content if isinstance(t, AddedToken) else t["content"] if isinstance(t, dict) else str(t))
                 for i, t in (added_tokens_decoder or {}).items()}
        self.vocab_file = vocab_file
        ranks = load_tiktoken_bpe(vocab_file)
        base = len(ranks)
        self.special_tokens = {names.get(i, f"<|reserved_token_{i}|>"): i
                               for i in range(base, base + self.num_reserved_special_tokens)}
        self.model = tiktoken.Encoding(name=os.path.basename(vocab_file), pat_str=self.pat_str,
                                       mergeable_ranks=ranks, special_tokens=self.special_tokens)
        self.n_words = self.model.n_vocab
        self.bos_id = self.special_tokens[str(bos_token)]
        self.eos_id = self.special_tokens[str(eos_token)]
        self.pad_id = self.special_tokens[str(pad_token)]
        self.unk_id = self.special_tokens[str(unk_token)]
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {v: k for k, v in self.byte_encoder.items()}
        self.decoder = {i: "".join(self.byte_encoder[b] for b in self.model.decode_single_token_bytes(i))
                        for i in range(self.n_words)}
        self.encoder = {text: i for i, text in self.decoder.items()}
        super().__init__(bos_token=bos_token, eos_token=eos_token, unk_token=unk_token, pad_token=pad_token,
                         additional_special_tokens=additional_special_tokens,
                         added_tokens_decoder=added_tokens_decoder, **kwargs)

    def encode(self, text: Any, allow_special_tokens: bool = True, **kwargs: Any) -> list[int]:
        if kwargs:
            return super().encode(text, **kwargs)
        if allow_special_tokens:
            return self.model.encode(text, allowed_special="all")
        return self.model.encode(text, disallowed_special=())

    def decode(self, token_ids: Any, **kwargs: Any) -> str:
        if kwargs:
            return super().decode(token_ids, **kwargs)
        return self.model.decode([token_ids] if isinstance(token_ids, int) else list(token_ids))

    @property
    def vocab_size(self) -> int:
        return self.n_words

    def get_vocab(self) -> dict[str, int]:
        return dict(self.encoder)

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        return [self.decoder[t] for t in self.encode(text)]

    def _convert_token_to_id(self, token: str) -> int:
        return self.encoder.get(token, self.unk_id)

    def _convert_id_to_token(self, index: int) -> str:
        return self.decoder.get(index, "")

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return bytearray(self.byte_decoder[c] for c in "".join(tokens)).decode("utf-8", "replace")

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        return (self.vocab_file,)
