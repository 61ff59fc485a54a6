"""A slow KV transfer is a routing event (router/paths.py ``_hedged``), in the twin (virtual time).

Healthy remote streams teach the router what a KV hand-off takes on each decode worker; then every KV pull stalls,
with the stalled streams overlapping (a decode worker then shows them waiting for their KV: no queue, still a hedge)
(``kv_transfer_delay_ms`` far beyond the transfer timeout's share). With hedging, each stalled stream gets a local
prefill beside it once its first token is late, answers from there (fallback ``kv_transfer_slow``) long before the
transfer timeout, the breakers learn from it, and no KV block is left held on any engine once the leases run out.
With hedging off (``hedge_factor`` 0), the same streams wait the whole transfer timeout.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from disagg.router.policy_types import Tuning
from disagg.twin import Arrival, ClusterSpec, PoolSpec, TwinResult, simulate
from disagg.twin.cluster import TwinCluster

TIMEOUT_MS = 8000
STALL_AT = 10.0  # virtual seconds: healthy before, stalled after
ROUTER: dict[str, Any] = {"mode": "Disaggregated", "transferTimeoutMs": TIMEOUT_MS, "routing": {
    "buckets": [{"name": "all", "minInputTokens": 0, "prefill": "Remote"}],
    "circuitBreaker": {"failureThreshold": 1000, "cooldownSeconds": 600, "halfOpenProbes": 1}}}
LEASE_S = 30.0  # how long a prefill engine holds unclaimed KV (vLLM 0.33's kv_lease_duration default)
CHECK_AT = STALL_AT + 8.0 + TIMEOUT_MS / 1000 + LEASE_S + 5.0  # every lease of the stalled streams has run out
ARRIVALS = [Arrival(at=0.5 + i * 1.0, input_tokens=3000, output_tokens=32) for i in range(8)] + \
           [Arrival(at=STALL_AT + 0.5 + i * 0.1, input_tokens=3000, output_tokens=32) for i in range(6)] + \
           [Arrival(at=CHECK_AT + 1.0, input_tokens=100, output_tokens=4)]  # keeps the run going past the check


def run(tuning: Tuning, held_after: list[int]) -> TwinResult:
    spec = ClusterSpec(prefill=PoolSpec(1), decode=PoolSpec(2), router=ROUTER, tuning=tuning, scrape_interval_s=0.1)

    async def controller(cluster: TwinCluster) -> None:
        await asyncio.sleep(STALL_AT)
        for w in cluster.pool("decode"):
            cluster.set_faults(w.url, {"kv_transfer_delay_ms": 60_000.0})
        await asyncio.sleep(CHECK_AT - STALL_AT)
        held_after.append(sum(len(w.engine.sched.held) for w in cluster.pool("prefill")))
        held_after.append(sum(w.engine.pool.num_blocks - w.engine.pool.num_free for w in cluster.workers.values()
                              if not w.engine.sched.running))

    return simulate(spec, ARRIVALS, seed=1, controller=controller)


@pytest.mark.parametrize("hedge", [True, False], ids=["hedge", "no-hedge"])
def test_a_stalled_transfer_is_raced_by_a_local_prefill(hedge: bool) -> None:
    held: list[int] = []
    tuning = Tuning() if hedge else dataclasses.replace(Tuning(), hedge_factor=0.0)
    r = run(tuning, held)
    healthy = [x for x in r.records if x.arrival_s < STALL_AT]
    stalled = [x for x in r.records if STALL_AT < x.arrival_s < CHECK_AT]
    assert all(x.ok and x.path == "remote" for x in healthy), healthy
    assert all(x.ok for x in stalled), stalled
    worst_healthy = max(x.ttft_s or 0.0 for x in healthy)
    if hedge:
        assert {(x.path, x.fallback) for x in stalled} == {("fallback", "kv_transfer_slow")}, stalled
        # the hedge waits a few hand-offs' worth, then a local prefill: well within 2× the healthy TTFT + 0.5 s
        assert all((x.ttft_s or 1e9) < 2 * worst_healthy + 0.5 for x in stalled), [x.ttft_s for x in stalled]
    else:
        assert {(x.path, x.fallback) for x in stalled} == {("fallback", "kv_transfer_timeout")}, stalled
        assert all((x.ttft_s or 0.0) >= TIMEOUT_MS / 1000 for x in stalled), [x.ttft_s for x in stalled]
    assert held == [0, 0], "KV blocks still held after the leases ran out"
