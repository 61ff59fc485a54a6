"""Decode fast-forward (sim/engine.py ``_ff_*``) against the step-by-step path: the same records, bit for bit.

Each scenario runs twice, ``fast_forward=True`` (decode steps planned and applied in runs, the loop clock moved
without a loop turn where nothing else could run) and ``fast_forward=False`` (every step a loop timer), and every
record, decision count and pool statistic (busy seconds, steps) must be equal — not approximately: the fast path
prices the same PerfModel.step sums and lands on the same clock readings. Only the loop's event count (virtual-time
advances) may differ, and must drop, or the fast path was never taken.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any

import pytest

from disagg.twin import Arrival, ClusterSpec, PoolSpec, TwinCluster, TwinResult, arrivals_from_mix, simulate

CONDITIONAL = {"mode": "Disaggregated", "routing": {
    "remotePrefill": {"minInputTokens": 2048, "maxPrefillQueueWaitMs": 150, "minExpectedOutputTokens": 64,
                      "requireDecodePoolPressure": False},
    "localPrefill": {"maxInputTokens": 1024, "preferWhenPrefixCacheHit": True},
    "fallback": {"onKVTransferTimeout": "LocalAggregated", "onPrefillQueueOverload": "LocalPrefill"}}}


def both(spec: ClusterSpec, arrivals: list[Arrival], **kw: Any) -> tuple[TwinResult, TwinResult]:
    fast = simulate(spec, arrivals, seed=1, fast_forward=True, **kw)
    slow = simulate(spec, arrivals, seed=1, fast_forward=False, **kw)
    return fast, slow


def assert_same(fast: TwinResult, slow: TwinResult) -> None:
    assert len(fast.records) == len(slow.records) > 0
    for a, b in zip(fast.records, slow.records, strict=True):
        assert asdict(a) == asdict(b), a.request_id
    assert fast.decisions == slow.decisions
    assert fast.makespan_s == slow.makespan_s
    assert fast.to_dict()["pools"] == slow.to_dict()["pools"]  # busy seconds and steps, exactly
    assert fast.engine_steps == slow.engine_steps
    assert fast.events < slow.events  # the fast path ran


def test_disaggregated_mixed_load_is_identical() -> None:
    fast, slow = both(ClusterSpec(prefill=PoolSpec(2), decode=PoolSpec(3), router=CONDITIONAL),
                      arrivals_from_mix("mixed", 40.0, 5.0, seed=0))
    assert_same(fast, slow)
    assert {r.path for r in fast.records} >= {"remote", "local"}
    assert fast.events < slow.events / 2


def test_kv_pressure_and_preemption_are_identical() -> None:
    # a small KV pool: block allocations inside planned runs, runs refused for want of blocks, preemptions
    pool = PoolSpec(2, max_num_seqs=64, extra_args=("--num-gpu-blocks-override", "400", "--max-model-len", "4096"))
    spec = ClusterSpec(aggregated=pool, router={"mode": "Aggregated"})
    arrivals = [Arrival(at=i * 0.02, input_tokens=300 + 37 * (i % 11), output_tokens=60 + 53 * (i % 7))
                for i in range(150)]
    fast, slow = both(spec, arrivals)
    assert_same(fast, slow)
    assert all(r.ok for r in fast.records)


def test_seat_limit_waiting_queue_and_long_decodes_are_identical() -> None:
    # max-num-seqs 4: requests wait for a seat while the running ones decode (arrivals cut the runs short)
    spec = ClusterSpec(decode=PoolSpec(1, max_num_seqs=4), router={"mode": "Aggregated"})
    arrivals = [Arrival(at=i * 0.15, input_tokens=200, output_tokens=400 + 10 * i) for i in range(12)]
    assert_same(*both(spec, arrivals))


def test_transfer_timeouts_aborts_and_fallbacks_are_identical() -> None:
    # a 120 ms transfer timeout on a loaded prefill GPU and a TCP KV path (2.5 GB/s: the KV of a prompt past ~1.6k
    # tokens takes longer): prefill legs and KV hand-offs are aborted, the breakers open, requests fall back to
    # decode engines that are mid-run
    routing = {"buckets": [{"name": "all", "minInputTokens": 0, "prefill": "Remote"}],
               "fallback": {"onKVTransferTimeout": "LocalAggregated"}}
    spec = ClusterSpec(prefill=PoolSpec(1), decode=PoolSpec(2), transport="tcp",
                       router={"mode": "Disaggregated", "transferTimeoutMs": 120, "routing": routing})
    arrivals = [Arrival(at=i * 0.03, input_tokens=1000 + 400 * (i % 10), output_tokens=120, stream=True)
                for i in range(40)]
    fast, slow = both(spec, arrivals)
    assert_same(fast, slow)
    fallbacks = {r.fallback for r in fast.records}
    assert {"prefill_queue_timeout", "kv_transfer_timeout"} <= fallbacks
    assert any(r.path == "remote" for r in fast.records)


def test_a_controller_scaling_mid_run_is_identical() -> None:
    spec = ClusterSpec(decode=PoolSpec(2), router={"mode": "Aggregated"})
    arrivals = [Arrival(at=i * 0.1, input_tokens=500, output_tokens=200) for i in range(60)]

    async def controller(c: TwinCluster) -> None:
        await asyncio.sleep(1.5)
        await c.add_worker("decode")
        await asyncio.sleep(1.5)
        await c.remove_worker("decode-0")

    assert_same(*both(spec, arrivals, controller=controller))


@pytest.mark.parametrize("scrape_s", [0.05, 1.0])
def test_scrapes_see_the_state_of_their_time(scrape_s: float) -> None:
    # the router's snapshot (KV usage, running, waiting) is read mid-run: a scrape must see what the step-by-step
    # engine holds then, or decisions (and so records) change
    spec = ClusterSpec(prefill=PoolSpec(1), decode=PoolSpec(4), router=CONDITIONAL, scrape_interval_s=scrape_s)
    assert_same(*both(spec, arrivals_from_mix("mixed", 30.0, 4.0, seed=5)))
