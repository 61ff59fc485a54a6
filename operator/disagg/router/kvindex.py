"""The exact prefix index (issue 30): which blocks each worker's engine holds, from its own KV cache events.

PURE: event batches in (kvevents.py), matches out; no sockets, no clock (the subscriber, kvsub.py, and the twin's
in-process sink, :func:`sink_for`, feed it).

Keys. vLLM names a block by its hash (``hash_block_tokens`` in ``vllm/v1/core/kv_cache_utils.py``, 0.33.0:
``hash_fn((parent_hash or NONE_HASH, tuple(block_token_ids), extra_keys))``, ``hash_fn`` the engine's
``--prefix-caching-hash-algo``, sha256 over pickle by default). Those names are not reproducible by the router in
general: ``NONE_HASH`` comes from ``PYTHONHASHSEED`` or, for the xxhash algorithms, from random bytes per process,
and ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` truncates them to 64 bits. So the index keys its lookups on the
block's *contents*: ``BlockStored`` carries each block's token ids, its ``block_size`` and its parent's hash, and
the router chains its own hash over the same ids (features.py ``token_block_keys``: the parent's key and the
block's ids). A request's token ids give the same chain, so a lookup is exact whatever the engine's hash function,
seed or hash form; the block size is the engine's own (from its events). The engine's hash is kept per worker only
as the name to resolve a later event's ``parent_block_hash`` and a ``BlockRemoved``.

Structures: per block size, ``key → bitmask of workers holding it`` (one int per cached block); per worker, its
engine hash → key map and a bit. A lookup walks the request's keys from its first block with the mask of
workers still matching, and stops when none is left: cost = the longest match + 1 dict lookups, whatever the
number of workers (vLLM's own lookup stops at the first block it lacks too: ``find_longest_cache_hit``).

Only the GPU tier counts (``medium`` None or ``"GPU"``): blocks offloaded to CPU or storage are another tier, not a
prefill vLLM skips as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import features
from .kvevents import MEDIUM_GPU, AllBlocksCleared, Batch, BlockRemoved, BlockStored, Hash, decode_batch


@dataclass(slots=True)
class _Worker:
    bit: int
    block_size: int = 0
    keys: dict[Hash, int] = field(default_factory=dict)  # engine hash → content key
    refs: dict[int, int] = field(default_factory=dict)  # content key → engine hashes naming it
    batches: int = 0
    orphans: int = 0  # stored blocks whose parent the index did not know (missed events): not indexed
    last_ts: float = 0.0


@dataclass(frozen=True, slots=True)
class Applied:
    stored: int = 0
    removed: int = 0
    cleared: int = 0
    orphans: int = 0
    skipped: int = 0


class KVIndex:
    def __init__(self) -> None:
        self._w: dict[str, _Worker] = {}
        self._free_bits: list[int] = []
        self._next_bit = 0
        self._holders: dict[int, dict[int, int]] = {}  # block size → key → workers' bits
        self._by_bit: dict[int, str] = {}

    # ------------------------------------------------------------------------------------ queries
    def publishing(self, worker: str) -> bool:
        """Whether ``worker`` has published anything (else the router falls back to its estimate)."""
        w = self._w.get(worker)
        return w is not None and w.batches > 0

    def blocks(self, worker: str) -> int:
        w = self._w.get(worker)
        return len(w.refs) if w is not None else 0

    def workers(self) -> list[str]:
        return list(self._w)

    def total_blocks(self) -> int:
        return sum(len(w.refs) for w in self._w.values())

    def block_sizes(self) -> list[int]:
        return [bs for bs, h in self._holders.items() if h]

    def last_ts(self, worker: str) -> float:
        w = self._w.get(worker)
        return w.last_ts if w is not None else 0.0

    def match(self, token_ids: Sequence[int], max_blocks: int = features.MAX_PREFIX_BLOCKS,
              keys_of: Callable[[int], Sequence[int]] | None = None) -> dict[str, int]:
        """Tokens of ``token_ids``' longest cached prefix on each worker that holds one (others absent).
        ``keys_of(block_size)``: the request's keys at that block size, when the caller has them already."""
        out: dict[str, int] = {}
        for bs, holders in self._holders.items():
            if not holders:
                continue
            keys = keys_of(bs) if keys_of is not None else features.token_block_keys(token_ids, bs,
                                                                                       max_blocks=max_blocks)
            alive = -1
            n = 0
            for k in keys:
                m = holders.get(k, 0) & alive
                if m != alive:
                    if n:
                        self._credit(out, alive & ~m, n * bs)
                    alive = m
                    if not m:
                        break
                n += 1
            if alive and alive != -1 and n:
                self._credit(out, alive, n * bs)
        return out

    def _credit(self, out: dict[str, int], mask: int, tokens: int) -> None:
        while mask:
            low = mask & -mask
            name = self._by_bit.get(low.bit_length() - 1)
            if name is not None:
                out[name] = tokens
            mask ^= low

    # ------------------------------------------------------------------------------------ changes
    def _worker(self, name: str) -> _Worker:
        w = self._w.get(name)
        if w is None:
            bit = self._free_bits.pop() if self._free_bits else self._next_bit
            if bit == self._next_bit:
                self._next_bit += 1
            w = self._w[name] = _Worker(bit)
            self._by_bit[bit] = name
        return w

    def apply(self, worker: str, batch: Batch) -> Applied:
        """One engine step's batch from ``worker``, in order."""
        w = self._worker(worker)
        w.batches += 1
        w.last_ts = batch.ts
        stored = removed = cleared = orphans = 0
        for e in batch.events:
            if isinstance(e, BlockRemoved):  # the most frequent: one per evicted block
                if e.medium not in (None, MEDIUM_GPU):
                    continue
                removed += self._remove(w, e.block_hashes)
            elif isinstance(e, BlockStored):
                if e.medium not in (None, MEDIUM_GPU):
                    continue
                n, lost = self._store(w, e)
                stored += n
                orphans += lost
            elif isinstance(e, AllBlocksCleared):
                cleared += 1
                self._drop_blocks(w)
        w.orphans += orphans
        return Applied(stored, removed, cleared, orphans, batch.skipped)

    def _store(self, w: _Worker, e: BlockStored) -> tuple[int, int]:
        bs = e.block_size
        if bs <= 0 or len(e.token_ids) < bs * len(e.block_hashes):
            return 0, len(e.block_hashes)
        parent: int | None = None
        if e.parent_block_hash is not None:
            parent = w.keys.get(e.parent_block_hash)
            if parent is None:
                return 0, len(e.block_hashes)
        extra: list[Any] | None = None
        if e.extra_keys is not None or e.lora_name is not None:
            extra = [(e.lora_name, e.extra_keys[i] if e.extra_keys is not None and i < len(e.extra_keys) else None)
                     for i in range(len(e.block_hashes))]
        keys = features.token_block_keys(e.token_ids, bs, parent, max_blocks=len(e.block_hashes), extra=extra)
        if w.block_size and w.block_size != bs:  # a new block size (a reconfigured engine): start over
            self._drop_blocks(w)
        w.block_size = bs
        holders = self._holders.setdefault(bs, {})
        bit = 1 << w.bit
        for h, k in zip(e.block_hashes, keys, strict=False):
            if h in w.keys:
                continue
            w.keys[h] = k
            c = w.refs.get(k, 0)
            w.refs[k] = c + 1
            if c == 0:
                holders[k] = holders.get(k, 0) | bit
        return len(keys), 0

    def _remove(self, w: _Worker, hashes: Sequence[Hash]) -> int:
        holders = self._holders.get(w.block_size, {})
        clear = ~(1 << w.bit)
        n = 0
        for h in hashes:
            k = w.keys.pop(h, None)
            if k is None:
                continue
            n += 1
            c = w.refs[k] - 1
            if c:
                w.refs[k] = c
                continue
            del w.refs[k]
            m = holders.get(k, 0) & clear
            if m:
                holders[k] = m
            else:
                holders.pop(k, None)
        return n

    def _drop_blocks(self, w: _Worker) -> None:
        holders = self._holders.get(w.block_size, {})
        clear = ~(1 << w.bit)
        for k in w.refs:
            m = holders.get(k, 0) & clear
            if m:
                holders[k] = m
            else:
                holders.pop(k, None)
        w.keys.clear()
        w.refs.clear()

    def clear(self, worker: str) -> None:
        """Everything ``worker`` held is gone (its engine restarted, or a gap could not be replayed); it still
        publishes."""
        w = self._w.get(worker)
        if w is not None:
            self._drop_blocks(w)

    def forget(self, worker: str) -> None:
        """``worker`` went away: its entries and its bit go."""
        w = self._w.pop(worker, None)
        if w is None:
            return
        self._drop_blocks(w)
        del self._by_bit[w.bit]
        self._free_bits.append(w.bit)


Sink = Callable[[Any], None]


def sink_for(index: KVIndex, worker: str, on_applied: Callable[[str, Applied], None] | None = None) -> Sink:
    """The twin's in-process path: a sink for a simulated engine's batches (sim/kvevents.py ``encode_batch``'s
    structure, before msgpack: the same objects a subscriber unpacks) that applies them to ``index``."""

    def sink(obj: Any) -> None:
        applied = index.apply(worker, decode_batch(obj))
        if on_applied is not None:
            on_applied(worker, applied)

    return sink
