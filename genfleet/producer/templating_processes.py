"""Templating prompts with a Python tokenizer in several processes.

A fast tokenizer's encode is Rust and runs a batch on every core (`PromptTemplater`). A custom-code
tokenizer is a Python `PreTrainedTokenizer`: Kimi-K2's `tokenization_kimi.py` splits the text on its
special tokens and encodes each piece with tiktoken from Python, and its chat template is Jinja, so
one interpreter templates ~1,000 chat-length prompts a second on a free core, less beside the
publishing thread: 83,000 prompts would take well over a minute. Each process here loads the same
tokenizer directory and templates a share of each batch; the ids are the same as in one process
(the same code over the same files), and come back in the batch's order.

What crosses between the processes is JSON text (conversations and kwargs there, ids back), never a
pickled object of ours. The processes are spawned, not forked: the producer has a publishing thread
and a Redis connection, which a forked child would inherit half-held.
"""
from __future__ import annotations

import json
import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from genfleet.common.tokenizer import load_tokenizer, render_prompts

# A batch smaller than this is templated in the producer itself: splitting it would cost more in
# transfer than it saves (the first batch, a dataset's last rows).
POOLED_BATCH = 64

_tokenizer: Any = None  # each templating process's own


def _load(directory: str, trust_remote_code: bool) -> None:
    global _tokenizer
    _tokenizer = load_tokenizer(directory, trust_remote_code=trust_remote_code)


def _ready() -> bool:
    return _tokenizer is not None


def _render(conversations: str, chat_template_kwargs: str) -> str:
    return json.dumps(render_prompts(_tokenizer, json.loads(conversations), json.loads(chat_template_kwargs)),
                      separators=(",", ":"))


class TemplatingProcesses:
    """`processes` interpreters, each with the tokenizer at `directory` loaded, templating shares of
    a batch. They start loading at once, in the background; until a batch is large enough to split
    (`POOLED_BATCH`) the caller templates it itself."""

    def __init__(self, directory: str, *, trust_remote_code: bool, processes: int) -> None:
        self.processes = processes
        self._pool = ProcessPoolExecutor(max_workers=processes, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_load, initargs=(directory, trust_remote_code))
        # Started now: the children load while the first, small batch is templated here.
        for _ in range(processes):
            self._pool.submit(_ready)

    def render(self, conversations: list[list[dict[str, Any]]],
               chat_template_kwargs: dict[str, Any]) -> list[list[int]]:
        kwargs = json.dumps(chat_template_kwargs)
        share = -(-len(conversations) // self.processes)
        parts: list[Future[str]] = [
            self._pool.submit(_render, json.dumps(conversations[at:at + share]), kwargs)
            for at in range(0, len(conversations), share)]
        return [ids for part in parts for ids in json.loads(part.result())]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
