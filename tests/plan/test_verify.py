"""`disagg plan --verify` and the spec → twin mapping (disagg.plan.verify): shapes, agreement, errors."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg.cli import main
from disagg.plan.arrivals import profile_arrivals
from disagg.plan.emit import to_model
from disagg.plan.profile import parse_profile
from disagg.plan.search import search
from disagg.plan.verify import SpecError, VerifySettings, cluster_spec, render_verify, verify

ROOT = Path(__file__).resolve().parents[2]

TINY: dict[str, Any] = {
    "name": "tiny", "model": {"preset": "Llama-3.1-8B"},
    "traffic": {"inputTokens": {"mean": 600, "p95": 1800}, "outputTokens": {"mean": 80, "p95": 200},
                "rate": {"meanRps": 6, "peakRps": 10}},
    "slo": {"ttftP95Ms": 600, "tpotP95Ms": 30, "goodputTarget": 0.9},
    "gpus": [{"type": "L40S", "count": 4, "cost": 0.5, "product": "NVIDIA-L40S"}],
    "search": {"maxGpus": 4, "tensorParallel": [1]},
}
FAST = VerifySettings(requests=200, min_duration_s=20.0)


def spec(**over: Any) -> dict[str, Any]:
    """A small valid DisaggregatedModel (what `disagg plan` emits for TINY, plus overrides under spec)."""
    doc = to_model(search(parse_profile(TINY)), search(parse_profile(TINY)).ranked[0])
    for k, v in over.items():
        doc["spec"][k] = v
    return doc


def test_verify_prints_predicted_and_simulated_side_by_side_and_they_agree() -> None:
    result = search(parse_profile(TINY))
    rows = verify(result, FAST)
    assert [r.rank for r in rows] == [1, 2, 3]
    for r in rows:
        assert set(r.predicted) == {"attainment", "goodput_rps", "ttft_p95_ms", "tpot_p95_ms"}
        sim = r.simulated
        assert sim.requests > 100 and sim.errors == 0
        # a plan the planner calls comfortable is comfortable in the twin too (same roofline)
        assert sim.attainment == pytest.approx(r.predicted["attainment"], abs=0.15)
        assert sim.tpot_p95_ms == pytest.approx(r.predicted["tpot_p95_ms"], rel=0.3)
        assert not r.misses
    text = render_verify(rows, FAST, 10)
    assert "goodput pred" in text and "goodput sim" in text and "TTFT p95 sim" in text
    assert "20 s of virtual time" in text
    assert text.count("\n") >= 5


def test_verify_flags_a_candidate_that_misses_the_target_in_the_twin() -> None:
    hot = copy.deepcopy(TINY)
    hot["traffic"]["rate"] = {"meanRps": 30, "peakRps": 40}
    result = search(parse_profile(hot))
    weak = next(c for c in result.ranked if c.mode == "aggregated" and c.decode.replicas == 1)
    assert not weak.feasible
    rows = verify(result, VerifySettings(requests=300, min_duration_s=10.0), candidates=[weak])
    assert rows[0].misses
    assert "MISSES target 90% in the twin" in render_verify(rows, FAST, 40)


def test_verify_is_deterministic_for_a_seed() -> None:
    result = search(parse_profile(TINY))
    c = result.ranked[:1]
    a = verify(result, FAST, candidates=c)[0].simulated.to_dict()
    b = verify(result, FAST, candidates=c)[0].simulated.to_dict()
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b


def test_profile_arrivals_follow_the_profile() -> None:
    p = parse_profile({**TINY, "traffic": {**TINY["traffic"], "prefixCacheHitShare": 0.4,
                                           "tenants": [{"name": "a", "share": 0.75}, {"name": "b", "share": 0.25,
                                                        "outputTokens": {"fixed": 7}}]}})
    arr = profile_arrivals(p, 200.0, seed=3)
    assert len(arr) == pytest.approx(10 * 200, rel=0.1)  # the peak rate
    b = [a for a in arr if a.tenant == "b"]
    assert len(b) / len(arr) == pytest.approx(0.25, abs=0.04)
    assert {a.output_tokens for a in b} == {7}
    mean_in = sum(a.input_tokens for a in arr) / len(arr)
    assert mean_in == pytest.approx(600, rel=0.1)
    assert sum(a.prefix_tokens for a in arr) / sum(a.input_tokens for a in arr) == pytest.approx(0.4, abs=0.01)
    assert profile_arrivals(p, 20.0, seed=3) == profile_arrivals(p, 20.0, seed=3)


# ------------------------------------------------------------------------------------------- the mapping


def test_cluster_spec_maps_pools_router_and_slo() -> None:
    doc = spec()
    doc["spec"]["prefill"]["replicas"] = 2
    doc["spec"]["decode"].update({"replicas": 3, "maxNumSeqs": 64, "maxReplicas": 4})
    doc["spec"]["routing"]["remotePrefill"]["minInputTokens"] = 700
    doc["spec"]["routing"]["localPrefill"]["maxInputTokens"] = 699
    m = cluster_spec(doc)
    c = m.cluster
    assert c.prefill is not None and c.decode is not None and c.aggregated is None
    assert (c.prefill.count, c.prefill.gpu, c.prefill.tp, c.prefill.max_num_batched_tokens) == (2, "L40S", 1, 8192)
    assert (c.decode.count, c.decode.max_num_seqs, c.decode.model_preset) == (3, 64, "Llama-3.1-8B")
    cfg = c.router_config()
    assert cfg.routing.remote_prefill.min_input_tokens == 700 and cfg.routing.local_prefill.max_input_tokens == 699
    assert (m.slo.ttft_ms, m.slo.tpot_ms, m.goodput_target) == (600, 30, 0.9)
    assert m.gpus == 5 and c.transport == "rdma" and m.label == "P 2×L40S : D 3×L40S"


def test_cluster_spec_runs_the_chunk_budget_the_operator_renders() -> None:
    """A pool without maxNumBatchedTokens runs the budget the operator's worker args carry (the TPOT-bounded one of
    a pool that runs streams), not vLLM's default: the replay, --verify and the virtual day run what ships."""
    from disagg.api.models import DisaggregatedModel
    from disagg.builders.workers import chunk_budget

    doc = spec()
    for role in ("prefill", "decode"):
        doc["spec"][role].pop("maxNumBatchedTokens", None)
    s = DisaggregatedModel.model_validate(doc).spec
    c = cluster_spec(doc).cluster
    assert c.prefill is not None and c.decode is not None
    rendered = (chunk_budget(s, "prefill"), chunk_budget(s, "decode"))
    assert rendered[1] is not None and rendered[1] < 2048  # vLLM's default on an L40S: the TPOT bound is below it
    assert (c.prefill.max_num_batched_tokens, c.decode.max_num_batched_tokens) == rendered
    doc["spec"]["decode"]["maxNumBatchedTokens"] = 4096  # the spec's own value wins, as in the worker args
    assert cluster_spec(doc).cluster.decode.max_num_batched_tokens == 4096  # type: ignore[union-attr]


