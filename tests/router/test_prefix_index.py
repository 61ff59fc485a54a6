"""The router's prefix estimate (prefix.py): which leading blocks of a prompt each worker holds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from disagg.router.prefix import PrefixIndex


@given(st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 5), st.integers(1, 6)), max_size=40),
       st.integers(0, 5), st.integers(1, 6), st.integers(1, 12))
def test_prefix_estimate_finds_the_longest_present_prefix(inserts: list[tuple[str, int, int]], family: int,
                                                          length: int, capacity: int) -> None:
    """prefix.py match_tokens (its first-block check, then the binary search) against a plain walk of the prompt's
    chained blocks, after any sequence of prompts sent to the workers with eviction (prompts of six families,
    chained: a family's blocks are one chain, a shorter prompt a prefix of a longer)."""
    def chain(fam: int, n: int) -> tuple[int, ...]:
        return tuple(fam * 100 + i for i in range(n))

    idx = PrefixIndex(capacity_blocks=capacity, block_tokens=16)
    for worker, fam, n in inserts:
        idx.insert(worker, chain(fam, n))
    hashes = chain(family, length)
    for worker in "ab":
        held: dict[int, None] = dict(idx._workers.get(worker, {}))  # the reference walks the LRU itself
        walk = next((i for i, h in enumerate(hashes) if h not in held), len(hashes))
        assert idx.match_tokens(worker, hashes) == walk * 16
