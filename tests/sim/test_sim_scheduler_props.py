"""Property tests of the scheduler: for random workloads (shared prefixes, aborts, remote prefill/decode, tight
KV) the block pool stays consistent, the limits hold every step, and every request finishes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from disagg.sim.kv import BlockPool
from disagg.sim.scheduler import Request, Scheduler, Status

BS = 4

workload = st.lists(
    st.tuples(
        st.integers(1, 3),  # prefix family (shared prefixes → cache hits)
        st.integers(1, 40),  # prompt length
        st.integers(1, 20),  # output length
        st.sampled_from(["plain", "plain", "abort", "remote_prefill", "remote_decode"]),
    ),
    min_size=1,
    max_size=25,
)


def check_pool(s: Scheduler, live: list[Request]) -> None:
    pool = s.pool
    assert all(r >= 0 for r in pool.ref)
    refs = [0] * pool.num_blocks
    for r in live:
        for b in r.blocks:
            refs[b] += 1
    assert refs == pool.ref, "block reference counts drifted from the requests' block lists"
    assert pool.num_free == sum(1 for x in pool.ref if x == 0)
    for h, b in pool.cached.items():
        assert pool.block_hash[b] == h


@settings(max_examples=100, deadline=None)
@given(workload, st.integers(12, 60), st.integers(1, 6), st.integers(8, 64), st.booleans(), st.booleans())
def test_scheduler_invariants(reqs, blocks, seqs, budget, chunked, caching):
    max_len = 60
    blocks = max(blocks, -(-max_len // BS))  # vLLM refuses to start unless one max-length request fits
    budget = budget if chunked else max(budget, max_len)
    s = Scheduler(BlockPool(blocks, BS, caching), max_num_seqs=seqs, max_num_batched_tokens=budget,
                  chunked_prefill=chunked)
    s.set_kv_lease(5.0)
    all_reqs: list[Request] = []
    for i, (fam, plen, out, kind) in enumerate(reqs):
        prompt = [fam * 1000 + j for j in range(plen)]
        out = min(out, max_len - plen) or 1
        r = Request(f"r{i}", prompt, out, arrival=0.0, remote_decode=kind == "remote_decode",
                    remote_prefill={"remote_block_ids": [1]} if kind == "remote_prefill" else None)
        r.ctx = kind
        s.add(r)
        all_reqs.append(r)

    t = 0.0
    for _ in range(5000):
        t += 1.0
        batch = s.schedule(t)
        assert batch.tokens <= budget
        assert len(s.running) <= seqs
        for req in batch.pulls:
            s.kv_loaded(req, ok=int(req.request_id[1:]) % 3 != 0, recompute=int(req.request_id[1:]) % 2 == 0)
        s.finish_step(batch, t)
        for r in all_reqs:
            if r.ctx == "abort" and r.num_output >= 1 and r.status != Status.FINISHED:
                s.abort(r)
        s.expire_held(t)
        live = [r for r in all_reqs if r.status != Status.FINISHED] + [r for r, _ in s.held.values()]
        check_pool(s, live)
        if not s.running and not s.waiting:
            break
    assert not s.running and not s.waiting, "scheduler stalled with work left"
    for r in all_reqs:
        assert r.status == Status.FINISHED
        if r.finish_reason == "length":
            assert r.num_output == r.max_new_tokens
    s.expire_held(t + 10)
    assert s.pool.num_free == blocks
