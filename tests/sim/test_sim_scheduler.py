"""The scheduler: continuous batching, token budget / chunked prefill, KV blocks, preemption, prefix hits,
and the NIXL producer/consumer states — driven directly, without a clock or sockets."""

from __future__ import annotations

import pytest

from disagg.sim.kv import BlockPool, block_hashes
from disagg.sim.scheduler import Request, Scheduler, Status


def req(rid: str, prompt: int | list[int], out: int = 4, **kw) -> Request:
    ids = list(range(100, 100 + prompt)) if isinstance(prompt, int) else prompt
    return Request(request_id=rid, prompt_ids=ids, max_new_tokens=out, arrival=0.0, **kw)


def sched(blocks: int = 1000, bs: int = 16, seqs: int = 8, budget: int = 512, chunked: bool = True,
          caching: bool = True) -> Scheduler:
    return Scheduler(BlockPool(blocks, bs, caching), max_num_seqs=seqs, max_num_batched_tokens=budget,
                     chunked_prefill=chunked)


def run_until_idle(s: Scheduler, limit: int = 10_000) -> list:
    steps = []
    t = 0.0
    while s.has_work() and limit:
        b = s.schedule(t)
        if not b.items:
            break
        t += 1.0
        s.finish_step(b, t)
        steps.append(b)
        limit -= 1
    return steps


def test_max_num_seqs_caps_the_batch():
    s = sched(seqs=2)
    for i in range(3):
        s.add(req(f"r{i}", 10))
    b = s.schedule(0.0)
    assert [x.request.request_id for x in b.items] == ["r0", "r1"]
    assert len(s.waiting) == 1
    run_until_idle(s)
    assert all(r.finished for r in (s.running + list(s.waiting))) or not s.running


def test_chunked_prefill_splits_long_prompt_by_budget():
    s = sched(budget=256)
    r = req("long", 1000, out=2)
    s.add(r)
    sizes = []
    for _ in range(4):
        b = s.schedule(0.0)
        sizes.append(b.tokens)
        s.finish_step(b, 1.0)
    assert sizes == [256, 256, 256, 232]
    assert r.num_output == 1  # the first token is sampled when the last chunk completes


def test_running_decodes_go_first_and_new_prefill_takes_the_rest_of_the_budget():
    s = sched(budget=100)
    a = req("a", 20, out=50)
    s.add(a)
    s.finish_step(s.schedule(0.0), 1.0)  # a prefilled, decoding now
    s.add(req("b", 500, out=2))
    b = s.schedule(1.0)
    assert [(x.request.request_id, x.new_tokens) for x in b.items] == [("a", 1), ("b", 99)]


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget():
    s = sched(budget=1024, chunked=False)
    s.add(req("a", 600, out=3))
    s.add(req("b", list(range(5000, 5600)), out=3))
    b1 = s.schedule(0.0)
    assert [(x.request.request_id, x.new_tokens) for x in b1.items] == [("a", 600)]
    s.finish_step(b1, 1.0)
    b2 = s.schedule(1.0)
    assert [(x.request.request_id, x.new_tokens) for x in b2.items] == [("a", 1), ("b", 600)]


def test_preemption_when_blocks_run_out_and_everyone_still_finishes():
    s = sched(blocks=10, bs=16, seqs=4, budget=1000)
    reqs = [req(f"r{i}", 40, out=40) for i in range(3)]  # each grows to 80 tokens = 5 blocks; 10 blocks total
    for r in reqs:
        s.add(r)
    steps = run_until_idle(s)
    assert s.stats.preemptions > 0
    assert any(b.preempted for b in steps)
    assert all(r.finished and r.num_output == 40 for r in reqs)
    assert s.pool.num_free == 10
    victim = next(r for r in reqs if r.preemptions)
    assert victim is not reqs[0]  # the last running request is preempted, not the oldest


def test_prefix_cache_hit_shortens_prefill():
    s = sched(bs=16)
    shared = list(range(1000, 1064))  # 4 full blocks
    a = req("a", [*shared, 1, 2, 3], out=1)
    s.add(a)
    run_until_idle(s)
    b = req("b", [*shared, 7, 8, 9, 10], out=1)
    s.add(b)
    first = s.schedule(10.0)
    assert b.num_cached == 64
    assert first.items[0].new_tokens == len(b.prompt_ids) - 64
    assert s.stats.prefix_hits == 64
    assert s.stats.prefix_queries == len(a.prompt_ids) + len(b.prompt_ids)


def test_full_prompt_hit_still_recomputes_the_last_token():
    s = sched(bs=16)
    p = list(range(5000, 5032))  # exactly 2 blocks
    s.add(req("a", p, out=1))
    run_until_idle(s)
    b = req("b", p, out=1)
    s.add(b)
    batch = s.schedule(5.0)
    assert b.num_cached == 16  # capped at prompt_len - 1 → only the first full block
    assert batch.items[0].new_tokens == 16


def test_no_prefix_caching_means_no_hits():
    s = sched(caching=False)
    p = list(range(64))
    s.add(req("a", p, out=1))
    run_until_idle(s)
    b = req("b", p, out=1)
    s.add(b)
    s.schedule(1.0)
    assert b.num_cached == 0 and s.stats.prefix_hits == 0


def test_block_hashes_chain():
    h1 = block_hashes(list(range(48)), 16)
    h2 = block_hashes(list(range(32)) + [9] * 16, 16)
    assert len(h1) == 3 and h1[:2] == h2[:2] and h1[2] != h2[2]
    assert block_hashes([1] * 16 + list(range(16)), 16)[1] != block_hashes([2] * 16 + list(range(16)), 16)[1]


