"""Router-side prefix index: which worker likely holds which prompt prefix in its KV cache.

Each worker gets a bounded LRU of the chained block hashes (features.prefix_block_hashes) of prompts the router
sent it: a decode worker's (remote or local: after a remote prefill the decode worker holds the transferred blocks
too), and a prefill worker's remote prefills (vLLM's prefix caching keeps the blocks it computed).
A prompt's match on a worker = the number of its leading blocks present there × tokens per block.
"""

from __future__ import annotations

from collections import OrderedDict


class PrefixIndex:
    def __init__(self, capacity_blocks: int = 32_768, block_tokens: int = 16) -> None:
        self.capacity = capacity_blocks
        self.block_tokens = block_tokens
        self._workers: dict[str, OrderedDict[int, None]] = {}

    def match_tokens(self, worker: str, hashes: tuple[int, ...]) -> int:
        lru = self._workers.get(worker)
        if not lru or not hashes or hashes[0] not in lru:
            return 0
        # Chained hashes: block i present implies (almost surely) the same prefix up to i. Binary search the
        # longest present prefix (blocks are inserted together, evicted oldest first). A prompt's first block is
        # always its most recent (insert), so without it no later block is there either: the check above is the
        # search's answer for most workers, in one lookup.
        lo, hi = 1, len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in lru:
                lo = mid
            else:
                hi = mid - 1
        return lo * self.block_tokens

    def insert(self, worker: str, hashes: tuple[int, ...]) -> None:
        if not hashes:
            return
        lru = self._workers.setdefault(worker, OrderedDict())
        # Tail first, so that the head blocks are the most recent and eviction (oldest first) removes tails
        # before heads, as vLLM's own free queue does: what remains is always a prefix.
        for h in reversed(hashes):
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
        while len(lru) > self.capacity:
            lru.popitem(last=False)

    def forget(self, worker: str) -> None:
        self._workers.pop(worker, None)
