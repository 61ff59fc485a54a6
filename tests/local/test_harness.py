"""The model harness waits for the model to serve with both pools ready — pod readiness as the operator and the
router see it, not a timer — before any traffic (issue 12 §2: a demo must not depend on start-up timing)."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest

from disagg.local.harness import Timeline, not_serving, router_workers
from disagg.router.metrics import RouterMetrics


def _model(prefill: tuple[int, int] = (1, 1), decode: tuple[int, int] = (1, 1), mode: str = "Disaggregated",
           ready: str = "True", spec_mode: str | None = None) -> dict[str, Any]:
    """A DisaggregatedModel as the apiserver returns it; pools as (ready, desired)."""
    return {
        "spec": {} if spec_mode is None else {"mode": spec_mode},
        "status": {
            "activeMode": mode,
            "conditions": [{"type": "Ready", "status": ready}],
            "pools": {p: {"readyReplicas": r, "desiredReplicas": d}
                      for p, (r, d) in (("prefill", prefill), ("decode", decode))},
        },
    }


BOTH = {"prefill": 1, "decode": 1, "aggregated": 0}


def test_serving_when_both_pools_are_ready_and_known_to_the_router() -> None:
    assert not_serving(_model(), BOTH) is None
    assert not_serving(_model(prefill=(2, 2), decode=(3, 3)), {"prefill": 2, "decode": 3}) is None


def test_a_starting_prefill_pool_is_not_serving_even_when_ready_says_true() -> None:
    # the start-up race of issue 12 §2: the mode controller flipped to Aggregated while the prefill pod was still
    # loading, so Ready was True without the prefill pool; the first act must not start then
    flipped = _model(prefill=(0, 1), mode="Aggregated")
    assert not_serving(flipped, {"prefill": 0, "decode": 1}) == "prefill pool 0/1 ready"
    assert not_serving(_model(prefill=(1, 1), mode="Aggregated"), BOTH) == "mode is Aggregated"
    assert not_serving(_model(decode=(0, 1)), BOTH) == "decode pool 0/1 ready"
    assert not_serving(_model(prefill=(1, 2)), BOTH) == "prefill pool 1/2 ready"
    assert not_serving(_model(prefill=(0, 0)), BOTH) == "prefill pool 0/0 ready"  # no desired replica yet
    assert not_serving(_model(ready="False"), BOTH) == "condition Ready is not True"
    assert not_serving({"spec": {}}, BOTH) == "condition Ready is not True"  # no status yet


def test_the_router_must_know_the_ready_workers() -> None:
    assert not_serving(_model(), {"prefill": 0, "decode": 1}) == "the router knows 0 ready prefill workers of 1"
    assert not_serving(_model(decode=(2, 2)), BOTH) == "the router knows 1 ready decode workers of 2"
    assert not_serving(_model(), {}) == "the router knows 0 ready prefill workers of 1"  # no /health answer yet


def test_a_pinned_aggregated_model_serves_in_aggregated_mode() -> None:
    assert not_serving(_model(mode="Aggregated", spec_mode="Aggregated"), BOTH) is None
    pinned = _model(prefill=(0, 0), mode="Aggregated", spec_mode="Aggregated")  # no prefill pool needed
    assert not_serving(pinned, {"decode": 1}) is None
    starting = _model(decode=(0, 1), mode="Aggregated", spec_mode="Aggregated")
    assert not_serving(starting, BOTH) == "decode pool 0/1 ready"
    assert not_serving(_model(mode="Aggregated", spec_mode="Auto"), BOTH) == "mode is Aggregated"


def test_router_workers_reads_the_routers_gauge() -> None:
    m = RouterMetrics()
    m.workers.labels("prefill").set(2)
    m.workers.labels("decode").set(3)
    workers = router_workers(generate_latest(m.registry).decode())
    assert workers["prefill"] == 2 and workers["decode"] == 3
    assert router_workers("") == {}


def test_timeline_modes_and_first_growth() -> None:
    tl = Timeline(samples=[{"t": float(i), "mode": m, "prefill_desired": d, "decode_desired": 1}
                           for i, (m, d) in enumerate([("Disaggregated", 1), ("Disaggregated", 1), ("Aggregated", 1),
                                                       ("Aggregated", 2), ("Disaggregated", 2)])])
    assert tl.modes() == ["Disaggregated", "Aggregated", "Disaggregated"]
    assert tl.first_growth("prefill", 1.0) == 2.0
    assert tl.first_growth("decode", 0.0) is None
