"""spec.autoscaling.policy Predictive in the operator: `disagg operator` gets the planner's sizing from the top
of the command line (disagg.cli), and the autoscaler builds one predictive policy per spec, or records why not."""

from __future__ import annotations

from typing import Any

from tests.autoscaling.test_loop import _Sizer

from disagg.api.models import DisaggregatedModel
from disagg.autoscaling.loop import LoopState
from disagg.cli import _wire, build_parser
from disagg.controller.autoscaler import Autoscaler
from disagg.plan.sizing import sizer_for_spec


def _model(**autoscaling: Any) -> DisaggregatedModel:
    return DisaggregatedModel.model_validate({
        "apiVersion": "serving.disagg.dev/v1alpha1", "kind": "DisaggregatedModel", "metadata": {"name": "m"},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                 "autoscaling": {"enabled": True, "policy": "Predictive", **autoscaling}}})


def _scaler(sizer_for: Any) -> Autoscaler:
    return Autoscaler(kube=None, emit=lambda *_: None, sizer_for=sizer_for)  # type: ignore[arg-type]  # unused here


def test_disagg_operator_is_given_the_planners_sizing() -> None:
    args = build_parser().parse_args(["operator"])
    _wire(args)
    assert args.sizer_for is sizer_for_spec
    other = build_parser().parse_args(["crds"])
    _wire(other)
    assert not hasattr(other, "sizer_for")


def test_one_policy_per_spec_rebuilt_when_the_spec_changes() -> None:
    built: list[int] = []

    def sizer_for(spec: Any) -> tuple[_Sizer, float]:
        built.append(spec.autoscaling.interval_seconds)
        return _Sizer(), 90.0

    scaler, state = _scaler(sizer_for), LoopState()
    scaler.predictive(state, _model())
    policy = state.predictive
    assert policy is not None and policy.s.pod_start_s == 90.0 and policy.s.horizon == 4  # ⌈(90 + 30) ÷ 30⌉
    scaler.predictive(state, _model())
    assert state.predictive is policy and built == [30]  # the same spec: its forecast and record kept
    scaler.predictive(state, _model(intervalSeconds=60))
    assert state.predictive is not policy and built == [30, 60]
    scaler.predictive(state, _model(policy="Proportional"))
    assert state.predictive is None and state.predictive_unavailable is None


def test_without_a_sizing_the_reason_is_kept_for_the_decisions() -> None:
    state = LoopState()
    _scaler(lambda _spec: "spec.model.name 'x' matches no model").predictive(state, _model())
    assert state.predictive is None and state.predictive_unavailable == \
        "Predictive unavailable: spec.model.name 'x' matches no model"
    state = LoopState()
    _scaler(None).predictive(state, _model())
    assert state.predictive_unavailable and "without the performance model" in state.predictive_unavailable


def test_role_moves_only_between_pools_whose_workers_pair() -> None:
    def sizer_for(_spec: Any) -> tuple[_Sizer, float]:
        return _Sizer(), 53.0

    state = LoopState()
    _scaler(sizer_for).predictive(state, _model())
    assert state.predictive is not None and state.predictive.s.role_moves
    other = _model().model_dump(by_alias=True)
    other["spec"]["decode"] = {"extraArgs": ["--block-size", "32"]}  # a different KV layout: no pairs, no moves
    state = LoopState()
    _scaler(sizer_for).predictive(state, DisaggregatedModel.model_validate(other))
    assert state.predictive is not None and not state.predictive.s.role_moves
