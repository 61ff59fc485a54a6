"""The predictive autoscaler's sizing for a spec (plan/sizing.sizer_for_spec): a known model and GPU give the
planner's model with the spec's SLOs and parallelism; anything it cannot size is a reason naming the field."""

from __future__ import annotations

import yaml
from tests.paths import REPO

from disagg.api.models import DisaggregatedModelSpec
from disagg.plan.sizing import ModelSizer, sizer_for_spec
from disagg.twin.autoscaler import pod_start_s


def _spec(**autoscaling: object) -> DisaggregatedModelSpec:
    doc = yaml.safe_load((REPO / "docs" / "examples" / "llama-70b-rdma.yaml").read_text())
    doc["spec"]["decode"]["gpu"]["product"] = doc["spec"]["prefill"]["gpu"]["product"]
    doc["spec"]["autoscaling"].update({"policy": "Predictive", **autoscaling})
    return DisaggregatedModelSpec.model_validate(doc["spec"])


def test_a_known_model_and_gpu_are_sized_with_the_specs_slos_and_parallelism() -> None:
    made = sizer_for_spec(_spec())
    assert not isinstance(made, str), made
    sizer, start = made
    assert isinstance(sizer, ModelSizer)
    assert sizer.model.name == "Llama-3.1-70B" and sizer.gpu.name.startswith("H100")
    assert (sizer.ttft_slo_s, sizer.tpot_slo_s, sizer.prefill_tp, sizer.decode_tp) == (1.5, 0.06, 8, 8)
    assert start == pod_start_s("Llama-3.1-70B", tp=8)


def test_the_sizing_models_the_chunk_budgets_the_operator_renders() -> None:
    from disagg.builders.workers import chunk_budget

    spec = _spec()
    made = sizer_for_spec(spec)
    assert not isinstance(made, str), made
    assert (made[0].prefill_chunk, made[0].decode_chunk) == (chunk_budget(spec, "prefill"),
                                                            chunk_budget(spec, "decode"))
    spec.decode.max_num_batched_tokens = 3072
    made = sizer_for_spec(spec)
    assert not isinstance(made, str) and made[0].decode_chunk == 3072


def test_pod_start_seconds_wins_over_the_estimate() -> None:
    made = sizer_for_spec(_spec(podStartSeconds=240))
    assert not isinstance(made, str) and made[1] == 240.0


def test_what_the_model_cannot_size_is_a_reason_naming_the_field() -> None:
    mixed = _spec()
    mixed.decode.gpu.product = "NVIDIA-H200"
    assert "spec.prefill.gpu.product and spec.decode.gpu.product" in str(sizer_for_spec(mixed))
    unknown = _spec()
    unknown.model.name = "acme/secret-model-7b"
    assert "spec.model.name 'acme/secret-model-7b'" in str(sizer_for_spec(unknown))
