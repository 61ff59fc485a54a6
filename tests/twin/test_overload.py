"""Overload without collapse (issue 29), in the twin: the router's own request core admits, queues and sheds in
virtual time. An Interactive chat tenant at a steady rate beside a Batch tenant offered far past the knee: without
admission both degrade; with the batch tenant on Shed or Queue the chat tenant keeps its attainment and the batch
tenant takes the capacity left, refused (429) rather than served late."""

from __future__ import annotations

import random
from collections import Counter
from functools import cache
from typing import Any

import pytest

from disagg.twin import Arrival, ClusterSpec, PoolSpec, simulate
from disagg.twin.run import SLO, TwinResult

DURATION_S = 30.0
SLO_ = SLO(ttft_ms=1000, tpot_ms=100)


def poisson(rate: float, tenant: str, input_tokens: int, output_tokens: int, seed: int) -> list[Arrival]:
    r, t, out = random.Random(seed), 0.0, []
    while (t := t + r.expovariate(rate)) < DURATION_S:
        out.append(Arrival(at=t, input_tokens=input_tokens, output_tokens=output_tokens, tenant=tenant))
    return out


@cache
def run(batch_overload: str, policy: str = "SLO") -> TwinResult:
    # batch at 160 req/s: far past one decode worker's knee. (80 was until the SLO placement's stall harm got its
    # ceiling (2026-12-07): the placement no longer sends the overflow where the smaller of two over-counted harms
    # pointed, and chat kept 100 % under Admit at 80 req/s of batch, 94.2 % at 120. 32 was, until the perf model
    # read an H100's memory as CUDA reports it, 79.22 GiB not 80e9 B: issue 26. With ~5 GiB more KV the decode
    # worker absorbed 32 req/s
    # of batch without costing chat its SLO under Admit, so it was no longer an overload for everyone. 48 was until
    # the SLO placement overruled a ladder choice at risk on any clear saving (2026-12-05): that alone kept chat
    # at 0.96 under Admit at 48, and at 0.95 at 64.)
    arrivals = sorted(poisson(4.0, "chat", 1000, 128, 1) + poisson(160.0, "batch", 3000, 256, 2), key=lambda a: a.at)
    arrivals = [Arrival(**{**a.__dict__, "request_id": f"r{i:04d}"}) for i, a in enumerate(arrivals)]
    tenants: list[dict[str, Any]] = [
        {"name": "chat", "match": {"values": ["chat"]}, "priority": "Interactive"},
        {"name": "batch", "match": {"values": ["batch"]}, "priority": "Batch", "overload": batch_overload}]
    router = {"model": "m", "mode": "Disaggregated", "routing": {"policy": policy, "tenants": tenants},
              "slo": {"ttftP95Ms": SLO_.ttft_ms, "tpotP95Ms": SLO_.tpot_ms}}
    return simulate(ClusterSpec(prefill=PoolSpec(1), decode=PoolSpec(1), router=router), arrivals, slo=SLO_,
                    window_s=DURATION_S)


def attainment(r: TwinResult, tenant: str) -> float:
    rs = [x for x in r.records if x.tenant == tenant]
    return sum(x.meets(r.slo) for x in rs) / len(rs)


def goodput(r: TwinResult, tenant: str) -> float:
    return sum(x.meets(r.slo) for x in r.records if x.tenant == tenant) / DURATION_S


def refusals(r: TwinResult, tenant: str) -> Counter[tuple[int, str]]:
    return Counter((x.status, x.error) for x in r.records if x.tenant == tenant and not x.ok)


@pytest.mark.parametrize("policy", ["Shed", "Queue"])
def test_the_interactive_tenant_keeps_its_attainment_and_batch_absorbs_the_overload(policy: str) -> None:
    admit, r = run("Admit"), run(policy)
    # without admission (every tenant Admits: today's path, nothing held or refused) the overload reaches everyone:
    # the batch tenant collapses, chat loses its SLO too
    assert not refusals(admit, "batch") and all(x.ok for x in admit.records)
    assert attainment(admit, "batch") < 0.2
    assert attainment(admit, "chat") < 0.95
    # with it: chat is served within its SLO, and batch gets twice the goodput it had (2.5×; over 3× before the SLO
    # placement overruled a ladder choice at risk on any clear saving, which alone keeps more of batch within its SLO)
    assert attainment(r, "chat") >= 0.95
    assert all(x.ok for x in r.records if x.tenant == "chat")
    assert goodput(r, "batch") > 2 * goodput(admit, "batch")
    # what batch was refused, it was refused with 429 and a reason; nothing of chat's
    reasons = refusals(r, "batch")
    assert reasons and {status for status, _ in reasons} == {429}
    want = {"overload_shed"} if policy == "Shed" else {"admission_queue_timeout", "admission_queue_full"}
    assert {reason for _, reason in reasons} <= want
    assert not refusals(r, "chat")


def test_queued_requests_wait_in_the_router_and_that_wait_is_in_their_ttft() -> None:
    r = run("Queue")
    served = [x for x in r.records if x.tenant == "batch" and x.ok]
    # some batch requests were served after a wait in the router: their TTFT counts from their arrival
    assert max(x.ttft_s or 0.0 for x in served) > SLO_.ttft_ms / 1000.0
    # and none waited past the tenant's maxQueueTimeMs (default 10 s) before it was served or refused
    assert all((x.ttft_s or 0.0) < 10.0 + 5.0 for x in served)


def test_under_the_thresholds_policy_admission_prices_the_ladders_choice() -> None:
    """No SLO placement, so no prediction from the policy: admission prices the ladder's choice with the same model
    (overload.py ``over_slo``) and protects chat the same way."""
    admit, shed = run("Admit", "Thresholds"), run("Shed", "Thresholds")
    assert attainment(shed, "chat") >= 0.95
    assert goodput(shed, "batch") > 3 * goodput(admit, "batch")
    assert {reason for _, reason in refusals(shed, "batch")} == {"overload_shed"}
