"""Loads a model's tokenizer from a local directory, the same way for a real model and the sim's."""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from genfleet.common import GenfleetError

# transformers warns at import that PyTorch is missing; genfleet only needs tokenizers.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


class TokenizerNotFoundError(GenfleetError, FileNotFoundError):
    pass


log = logging.getLogger(__name__)


def load_tokenizer(path: str | Path):
    """A `transformers` fast tokenizer with its chat template; never touches the hub."""
    from transformers import AutoTokenizer

    directory = tokenizer_directory(path)
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    if not getattr(tokenizer, "chat_template", None):
        raise TokenizerNotFoundError(f"{directory} has no chat template (tokenizer_config.json: chat_template)")
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
                 unavailable: Callable[[str], BaseException]) -> None:
        self.directory = tokenizer_directory(path)
        self._loaded = threading.Event()
        self._tokenizer: Any = None
        self._error: BaseException | None = None
        self._on_failure, self._unavailable = on_failure, unavailable
        threading.Thread(target=self._load, name="tokenizer-load", daemon=True).start()

    def _load(self) -> None:
        try:
            self._tokenizer = load_tokenizer(self.directory)
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
