"""Tenant priority reaches the engines (issue 29): the operator's rule (api/spec.py ``priority_scheduling``) turns
on vLLM's priority scheduler, the router sends each tenant's priority, and under overload the Interactive tenant
is served before the Batch one — in the twin, with the simulator's scheduler (sim/scheduler.py, vLLM 0.33.0's
policy)."""

from __future__ import annotations

from typing import Any

from disagg.api.contract import RouterConfig
from disagg.api.spec import TENANT_PRIORITY, priority_scheduling
from disagg.perf.roofline import percentile
from disagg.twin import Arrival, ClusterSpec, PoolSpec, simulate

TENANTS: list[dict[str, Any]] = [
    {"name": "chat", "match": {"values": ["chat"]}, "priority": "Interactive"},
    {"name": "batch", "match": {"values": ["batch"]}, "priority": "Batch"},
]


def overload(n: int = 240) -> list[Arrival]:
    """A burst far past one worker's capacity, the two tenants interleaved, same prompts and outputs."""
    return [Arrival(at=i * 0.004, input_tokens=3000, output_tokens=64, tenant=("chat", "batch")[i % 2],
                    request_id=f"r{i:03d}") for i in range(n)]


def ttft_p50(r: Any, tenant: str) -> float:
    return percentile([x.ttft_s for x in r.records if x.tenant == tenant and x.ttft_s is not None], 50)


def test_the_rule_and_the_mapping() -> None:
    cfg = RouterConfig.model_validate({"routing": {"tenants": TENANTS}})
    assert priority_scheduling(cfg.routing)
    assert not priority_scheduling(RouterConfig.model_validate({"routing": {"tenants": TENANTS[:1]}}).routing)
    assert TENANT_PRIORITY == {"Interactive": 0, "Batch": 1, "Background": 2}


def test_under_overload_the_interactive_tenant_is_served_before_the_batch_one() -> None:
    router = {"model": "m", "mode": "Aggregated", "routing": {"tenants": TENANTS}}
    r = simulate(ClusterSpec(aggregated=PoolSpec(1, max_num_seqs=16), router=router), overload())
    assert all(x.ok for x in r.records)
    chat, batch = ttft_p50(r, "chat"), ttft_p50(r, "batch")
    assert chat * 3 < batch  # chat goes first from the waiting queue
    # without a tenant below Interactive there is no priority scheduling: both wait alike (FCFS)
    fcfs = {"model": "m", "mode": "Aggregated",
            "routing": {"tenants": [{**TENANTS[1], "priority": "Interactive"}, TENANTS[0]]}}
    f = simulate(ClusterSpec(aggregated=PoolSpec(1, max_num_seqs=16), router=fcfs), overload())
    assert 0.7 < ttft_p50(f, "chat") / ttft_p50(f, "batch") < 1.4
