"""Placement from the exact index (issue 30): the request core prefers the engines' own events over its estimate
where a worker publishes, falls back to the estimate where it does not, prices cached tokens on both paths, and the
twin's in-process event path reaches the oracle's hits."""

from __future__ import annotations

import pytest

from disagg.api.contract import RouterConfig
from disagg.perf.costs import EngineCost
from disagg.router import features
from disagg.router import placement as pl
from disagg.router.core import RequestCore
from disagg.router.kvevents import Batch, BlockStored
from disagg.router.load import WorkerSet
from disagg.router.metrics import RouterMetrics
from disagg.router.policy_types import WorkerLoad
from disagg.router.request import Ctx

COST = EngineCost.from_profile(None)
CFG = RouterConfig.model_validate({"model": "m", "mode": "Disaggregated",
                                   "slo": {"ttftP95Ms": 1000, "tpotP95Ms": 50}})


def _core() -> RequestCore[None]:
    ws = WorkerSet(clock=lambda: 0.0)
    ws.set_pool("decode", [("http://d0", "c"), ("http://d1", "c"), ("http://d2", "c")])
    ws.set_pool("prefill", [("http://p0", "c")])
    return RequestCore(ws, RouterMetrics(), clock=lambda: 0.0)


def _ctx(ids: list[int]) -> Ctx:
    c = Ctx(request_id="r", endpoint="/v1/completions", stream=False, t0=0.0, input_tokens=len(ids))
    c.token_ids = tuple(ids)
    return c


def _stored(core: RequestCore[None], url: str, ids: list[int]) -> None:
    n = len(ids) // 16
    core.kv.apply(url, Batch(0.0, (BlockStored(tuple(range(1, n + 1)), None, tuple(ids[:n * 16]), 16),)))


def test_events_win_where_a_worker_publishes_and_the_estimate_stays_the_fallback() -> None:
    core = _core()
    ids = list(range(1000, 1000 + 64 * 16))
    hashes = tuple(features.token_block_keys(ids, 16))
    # the estimate says d0 (the router sent it there), d1's engine says it holds half, d2 publishes nothing
    core.prefix.insert("http://d0", hashes)
    core.prefix.insert("http://d2", hashes[:10])
    _stored(core, "http://d1", ids[:32 * 16])
    core.kv.apply("http://d0", Batch(0.0, ()))  # d0 publishes too: its engine holds none of it (evicted)
    _stored(core, "http://p0", ids)  # the prefill worker's cache counts too (the remote path)
    snap = core.snapshot(CFG, hashes, "default", _ctx(ids))
    got = {w.url: w.prefix_tokens for w in (*snap.decode, *snap.prefill)}
    assert got == {"http://d0": 0, "http://d1": 512, "http://d2": 160, "http://p0": 1024}
    # without the prompt's token ids (a text prompt) the estimate is all there is
    snap = core.snapshot(CFG, hashes, "default", None)
    assert {w.url: w.prefix_tokens for w in snap.decode} == {"http://d0": 1024, "http://d1": 0, "http://d2": 160}
    assert all(w.prefix_tokens == 0 for w in snap.prefill)


def test_the_decision_records_what_it_expects_cached_where_it_prefills() -> None:
    core = _core()
    ids = list(range(5000, 5000 + 200 * 16))
    hashes = tuple(features.token_block_keys(ids, 16))
    for url in ("http://d0", "http://d1", "http://d2", "http://p0"):
        core.kv.apply(url, Batch(0.0, ()))
    _stored(core, "http://d2", ids)
    ctx = _ctx(ids)
    d, _ = core.decide(ctx, CFG, None, 64, hashes)
    assert d.decision == "local" and d.decode == "http://d2"
    assert (ctx.expected_cached_tokens, ctx.cache_source) == (len(ids) - 1, "events")  # vLLM: at most len − 1
    m = core.metrics.registry.get_sample_value("disagg_prefix_expected_cached_tokens_total", {"source": "events"})
    assert m == len(ids) - 1


