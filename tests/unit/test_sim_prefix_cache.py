"""The simulator's prefix cache on its own (sim.capacity): longest cached prefix in whole pages,
never the last token, inserts, least-recently-used eviction of leaves by capacity, off at 0."""
from __future__ import annotations

import random

import pytest

from genfleet.sim.capacity import PrefixCache


def test_the_longest_cached_prefix_is_found_and_the_last_token_is_always_prefilled():
    cache = PrefixCache(1000, page_size=1)
    assert cache.match([1, 2, 3]) == 0
    cache.insert(list(range(1, 11)))
    assert cache.tokens == 10
    # SGLang matches at most len - 1 tokens (`Req._compute_max_prefix_len`): the last one gives logits.
    assert cache.match(list(range(1, 11))) == 9
    assert cache.match([*range(1, 6), 99, 7]) == 5  # diverges after 5
    assert cache.match([*range(1, 11), 11, 12]) == 10  # extends what is cached
    assert cache.match([2, 3, 4]) == 0  # a prefix, not a substring


def test_pages_are_cached_and_matched_whole():
    cache = PrefixCache(1000, page_size=4)
    cache.insert(list(range(10)))  # pages [0..3], [4..7]; the partial [8, 9] is left out
    assert cache.tokens == 8
    assert cache.match(list(range(10))) == 8
    assert cache.match(list(range(9))) == 8  # at most 8 of 9 tokens: two pages
    assert cache.match(list(range(8))) == 4  # at most 7 of 8: one page
    assert cache.match([0, 1, 2, 3, 4, 5, 99, 7, 8]) == 4  # the second page differs


def test_an_insert_extends_the_cached_path_and_shared_prefixes_are_held_once():
    cache = PrefixCache(1000, page_size=1)
    cache.insert([1, 2, 3])
    cache.insert([1, 2, 3, 4, 5])  # what a finished request adds: its prompt, then its output
    cache.insert([1, 2, 7])
    assert cache.tokens == 6
    assert (cache.match([1, 2, 3, 4, 5, 6]), cache.match([1, 2, 7, 8])) == (5, 3)


def test_the_least_recently_used_prefix_is_evicted_when_over_capacity():
    cache = PrefixCache(8, page_size=1)
    cache.insert([1, 1, 1, 1])
    cache.insert([2, 2, 2, 2])
    assert cache.match([1, 1, 1, 1, 0]) == 4  # a lookup makes [1...] the most recent
    cache.insert([3, 3, 3, 3])
    assert cache.tokens == 8 and cache.evicted_tokens == 4
    assert (cache.match([1, 1, 1, 1, 0]), cache.match([2, 2, 2, 2, 0]), cache.match([3, 3, 3, 3, 0])) == (4, 0, 4)


def test_eviction_takes_leaves_first_so_a_shared_prefix_outlives_its_branches():
    cache = PrefixCache(10, page_size=1)
    cache.insert([1, 2, 3, 4, 5, 6])
    cache.insert([1, 2, 3, 4, 7, 8])
    cache.insert([9, 10, 11])  # 11 tokens: the oldest leaf goes, the end of [.., 5, 6]
    assert cache.tokens == 10
    assert cache.match([1, 2, 3, 4, 5, 6, 0]) == 5  # [1..5] becomes the most recent
    cache.insert([12, 13, 14, 15])  # 4 more: the oldest leaves, [8] then [7], [11] then [10]
    assert cache.tokens == 10
    assert cache.match([1, 2, 3, 4, 7, 0]) == 4  # the branch went, the shared [1..4] stayed
    assert (cache.match([1, 2, 3, 4, 5, 0]), cache.match([9, 10, 11, 0]), cache.match([12, 13, 14, 15])) == (5, 1, 3)


def test_random_churn_stays_within_capacity_and_keeps_every_cached_page_reachable():
    rng = random.Random(7)
    cache = PrefixCache(400, page_size=4)
    stems = [[rng.randrange(50) for _ in range(40)] for _ in range(6)]
    for _ in range(300):
        ids = rng.choice(stems)[: rng.randrange(4, 40)] + [rng.randrange(50) for _ in range(rng.randrange(30))]
        cache.match(ids)
        cache.insert(ids)
        assert cache.tokens <= 400
    # Every page's parent is cached and counts it among its children: nothing was orphaned.
    pages = cache._pages
    assert all(page.parent is None or page.parent in pages for page in pages.values())
    children = {key: 0 for key in pages}
    for page in pages.values():
        if page.parent is not None:
            children[page.parent] += 1
    assert all(pages[key].children == count for key, count in children.items())


def test_a_capacity_of_zero_turns_the_cache_off():
    cache = PrefixCache(0, page_size=1)
    assert not cache.enabled
    cache.insert([1, 2, 3])
    assert (cache.match([1, 2, 3]), cache.tokens) == (0, 0)


def test_clear_empties_the_cache():
    cache = PrefixCache(100, page_size=1)
    cache.insert([1, 2, 3])
    cache.clear()
    assert (cache.match([1, 2, 3]), cache.tokens) == (0, 0)


@pytest.mark.parametrize(("capacity", "page_size"), [(-1, 1), (10, 0)])
def test_bad_settings_are_refused(capacity, page_size):
    with pytest.raises(ValueError):
        PrefixCache(capacity, page_size)