def test_producer_holds_blocks_until_pulled_or_expired():
    s = sched()
    s.set_kv_lease(30.0)
    r = req("p", 100, out=1, remote_decode=True)
    s.add(r)
    run_until_idle(s)
    assert r.finished and r.finish_reason == "length"
    assert "p" in s.held and len(r.blocks) == 7
    assert s.pool.num_free == 1000 - 7
    assert s.expire_held(10.0) == []
    assert s.release_held("p") is r
    assert s.pool.num_free == 1000 and not s.held
    r2 = req("q", 100, out=1, remote_decode=True)
    s.add(r2)
    run_until_idle(s)
    assert s.next_expiry() == 1.0 + 30.0  # finished at the end of its one step (t = 1), plus the lease
    assert s.expire_held(1000.0) == [r2] and s.pool.num_free == 1000


def test_consumer_waits_for_remote_kv_then_computes_only_the_last_token():
    s = sched(seqs=1)
    r = req("d", 100, out=3, remote_prefill={"remote_block_ids": [1, 2], "remote_host": "h", "remote_port": 1,
                                             "remote_engine_id": "e"})
    s.add(r)
    b = s.schedule(0.0)
    assert b.items == [] and b.pulls == [r]
    assert r.status == Status.WAITING_FOR_REMOTE_KVS and s.num_waiting_deferred == 1
    assert len(r.blocks) == 7 and r.num_external == 100
    other = req("x", 10, out=1)
    s.add(other)
    b = s.schedule(0.1)  # a deferred request takes no running slot: the next request runs meanwhile
    assert [x.request.request_id for x in b.items] == ["x"]
    s.finish_step(b, 0.2)
    assert s.kv_loaded(r, ok=True, recompute=True)
    b = s.schedule(1.0)
    assert [(x.request.request_id, x.new_tokens) for x in b.items] == [("d", 1)]
    s.finish_step(b, 2.0)
    assert r.num_output == 1
    assert s.stats.computed_prompt_tokens == 10 + 1


@pytest.mark.parametrize("recompute", [True, False])
def test_consumer_failed_load_follows_policy(recompute):
    s = sched()
    r = req("d", 100, out=2, remote_prefill={"remote_block_ids": [1]})
    s.add(r)
    s.schedule(0.0)
    assert s.kv_loaded(r, ok=False, recompute=recompute) is recompute
    if recompute:
        b = s.schedule(1.0)
        assert b.items[0].new_tokens == 100 and r.recomputed
        run_until_idle(s)
        assert r.num_output == 2
    else:
        assert r.finished and r.finish_reason == "error"
        assert s.pool.num_free == 1000


def test_abort_frees_blocks():
    s = sched()
    r = req("a", 200, out=100)
    s.add(r)
    s.finish_step(s.schedule(0.0), 1.0)
    assert s.pool.num_free < 1000
    s.abort(r)
    assert r.finish_reason == "abort" and s.pool.num_free == 1000 and not s.running


# ------------------------------------------------------------------------------ --scheduling-policy priority
def prio_sched(**kw) -> Scheduler:
    s = sched(**kw)
    return Scheduler(s.pool, max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens,
                     policy="priority")


def test_priority_policy_serves_the_waiting_queue_by_priority_then_arrival():
    s = prio_sched(seqs=2, budget=10_000)
    arrivals = [("batch-old", 1, 0.0), ("bg", 2, 1.0), ("chat-late", 0, 3.0), ("chat-early", 0, 2.0),
                ("batch-new", 1, 4.0)]
    for rid, prio, t in arrivals:
        r = req(rid, 32)
        r.priority, r.arrival = prio, t
        s.add(r)
    assert [r.request_id for r in s.waiting] == ["chat-early", "chat-late", "batch-old", "batch-new", "bg"]
    first = s.schedule(0.0)
    assert [it.request.request_id for it in first.items] == ["chat-early", "chat-late"]  # max_num_seqs 2
    # FCFS keeps arrival order whatever the priority
    f = sched(seqs=2, budget=10_000)
    for rid, prio, t in arrivals:
        r = req(rid, 32)
        r.priority, r.arrival = prio, t
        f.add(r)
    assert [r.request_id for r in f.waiting] == [a[0] for a in arrivals]


def test_priority_policy_preempts_the_lowest_priority_running_request():
    s = prio_sched(blocks=10, bs=16, seqs=4, budget=1000)
    reqs = [req(f"r{i}", 40, out=40) for i in range(3)]  # 10 blocks cannot hold all three at 80 tokens
    for i, (r, prio) in enumerate(zip(reqs, (1, 0, 0), strict=True)):
        r.priority, r.arrival = prio, float(i)
        s.add(r)
    steps = run_until_idle(s)
    assert any(b.preempted for b in steps)
    assert all(r.finished and r.num_output == 40 for r in reqs)
    assert s.pool.num_free == 10
    # the Batch request (priority 1) is the one preempted, although it arrived first and runs first in FCFS
    assert reqs[0].preemptions > 0 and reqs[1].preemptions == 0


def test_the_request_priority_is_read_as_vllm_reads_it():
    from disagg.sim.protocol import ApiError, request_priority

    assert request_priority({}, {}) == 0
    assert request_priority({}, {"priority": 2}) == 2
    assert request_priority({"X-Vllm-Priority": "-3"}, {"priority": 2}) == -3  # the header wins when an integer
    assert request_priority({"X-Vllm-Priority": "high"}, {"priority": 2}) == 2  # … and is ignored otherwise
    for bad in ("1", 1.5, True, 2**63):
        with pytest.raises(ApiError) as e:
            request_priority({}, {"priority": bad})
        assert e.value.param == "priority"
