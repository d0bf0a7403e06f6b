"""Loads a model's tokenizer from a local directory, the same way for a real model and the sim's.

Two shapes load here, as SGLang and vLLM load them (both through `AutoTokenizer`, 0.5.23
`srt/utils/hf_transformers_utils.py` `get_tokenizer`, 0.32.0 `vllm/tokenizers/hf.py`):
- a fast tokenizer, `tokenizer.json` (Qwen3, DeepSeek-R1, GLM-4.5, Llama/Mistral/Gemma);
- custom code named by `auto_map.AutoTokenizer` in `tokenizer_config.json`, such as the Kimi-K2
  family's `tokenization_kimi.TikTokenTokenizer` (a `PreTrainedTokenizer` over tiktoken ranks in
  `tiktoken.model`, no `tokenizer.json`). That code runs only with `trust_remote_code`, the
  servers' `--trust-remote-code` and genfleet's: without it the directory is refused before
  anything runs, in one line naming the file and the flag (`CustomCodeRefused`).
"""
from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genfleet.common import GenfleetError

# transformers warns at import that PyTorch is missing; genfleet only needs tokenizers.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


class TokenizerNotFoundError(GenfleetError, FileNotFoundError):
    pass


class CustomCodeRefused(TokenizerNotFoundError):
    """The directory's tokenizer is custom code and `trust_remote_code` was not given."""


log = logging.getLogger(__name__)

TRUST_FLAG = "--trust-remote-code"
TRUST_HOW = f"{TRUST_FLAG} (GENFLEET_TRUST_REMOTE_CODE=1, or trust_remote_code = true in the run file)"


@dataclass(frozen=True)
class TokenizerKind:
    """What a tokenizer directory holds: `custom_class` is `module.Class` of its custom code (None
    for a `tokenizer.json` or a class transformers ships)."""
    directory: Path
    custom_class: str | None

    @property
    def needs_custom_code(self) -> bool:
        return self.custom_class is not None

    @property
    def custom_file(self) -> str | None:
        """The file the custom code lives in (`tokenization_kimi.py`)."""
        if self.custom_class is None:
            return None
        module = self.custom_class.split("--")[-1].rsplit(".", 1)[0]
        return f"{module}.py"

    def describe(self) -> str:
        if self.custom_class is not None:
            return f"custom code {self.custom_class} ({self.custom_file})"
        if (self.directory / "tokenizer.json").is_file():
            return "fast (tokenizer.json)"
        return "a transformers class (no tokenizer.json)"

    def refusal(self) -> str:
        return (f"{self.directory}: its tokenizer is custom code ({self.custom_file}, class "
                f"{self.custom_class.rsplit('.', 1)[-1] if self.custom_class else '?'}, named by auto_map in "
                f"tokenizer_config.json) that runs only with {TRUST_HOW}, as SGLang's and vLLM's own {TRUST_FLAG}")


def tokenizer_kind(path: str | Path) -> TokenizerKind:
    """Read from `tokenizer_config.json`'s `auto_map.AutoTokenizer` (transformers'
    `AutoTokenizer.from_pretrained` runs the class named there: a list of the slow and the fast
    class, or one string)."""
    directory = tokenizer_directory(path)
    try:
        config = json.loads((directory / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return TokenizerKind(directory, None)
    auto = (config.get("auto_map") or {}).get("AutoTokenizer") if isinstance(config, dict) else None
    names = [auto] if isinstance(auto, str) else [name for name in auto or () if isinstance(name, str)]
    return TokenizerKind(directory, names[0] if names else None)


def load_tokenizer(path: str | Path, *, trust_remote_code: bool = False):
    """A `transformers` tokenizer with its chat template; never touches the hub. Custom code runs
    only with `trust_remote_code` (`CustomCodeRefused` otherwise, before any of it is imported)."""
    from transformers import AutoTokenizer

    kind = tokenizer_kind(path)
    directory = kind.directory
    if kind.needs_custom_code and not trust_remote_code:
        raise CustomCodeRefused(kind.refusal())
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True,
                                                  trust_remote_code=trust_remote_code)
    except ImportError as error:
        # Custom code written for another transformers, or a package it needs that is missing
        # (tiktoken): one line naming the file, not transformers' traceback.
        raise TokenizerNotFoundError(f"{directory}: its tokenizer code ({kind.custom_file or 'transformers'}) "
                                     f"does not import here: {error}") from None
    if not getattr(tokenizer, "chat_template", None):
        raise TokenizerNotFoundError(f"{directory} has no chat template (tokenizer_config.json: chat_template, "
                                     "or chat_template.jinja)")
    return tokenizer


def tokenizer_directory(path: str | Path) -> Path:
    """`path`, once it holds a tokenizer's files; raises TokenizerNotFoundError naming it otherwise."""
    directory = Path(path)
    if not (directory / "tokenizer_config.json").is_file() and not (directory / "tokenizer.json").is_file():
        raise TokenizerNotFoundError(
            f"{directory} is not a tokenizer directory (no tokenizer.json / tokenizer_config.json); "
            "pass the local model directory, genfleet never downloads from a hub"
        )
    return directory


class BackgroundTokenizer:
    """A tokenizer loaded on a thread of its own, standing in for it meanwhile: an attribute or a call
    waits for the load. A worker starts taking prompts while `transformers` loads (most of a second
    of a core; its first use is at a stream's end), so a one-box job's server starts generating
    that much sooner. The directory is checked at once: a wrong path fails the start, as before.
    A load that fails all the same (a corrupt file, no chat template) is logged and reported to
    `on_failure`; every use then raises `unavailable`, so a prompt that needed it is handled as
    the caller's local fault, never dead-lettered."""

    def __init__(self, path: str | Path, *, on_failure: Callable[[BaseException], None],
                 unavailable: Callable[[str], BaseException], trust_remote_code: bool = False) -> None:
        kind = tokenizer_kind(path)
        if kind.needs_custom_code and not trust_remote_code:
            raise CustomCodeRefused(kind.refusal())
        self.directory, self._trust_remote_code = kind.directory, trust_remote_code
        self._loaded = threading.Event()
        self._tokenizer: Any = None
        self._error: BaseException | None = None
        self._on_failure, self._unavailable = on_failure, unavailable
        threading.Thread(target=self._load, name="tokenizer-load", daemon=True).start()

    def _load(self) -> None:
        try:
            self._tokenizer = load_tokenizer(self.directory, trust_remote_code=self._trust_remote_code)
        except Exception as error:  # noqa: BLE001 - any failure: the worker cannot use this tokenizer
            log.critical("cannot load the tokenizer in %s: %s", self.directory, error)
            self._error = error
            self._on_failure(error)
        finally:
            self._loaded.set()

    @property
    def failed(self) -> bool:
        """The load ended without a tokenizer."""
        return self._loaded.is_set() and self._error is not None

    def get(self) -> Any:
        """The tokenizer, once loaded."""
        self._loaded.wait()
        if self._error is not None:
            raise self._unavailable(f"the tokenizer in {self.directory} did not load: {self._error}")
        return self._tokenizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.get(), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.get()(*args, **kwargs)


def render_prompts(tokenizer, conversations: list[list[dict]], chat_template_kwargs: dict | None = None,
                   ) -> list[list[int]]:
    """Token ids of each conversation's prompt, generation prompt included. The template already
    holds the special tokens it wants, so none are added a second time (no double BOS)."""
    texts = tokenizer.apply_chat_template(conversations, tokenize=False, add_generation_prompt=True,
                                          **(chat_template_kwargs or {}))
    return tokenizer(texts, add_special_tokens=False)["input_ids"]