def test_cached_tokens_cost_no_prefill_on_either_path() -> None:
    def load(role: str, cached: int) -> WorkerLoad:
        return WorkerLoad(url=role, compat="c", role=role, cost=COST, prefix_tokens=cached)

    d = load("decode", 0)
    cold = pl.predict_remote(load("prefill", 0), COST, d, COST, 8000, 0.05, 200)
    warm = pl.predict_remote(load("prefill", 7000), COST, d, COST, 8000, 0.05, 200)
    assert warm.prefill_s < cold.prefill_s / 3
    cold_l = pl.predict_whole(d, COST, 8000, "local", 0.05, 200)
    warm_l = pl.predict_whole(load("decode", 7000), COST, 8000, "local", 0.05, 200)
    assert warm_l.ttft_s < cold_l.ttft_s / 3


def test_the_twins_in_process_events_reach_the_oracle() -> None:
    """The twin's path (kvindex.sink_for on each simulated engine; what twin/cluster.py wires): on a small multi-turn
    workload the events place follow-ups where the cache is, and a router blind to prefixes does worse."""
    from disagg.bench.prefix_cache import run_variant, workload

    arrivals = workload(seed=1, conversations=12, agents=3, window_s=30.0)
    events = run_variant("events", arrivals, decode_workers=3, seed=1, kv_blocks=3000)
    blind = run_variant("none", arrivals, decode_workers=3, seed=1, kv_blocks=3000)
    assert events["ok"] == events["requests"] == len(arrivals)
    assert events["vs_oracle"] >= 0.95
    assert events["hit_tokens"] > blind["hit_tokens"]


def test_the_remote_path_prefills_where_the_prompt_is_cached_unless_that_queue_costs_more() -> None:
    from disagg.router.picks import choose_prefill

    def p(url: str, wait_ms: float, cached: int) -> WorkerLoad:
        return WorkerLoad(url=url, compat="c", role="prefill", cost=COST, est_wait_ms=wait_ms, prefix_tokens=cached)

    def chosen(*ws: WorkerLoad) -> str:
        w = choose_prefill(ws, "c")
        assert w is not None
        return w.url

    saved_ms = COST.prefill(6000).seconds * 1000
    assert chosen(p("a", 0.0, 0), p("b", 0.0, 6000)) == "b"
    assert chosen(p("a", 0.0, 0), p("b", saved_ms * 0.5, 6000)) == "b"
    assert chosen(p("a", 0.0, 0), p("b", saved_ms * 2, 6000)) == "a"


def test_a_prefill_worker_is_known_to_hold_the_prompts_it_prefilled_and_its_queue_counts_only_uncached_work() -> None:
    """vLLM's prefix caching keeps the blocks a prefill engine computed: after a remote prefill leg the router's
    estimate holds the prompt on that prefill worker (the placement then prices its next prefill without them),
    and a leg in flight counts only the tokens the worker computes as the backlog ahead of the next one."""
    import asyncio

    core = _core()
    found = core.workers.get("http://p0")
    assert found is not None
    p0 = found
    text_prefix = tuple(range(1, 251))  # a text prompt's block hashes: 250 blocks of 16 tokens, 4000 tokens
    seen: list[int] = []

    class Legs:
        async def prefill(self, ctx: Ctx, worker: str, deadline: float) -> dict[str, str]:
            assert (worker, deadline) == ("http://p0", 10.0)
            seen.append(p0.inflight_tokens)
            return {"kv": ctx.request_id}

    def ctx(tokens: int) -> Ctx:
        return Ctx(request_id="r", endpoint="/v1/completions", stream=False, t0=0.0, input_tokens=tokens)

    snap = core.snapshot(CFG, text_prefix, "default", None)
    assert [w.prefix_tokens for w in snap.prefill] == [0]  # nothing sent there yet
    asyncio.run(core.prefill(ctx(6000), Legs(), "http://p0", 10.0, text_prefix))  # type: ignore[arg-type]
    snap = core.snapshot(CFG, (*text_prefix, 999), "default", None)  # the same 4000 tokens, then another block
    assert [w.prefix_tokens for w in snap.prefill] == [4000]
    # the next prompt sharing that prefix: 2000 tokens to compute there, not 6000
    asyncio.run(core.prefill(ctx(6000), Legs(), "http://p0", 10.0, text_prefix))  # type: ignore[arg-type]
    assert seen == [6000, 2000]
    assert p0.inflight_tokens == 0
    assert p0.prefill_size == pytest.approx(6000 + 0.3 * (2000 - 6000))  # the sizes the queueing wait reads
