"""KV-cache block pool with prefix caching, the way vLLM V1's KVCacheManager works.

Fixed-size blocks; a full block of prompt tokens gets a chained hash (hash of the parent block's hash and
its own token ids). Freed blocks keep their hash and go to the back of an LRU free queue, so a later
request with the same prefix can take them back (a hit) until the block is evicted for a new allocation.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from . import kvevents


class BlockHashes(list[bytes]):
    """A request's block hashes, with the token ids they cover (a KV event's ``BlockStored`` carries them)."""

    token_ids: Sequence[int] = ()


def block_hashes(token_ids: Sequence[int], block_size: int, salt: bytes = b"") -> list[bytes]:
    """Chained hashes of every *full* block of ``token_ids`` (a :class:`BlockHashes`)."""
    out = BlockHashes()
    out.token_ids = token_ids
    parent = salt
    buf = array("I", token_ids).tobytes()
    step = 4 * block_size
    for i in range(len(token_ids) // block_size):
        h = hashlib.blake2b(parent + buf[i * step:(i + 1) * step], digest_size=16).digest()
        out.append(h)
        parent = h
    return out


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if num_blocks <= 0:
            raise ValueError("the KV cache has no blocks")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.ref = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[bytes, int] = {}
        # vLLM's KV cache events (``--kv-events-config``; vllm/v1/core/block_pool.py, 0.33.0: a BlockStored when
        # full blocks are cached, a BlockRemoved when a cached block is evicted, AllBlocksCleared on a reset),
        # in sim/kvevents.py's wire shape; None: not collected. The engine takes them after each step.
        self.kv_events: list[dict[str, Any]] | None = None

    # ------------------------------------------------------------------------------------ queries
    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        """vLLM's kv_cache_usage_perc: share of blocks referenced by requests (cached-but-free count as free)."""
        return 1.0 - self.num_free / self.num_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def lookup(self, hashes: Sequence[bytes], max_tokens: int) -> list[int]:
        """Blocks of the longest cached prefix, capped at ``max_tokens`` (vLLM: prompt length − 1)."""
        if not self.enable_caching:
            return []
        hit: list[int] = []
        for h in hashes[: max_tokens // self.block_size]:
            b = self.cached.get(h)
            if b is None:
                break
            hit.append(b)
        return hit

    # ------------------------------------------------------------------------------------ changes
    def touch(self, blocks: Sequence[int]) -> None:
        """Take references on cached blocks (a prefix hit)."""
        for b in blocks:
            if self.ref[b] == 0:
                self.free.pop(b, None)
            self.ref[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        if n > len(self.free):
            return None
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)  # least recently freed first
            h = self.block_hash[b]
            if h is not None:
                if self.cached.get(h) == b:
                    del self.cached[h]
                    if self.kv_events is not None:
                        self.kv_events.append(kvevents.block_removed([h]))
                self.block_hash[b] = None
            self.ref[b] = 1
            out.append(b)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        # vLLM frees in reverse so a request's tail blocks are evicted before its shared prefix.
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free[b] = None  # back of the LRU queue; keeps its hash until evicted

    def commit(self, blocks: Sequence[int], hashes: Sequence[bytes], num_full: int) -> None:
        """Register the first ``num_full`` blocks of a request as cached under their hashes."""
        if not self.enable_caching:
            return
        run: list[int] = []  # blocks newly cached in a row: one BlockStored each run, as vLLM's cache_full_blocks
        for i in range(min(num_full, len(blocks), len(hashes))):
            b, h = blocks[i], hashes[i]
            if self.block_hash[b] is None and h not in self.cached:
                self.block_hash[b] = h
                self.cached[h] = b
                run.append(i)
            elif run:
                self._stored(hashes, run)
                run = []
        if run:
            self._stored(hashes, run)

    def _stored(self, hashes: Sequence[bytes], run: list[int]) -> None:
        tokens = getattr(hashes, "token_ids", None)
        if self.kv_events is None or tokens is None:
            return
        bs = self.block_size
        first, last = run[0], run[-1]
        self.kv_events.append(kvevents.block_stored(hashes[first:last + 1], hashes[first - 1] if first else None,
                                                    tokens[first * bs:(last + 1) * bs], bs))

    def reset(self) -> bool:
        """vLLM's ``reset_prefix_cache``: drop every cached hash when no block is in use (else refuse)."""
        if self.num_free != self.num_blocks:
            return False
        self.cached.clear()
        self.block_hash = [None] * self.num_blocks
        if self.kv_events is not None:
            self.kv_events.append(kvevents.all_blocks_cleared())
        return True

    def take_events(self) -> list[dict[str, Any]]:
        out = self.kv_events or []
        if self.kv_events:
            self.kv_events = []
        return out
