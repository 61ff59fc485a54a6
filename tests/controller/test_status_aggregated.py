"""The optional aggregated pool (spec.aggregated) has a condition of its own, AggregatedReady (issue 31): a migration
waits on it; READY does not (the router serves on the decode workers until an aggregated worker is ready)."""

from __future__ import annotations

import yaml

from disagg.builders import parse_model
from disagg.controller import status as st

from .conftest import EXAMPLES


def _dm(aggregated: bool = True):
    """The NVLink example, migrating: an existing aggregated deployment kept as spec.aggregated (install.md), mode
    pinned Aggregated while the disaggregated pools come up."""
    body = yaml.safe_load(EXAMPLES["llama-8b-nvlink"].read_text())
    body["metadata"].update(namespace="ns", uid="u", generation=1)
    body["spec"]["mode"] = "Aggregated"
    if aggregated:
        body["spec"]["aggregated"] = {"replicas": 2, "gpu": body["spec"]["decode"].get("gpu", {"count": 1})}
    return parse_model(body)


def _deployment(replicas: int, ready: int) -> dict:
    return {"spec": {"replicas": replicas}, "status": {"replicas": replicas, "readyReplicas": ready}}


def _conds(out: dict) -> dict:
    return {c["type"]: c for c in out["conditions"]}


def test_aggregated_pool_has_its_own_condition_and_ready_does_not_wait_for_it() -> None:
    dm = _dm()
    assert dm.spec.aggregated is not None and dm.spec.aggregated.replicas > 0
    n = dm.spec.aggregated.replicas
    deps = {"prefill": _deployment(1, 1), "decode": _deployment(1, 1), "router": _deployment(1, 1),
            "aggregated": _deployment(n, 0)}
    out = st.desired_status(dm, {}, deps, 1, now="T0")
    conds = _conds(out)
    assert conds["AggregatedReady"]["status"] == "False" and conds["AggregatedReady"]["reason"] == "Starting"
    assert conds["Ready"]["status"] == "True"  # the router serves on the decode worker meanwhile
    deps["aggregated"] = _deployment(n, n)
    later = _conds(st.desired_status(dm, out, deps, 1, now="T1"))
    assert later["AggregatedReady"]["status"] == "True" and later["AggregatedReady"]["reason"] == "AllReplicasReady"
    assert later["AggregatedReady"]["lastTransitionTime"] == "T1"


def test_removing_the_aggregated_pool_removes_its_condition() -> None:
    deps = {"prefill": _deployment(1, 1), "decode": _deployment(1, 1), "router": _deployment(1, 1),
            "aggregated": _deployment(1, 1)}
    before = st.desired_status(_dm(), {}, deps, 1, now="T0")
    assert "AggregatedReady" in _conds(before)
    after = st.desired_status(_dm(aggregated=False), before, {k: v for k, v in deps.items() if k != "aggregated"},
                              2, now="T1")
    assert "AggregatedReady" not in _conds(after) and after["pools"]["aggregated"] is None
    assert "AggregatedReady" not in _conds(st.desired_status(_dm(aggregated=False), {}, deps, 1, now="T0"))
