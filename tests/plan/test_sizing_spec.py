"""The predictive autoscaler's sizing for a spec (plan/sizing.sizer_for_spec): a known model and GPU give the
planner's model with the spec's SLOs and parallelism; anything it cannot size is a reason naming the field."""

from __future__ import annotations

import pytest
import yaml
from tests.paths import REPO

from disagg.api.models import DisaggregatedModelSpec
from disagg.autoscaling.forecast import Load
from disagg.plan.sizing import QUANTILE, ModelSizer, sizer_for_spec
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


def _day_sizer() -> ModelSizer:
    from disagg.perf.presets import get_gpu, get_model, get_transport

    return ModelSizer(get_gpu("L40S"), get_model("Llama-3.1-8B"), get_transport("rdma"), ttft_slo_s=2.0,
                      tpot_slo_s=0.05, prefill_chunk=1792, decode_chunk=512)


def _ttft_shares(sizer: ModelSizer, load: Load, p: int, d: int, tau: float) -> tuple[float, float, float]:
    """(P(remote TTFT ≤ tau), P(local TTFT ≤ tau), the share of all requests within tau) on p prefill, d decode."""
    from disagg.plan.model import decode_side

    wl = sizer._workload(load)
    pm, dm = sizer._pools(wl)
    side = decode_side(dm, d, wl, wl.mean_rps, (False, True), sizer.tpot_slo_s)
    remote = sizer._remote_ttft_ok(pm, dm, wl, p, tau, side.step_s)
    local = sizer._local_ttft_ok(side, wl, tau)
    return remote, local, wl.in_weight[0] * remote + wl.in_weight[1] * local


@pytest.mark.parametrize(("rate", "long_share"), [(2.0, 0.364), (4.2, 0.516), (7.6, 0.66), (11.9, 0.8)])
def test_the_sizing_holds_the_slos_p95_over_all_requests_not_each_path(rate: float, long_share: float) -> None:
    """spec.slo.ttftP95Ms is a p95 over the model's requests (what the router reports; what ``disagg plan`` holds a
    candidate to): the prefill pool is the fewest replicas that bring the share of all requests within the target to
    95 %, short local prompts included. At night (2 req/s, 36 % long prompts) one prefill replica does it, although
    only ~93 % of the long prompts alone are on time (sizing each path to its own p95 kept two)."""
    sizer = _day_sizer()
    load = Load(rate * long_share, rate * (1 - long_share), 8000.0, 450.0, 252.0)
    need = sizer.size(load, 0.9, 1.0, 1.0)
    tau = 0.9 * sizer.ttft_slo_s
    _, _, share = _ttft_shares(sizer, load, need.prefill, need.decode, tau)
    assert share >= QUANTILE, need
    if need.prefill > 1:
        assert _ttft_shares(sizer, load, need.prefill - 1, need.decode, tau)[2] < QUANTILE, need
    if rate < 3:
        remote, local, _ = _ttft_shares(sizer, load, 1, need.decode, tau)
        assert need.prefill == 1 and remote < QUANTILE <= local, (need, remote, local)