def test_cluster_spec_aggregated_mode_runs_no_prefill_pool() -> None:
    doc = spec(mode="Aggregated")
    m = cluster_spec(doc)
    assert m.cluster.prefill is None and m.cluster.decode is not None
    assert m.cluster.router_config().effective_mode().value == "Aggregated"


def test_cluster_spec_tensor_parallel_and_gpu_flag() -> None:
    doc = spec()
    doc["spec"]["decode"]["gpu"] = {"count": 2}
    doc["spec"]["decode"]["parallelism"] = {"tensor": 2}
    with pytest.raises(SpecError) as e:
        cluster_spec(doc)
    assert "spec.decode.gpu.product: unset" in str(e.value) and "--gpu" in str(e.value)
    m = cluster_spec(doc, gpu="H100-SXM")
    assert m.cluster.decode is not None and (m.cluster.decode.gpu, m.cluster.decode.tp) == ("H100-SXM", 2)


@pytest.mark.parametrize(("change", "needle"), [
    (lambda d: d["spec"]["decode"].update(replicas=-1), "spec.decode.replicas"),
    (lambda d: d["spec"].update(bogus=1), "spec.bogus"),
    (lambda d: d["spec"]["decode"]["gpu"].update(product="TPU-v5"), "spec.decode.gpu.product: unknown GPU preset"),
    (lambda d: d["spec"]["model"].update(name="acme/mystery-model"), "spec.model.name: no model preset matches"),
])
def test_cluster_spec_errors_name_the_field(change: Any, needle: str) -> None:
    doc = spec()
    change(doc)
    with pytest.raises(SpecError) as e:
        cluster_spec(doc)
    assert needle in str(e.value)


def test_invalid_spec_is_refused_with_disagg_validates_rules() -> None:
    doc = spec()
    doc["spec"]["decode"]["minReplicas"] = 5  # above maxReplicas: a CEL rule
    with pytest.raises(SpecError) as e:
        cluster_spec(doc)
    assert "(disagg validate)" in str(e.value) and "spec.decode" in str(e.value)


def test_cli_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump(TINY))
    rc = main(["plan", str(prof), "--verify", "--verify-requests", "150"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "verify: the top 3 candidates" in out and "goodput sim" in out
    m = re.search(r"\((\d+) measured requests, [0-9.]+ s wall\)", out)
    assert m is not None and int(m.group(1)) > 3 * 100


def test_cli_verify_needs_a_model_preset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = copy.deepcopy(TINY)
    doc["model"] = {"name": "acme/m", "config": {"layers": 32, "hidden": 4096, "heads": 32, "kvHeads": 8,
                                                 "intermediate": 14336}}
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump(doc))
    rc = main(["plan", str(prof), "--verify"])
    assert rc == 2
    assert "--verify: model.config: --verify needs model.preset" in capsys.readouterr().err
