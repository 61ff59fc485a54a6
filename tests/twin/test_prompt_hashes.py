"""The twin hashes a prompt's KV blocks once for all its legs (twin/arrivals.py ``Prepared.block_hashes``): the
prefill and the decode engine get the very hashes their own block size gives, and a scheduler given hashes keeps
them (sim/scheduler.py ``add``), while one given none computes them."""

from __future__ import annotations

from disagg.router import features
from disagg.sim.kv import BlockPool, block_hashes
from disagg.sim.scheduler import Scheduler
from disagg.twin.arrivals import Arrival, prepare


def test_a_synthetic_prompt_is_hashed_once_and_its_router_keys_are_the_engines_hashes() -> None:
    p = prepare(Arrival(0.0, 100, 8, prefix_key="doc", prefix_tokens=64), 0, 32000)
    blocks = p.block_hashes(features.PREFIX_BLOCK_TOKENS)
    assert blocks == block_hashes(p.prompt_ids, features.PREFIX_BLOCK_TOKENS) and len(blocks) == 100 // 16
    assert p.block_hashes(features.PREFIX_BLOCK_TOKENS) is blocks  # the same list for every leg
    assert p.hashes == tuple(int.from_bytes(h[:8], "little") for h in blocks)
    other = p.block_hashes(32)  # an engine with another block size gets its own
    assert other == block_hashes(p.prompt_ids, 32) and len(other) == 3


def test_a_body_prompt_is_hashed_once_per_block_size() -> None:
    p = prepare(Arrival(0.0, 0, 8, endpoint="/v1/completions",
                        body={"prompt": "tell me a story " * 40, "max_tokens": 8}), 0, 32000)
    assert p.block_hashes(16) is p.block_hashes(16) == block_hashes(p.prompt_ids, 16)


def test_the_scheduler_keeps_given_hashes_and_computes_missing_ones() -> None:
    from disagg.sim.engine import make_request

    sched = Scheduler(BlockPool(64, 16), max_num_seqs=4, max_num_batched_tokens=256)
    ids = list(range(100, 164))
    given = block_hashes(ids, 16)
    a, b = make_request("a", ids, 4, 0.0, hashes=given), make_request("b", ids, 4, 0.0)
    sched.add(a)
    sched.add(b)
    assert a.hashes is given and b.hashes == given and b.hashes is not given
    off = Scheduler(BlockPool(64, 16, enable_caching=False), max_num_seqs=4, max_num_batched_tokens=256)
    c = make_request("c", ids, 4, 0.0, hashes=given)
    off.add(c)
    assert c.hashes == []  # no prefix caching: no hashes, given or not


def test_an_arrival_is_prepared_once_for_every_run_over_it() -> None:
    """prepare keeps its result on the arrival (a benchmark's configurations share the arrivals): the same object
    for the same index and vocabulary, a fresh one — equal to preparing a copy — when either differs; the arrival's
    fields and equality are untouched."""
    import dataclasses

    a = Arrival(0.0, 0, 8, endpoint="/v1/completions", body={"prompt": "tell me a story " * 40, "max_tokens": 8})
    p = prepare(a, 3, 32000)
    assert prepare(a, 3, 32000) is p and p.request_id == "twin-000003"
    again = prepare(dataclasses.replace(a), 3, 32000)  # a copy: prepared afresh, to the same result
    assert again is not p and (again.prompt_ids, again.hashes, again.max_tokens) == (p.prompt_ids, p.hashes, 8)
    other = prepare(a, 4, 32000)
    assert other is not p and other.request_id == "twin-000004"
    assert prepare(a, 4, 32000) is other
    assert a == dataclasses.replace(a) and dataclasses.asdict(a)["at"] == 0.0
