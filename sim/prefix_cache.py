"""A host's prefix cache, modelled on SGLang 0.5.23's radix cache (`mem_cache/radix_cache.py`), so
that routing requests that share a prefix to one host can be measured.

What SGLang does, and the sim after it:

- Lookup (`Req.init_next_round_input`, `managers/schedule_batch.py`): when a prefill batch takes
  a request (sim.prefill_lane), the longest cached prefix of its ids is its `cached_tokens`,
  capped at `len(ids) - 1` (`_compute_max_prefix_len`: the last token is always prefilled, for its
  logits), then page-aligned down (`RadixKey.page_aligned`). A lookup refreshes the recency of what it
  matched. Only the uncached tokens are prefilled.
- Insert after prefill (`checkpoint_kv_cache`, `mem_cache/common.py`, called for a request that
  did not finish in its prefill, `managers/scheduler_components/batch_result_processor.py`): the
  prompt, as its batch ends, so that a request in a later batch finds it (one in the same batch
  does not).
- Insert at the end (`release_kv_cache(req, tree_cache, checkpoint=True)`, `mem_cache/common.py`,
  for a request finished or aborted while running): `origin_input_ids + output_ids` up to the KV
  the request computed (`Req.owned_kv_len`: `kv_committed_len`), that is every output id but the
  last, which was sampled but never fed back. A request aborted while waiting computed nothing.
- Eviction (`RadixCache.evict`): leaves first, least recently used first, until the tokens fit.

The sim's simplifications:

- Pages of `page_size` tokens (default 16, as SGLang runs with `--page-size 16`; SGLang's own
  default is 1): the cache holds whole pages, keyed by a hash chained over the pages before, so a
  lookup costs a tuple and a dict probe per page, never a per-token walk. Two different prefixes
  share an entry only if their chained 64-bit hashes collide.
- The capacity is for the cache alone; SGLang's KV pool also holds the running requests' KV, and
  never evicts a node a running request holds (`lock_ref`). Here a running request's prefix may
  be evicted under pressure; its end re-inserts it.
- One asyncio loop runs the sim: nothing here awaits, so no lock is needed.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

DEFAULT_PREFIX_CACHE_TOKENS = 500_000  # about an H200's KV pool for an 8B model at bf16
DEFAULT_PAGE_SIZE = 16


class _Page:
    __slots__ = ("children", "parent")

    def __init__(self, parent: int | None) -> None:
        self.parent = parent
        self.children = 0  # cached pages that extend this one


class PrefixCache:
    """Cached token pages of one host; `capacity_tokens` 0 turns the cache off.

    Recency is the order of `_pages`, least recent first. A lookup or an insert moves the pages of
    its path to the end deepest first, so a page always stands before its ancestors: the first
    page is always a leaf, and eviction pops it (leaf-first LRU in O(1) per page)."""

    def __init__(self, capacity_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS, page_size: int = DEFAULT_PAGE_SIZE) -> None:
        if capacity_tokens < 0 or page_size < 1:
            raise ValueError(f"need capacity_tokens >= 0 and page_size >= 1, got {capacity_tokens}, {page_size}")
        self.capacity_tokens = capacity_tokens
        self.page_size = page_size
        self._pages: OrderedDict[int, _Page] = OrderedDict()
        self.evicted_tokens = 0

    @property
    def enabled(self) -> bool:
        return self.capacity_tokens > 0

    @property
    def tokens(self) -> int:
        """Tokens held now."""
        return len(self._pages) * self.page_size

    def match(self, ids: Sequence[int]) -> int:
        """The cached prefix of `ids` a request scheduled now reuses: at most `len(ids) - 1` tokens,
        whole pages. The matched pages become the most recently used."""
        if not self._pages:
            return 0
        path = []
        for key in self._keys(ids, len(ids) - 1):
            if key not in self._pages:
                break
            path.append(key)
        self._touch(path)
        return len(path) * self.page_size

    def insert(self, ids: Sequence[int]) -> None:
        """Cache the whole pages of `ids` (most recently used), then evict down to the capacity."""
        if not self.enabled:
            return
        path, parent = [], None
        for key in self._keys(ids, len(ids)):
            if key not in self._pages:
                self._pages[key] = _Page(parent)
                if parent is not None:
                    self._pages[parent].children += 1
            path.append(key)
            parent = key
        self._touch(path)
        self._evict()

    def clear(self) -> None:
        """`/flush_cache` (`RadixCache.reset`)."""
        self._pages.clear()

    def _keys(self, ids: Sequence[int], limit: int) -> Iterator[int]:
        """The chained key of each whole page among the first `limit` ids."""
        size, key = self.page_size, 0
        for start in range(0, max(limit, 0) // size * size, size):
            key = hash((key, tuple(ids[start : start + size])))
            yield key

    def _touch(self, path: list[int]) -> None:
        for key in reversed(path):  # deepest first: ancestors end up after their descendants
            self._pages.move_to_end(key)

    def _evict(self) -> None:
        while len(self._pages) * self.page_size > self.capacity_tokens:
            _, page = self._pages.popitem(last=False)
            if page.children:  # cannot happen (see the class docstring); never orphan a page
                raise AssertionError("prefix cache evicted a page that has children")
            if page.parent is not None:
                self._pages[page.parent].children -= 1
            self.evicted_tokens += self.page_size
