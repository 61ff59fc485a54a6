"""Deletion costs: a pod's in-flight requests, so a scale-down removes the idlest pods first."""

from __future__ import annotations

from disagg.autoscaling.deletion import INT32_MAX, deletion_costs


def test_cost_is_the_requests_a_pod_holds_rounded_up() -> None:
    costs = deletion_costs(["a", "b", "c"], {"a": 0.0, "b": 0.2, "c": 7.0})
    assert costs == {"a": 0, "b": 1, "c": 7}  # one request left outranks an idle pod


def test_an_unmeasured_pod_costs_as_an_idle_one_and_every_pod_gets_a_cost() -> None:
    assert deletion_costs(["new", "busy"], {"busy": 4.0, "gone": 9.0}) == {"new": 0, "busy": 4}


def test_costs_stay_in_the_annotations_int32_range() -> None:
    assert deletion_costs(["a", "b"], {"a": 1e12, "b": -3.0}) == {"a": INT32_MAX, "b": 0}
