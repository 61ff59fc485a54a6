"""`disagg plan`: the profile, the queueing model, the search's choices, the emitted spec, the command line."""

from __future__ import annotations

import copy
import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg.api.validate import errors_of, validate_documents
from disagg.cli import main
from disagg.perf.presets import TRANSPORTS, get_gpu, get_model
from disagg.plan.emit import bounds, to_model
from disagg.plan.model import build_workload, decode_side, overflow_share, pool_model
from disagg.plan.profile import ProfileError, TokenDist, load_profile, parse_profile
from disagg.plan.queueing import IDLE, erlang_c, mgc
from disagg.plan.report import render
from disagg.plan.search import Evaluator, Mode, search

ROOT = Path(__file__).resolve().parents[2]
CHAT = ROOT / "docs/examples/profiles/profile-chat.yaml"
RAG = ROOT / "docs/examples/profiles/profile-rag.yaml"


def base(**over: Any) -> dict[str, Any]:
    """A small, plannable profile: Llama-3.1-8B on one GPU type."""
    doc: dict[str, Any] = {
        "name": "t",
        "model": {"preset": "Llama-3.1-8B"},
        "traffic": {"inputTokens": {"mean": 300, "p95": 800}, "outputTokens": {"mean": 250, "p95": 600},
                    "rate": {"meanRps": 20, "peakRps": 30}},
        "slo": {"ttftP95Ms": 1000, "tpotP95Ms": 50, "goodputTarget": 0.95},
        "gpus": [{"type": "H100-SXM", "count": 16}],
    }
    for k, v in over.items():
        doc[k] = v
    return doc


def problems(doc: Any) -> list[str]:
    with pytest.raises(ProfileError) as e:
        parse_profile(doc)
    return e.value.problems


# ------------------------------------------------------------------------------------------------ profile


def test_profile_without_rate_names_the_field_and_what_to_write() -> None:
    doc = base()
    del doc["traffic"]["rate"]
    assert problems(doc) == ["traffic.rate: Field required: give meanRps (requests/s) and optionally peakRps"]


def test_rate_without_mean_and_peak_below_mean() -> None:
    doc = base()
    doc["traffic"]["rate"] = {"peakRps": 5}
    assert problems(doc) == ["traffic.rate.meanRps: Field required"]
    doc["traffic"]["rate"] = {"meanRps": 10, "peakRps": 5}
    assert problems(doc) == ["traffic.rate: peakRps (5) is below meanRps (10)"]


def test_gpu_type_without_a_preset_lists_the_known_ones() -> None:
    doc = base(gpus=[{"type": "H100-SXM", "count": 8}, {"type": "TPU-v5", "count": 8}])
    (msg,) = problems(doc)
    assert msg.startswith("gpus[1].type: unknown GPU preset 'TPU-v5'; known: H100-SXM")
    assert "add a preset to perf/presets.py" in msg


def test_model_errors() -> None:
    assert problems(base(model={"preset": "GPT-5"}))[0].startswith("model: unknown model preset 'GPT-5'")
    assert problems(base(model={}))[0].startswith("model: give exactly one of preset")
    cfg = {"layers": 32, "hidden": 4096, "heads": 32, "kvHeads": 8}
    assert "needs intermediate" in problems(base(model={"config": cfg, "name": "x/y"}))[0]
    assert "needs name" in problems(base(model={"config": {**cfg, "intermediate": 14336}}))[0]


def test_distribution_errors_and_unknown_fields() -> None:
    doc = base()
    doc["traffic"]["inputTokens"] = {"mean": 500, "p95": 400}
    assert "p95 (400) is below mean (500)" in problems(doc)[0]
    doc["traffic"]["inputTokens"] = {"mean": 100, "p95": 1000}
    assert "give a histogram" in problems(doc)[0]
    doc["traffic"]["inputTokens"] = {"mean": 100, "fixed": 100}
    assert "exactly one of" in problems(doc)[0]
    doc["traffic"]["inputTokens"] = {"mean": 100}
    doc["slo"]["ttft_p95_ms"] = 5
    assert "slo.ttft_p95_ms: unknown field" in problems(doc)


def test_lognormal_fit_keeps_the_mean_and_the_p95() -> None:
    d = TokenDist(mean=700, p95=2000)
    bins = d.bins(2000)
    assert sum(w for _, w in bins) == pytest.approx(1.0)
    assert sum(t * w for t, w in bins) == pytest.approx(700, rel=1e-6)
    toks = sorted(t for t, _ in bins)
    assert toks[int(0.95 * len(toks))] == pytest.approx(2000, rel=0.03)
    hist = TokenDist.model_validate({"histogram": [{"tokens": 10, "share": 3}, {"tokens": 20, "share": 1}]})
    assert hist.bins() == [(10.0, 0.75), (20.0, 0.25)]


def test_example_profiles_load() -> None:
    assert load_profile(CHAT).traffic.tenants
    assert load_profile(RAG).model.resolve().name == "Llama-3.1-70B"


def test_unreadable_profile_is_a_profile_error(tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(ProfileError, match="not YAML"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="No such file"):
        load_profile(tmp_path / "missing.yaml")


# ---------------------------------------------------------------------------------------------- queueing


def test_erlang_c_and_mgc_match_closed_forms() -> None:
    assert erlang_c(1, 0.7) == pytest.approx(0.7)  # M/M/1: P(wait) = ρ
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)  # M/M/2 at a = 1
    mu, lam = 10.0, 7.0
    mm1 = mgc(lam, 1 / mu, 2 / mu**2, 1)  # exponential service: E[S²] = 2/μ²
    assert mm1.mean_wait == pytest.approx(lam / (mu * (mu - lam)))
    md1 = mgc(lam, 1 / mu, 1 / mu**2, 1)  # deterministic service: half the M/M/1 wait
    assert md1.mean_wait == pytest.approx(mm1.mean_wait / 2)
    assert mgc(lam, 1 / mu, 1 / mu**2, 1).p_wait_le(0) == pytest.approx(0.3)
    assert mgc(11.0, 0.1, 0.01, 1).saturated


def test_local_prefill_stretches_tpot() -> None:
    p = parse_profile(base())
    wl = build_workload(p)
    pm = pool_model(get_gpu("H100-SXM"), 1, 1.0, get_model("Llama-3.1-8B"), wl, 8192, 0.9)
    local = [True] * len(wl.in_tokens)
    agg = decode_side(pm, 2, wl, 30.0, local, 0.05)
    dis = decode_side(pm, 2, wl, 30.0, [False] * len(local), 0.05)
    assert agg.prefill_share > 0.05 and dis.prefill_share == 0
    assert agg.tpot_mean_s == pytest.approx(agg.step_s / (1 - agg.prefill_share))
    assert agg.tpot_mean_s > dis.tpot_mean_s
    # Little's law holds at the fixed point
    assert agg.batch == pytest.approx(30.0 / 2 * wl.mean_out * agg.tpot_mean_s, rel=1e-3)


def test_the_prefill_queues_overflow_prefills_on_the_decode_pool() -> None:
    """The prompts whose prefill-queue wait would pass the emitted maxPrefillQueueWaitMs go local (the router's
    prefill_queue_overload, and the SLO placement's remote-TTFT misses): their share is the queue's tail past the
    budget, none for an idle queue, and a candidate whose queue overflows carries that prefill on its decode side."""
    busy = mgc(7.0, 0.1, 0.02, 1)
    assert overflow_share(IDLE, 0.0) == 0.0
    shares = [overflow_share(busy, t) for t in (0.0, 0.2, 0.5, 1.0)]
    assert shares[0] == pytest.approx(0.7)  # at a zero budget: every prompt that waits at all
    assert all(a > b > 0 for a, b in itertools.pairwise(shares))
    assert overflow_share(mgc(11.0, 0.1, 0.01, 1), 0.5) == 0.0  # saturated: the candidate fails on its prefill side
    p = parse_profile(base())
    wl = build_workload(p)
    ev = Evaluator(p, wl, p.model.resolve(), TRANSPORTS[p.kv_transport])
    key = (p.gpus[0].type, 1)
    calm = ev.evaluate("disaggregated", 0, key, 4, key, 2, wl.peak_rps)
    assert calm.dside.prefill_share == 0.0
    # one prefill replica driven towards its limit: its queue's tail grows past the budget, and that share of the
    # prompts is prefilled on the decode replicas
    # prompts is prefilled on the decode replicas (four of them: two would saturate on decode first)
    limit = wl.peak_rps / ev.evaluate("disaggregated", 0, key, 1, key, 4, wl.peak_rps).pqueue.rho
    tight = [ev.evaluate("disaggregated", 0, key, 1, key, 4, limit * u) for u in (0.9, 0.95, 0.98, 0.99)]
    assert not any(c.pqueue.saturated or c.dside.saturated for c in tight)
    shares = [c.dside.prefill_share for c in tight]
    assert shares[-1] > 0.0 and shares == sorted(shares)
    assert tight[-1].dside.tpot_mean_s > ev.dside(key, 4, 0, limit * 0.99).tpot_mean_s


# ------------------------------------------------------------------------------------------------ search


def test_long_prompt_rag_at_a_tight_ttft_disaggregates_with_more_prefill() -> None:
    r = search(load_profile(RAG))
    w = r.winner
    assert w is not None and w.mode in ("disaggregated", "conditional") and w.prefill is not None
    assert w.prefill.gpus > w.decode.gpus
    assert w.remote_share > 0.5
    assert w.ttft_p95_ms <= 2600 and w.tpot_p95_ms <= 35
    # aggregated serving cannot hold the TPOT target: local 10k-token prefills stall the decode batch
    agg = r.best_of("aggregated")
    assert agg is not None and not agg.feasible and any("TPOT" in x for x in agg.reasons)


def test_short_prompt_chat_stays_aggregated_or_keeps_a_small_prefill_pool() -> None:
    r = search(parse_profile(base()))
    w = r.winner
    assert w is not None
    assert w.mode == "aggregated" or (w.prefill is not None and w.prefill.gpus < w.decode.gpus)


def test_tight_ttft_on_long_prompts_moves_gpus_to_prefill() -> None:
    long = base()
    long["traffic"]["inputTokens"] = {"histogram": [{"tokens": 8000, "share": 1}]}
    long["traffic"]["outputTokens"] = {"mean": 200, "p95": 400}
    long["traffic"]["rate"] = {"meanRps": 6, "peakRps": 8}
    long["slo"] = {"ttftP95Ms": 1200, "tpotP95Ms": 10, "goodputTarget": 0.95}
    r = search(parse_profile(long))
    w = r.winner
    assert w is not None and w.mode == "disaggregated" and w.prefill is not None
    assert w.prefill.gpus > w.decode.gpus
    agg = r.best_of("aggregated")
    assert agg is not None and (not agg.feasible or agg.cost_per_hour > w.cost_per_hour)


def test_more_traffic_needs_no_fewer_gpus_and_prefix_hits_need_no_more() -> None:
    lo = search(parse_profile(base())).winner
    busy = base()
    busy["traffic"]["rate"] = {"meanRps": 60, "peakRps": 90}
    hi = search(parse_profile(busy)).winner
    cached = base()
    cached["traffic"]["prefixCacheHitShare"] = 0.8
    hit = search(parse_profile(cached)).winner
    assert lo is not None and hi is not None and hit is not None
    assert hi.cost_per_hour > lo.cost_per_hour
    assert hit.cost_per_hour <= lo.cost_per_hour


def test_impossible_slo_is_an_answer_with_the_closest_candidates() -> None:
    doc = base()
    doc["slo"]["tpotP95Ms"] = 1  # below one decode step of an 8B model, even at TP8
    r = search(parse_profile(doc))
    assert r.winner is None and r.ranked
    assert all(not c.feasible for c in r.ranked)
    text = render(r)
    assert "No feasible plan within 16 GPUs" in text and "closest candidates:" in text
    # the closest candidate is listed first: the one whose TPOT needs the SLO relaxed least (a wide-TP decode; with
    # ring all-reduce costs TP4 and TP8 come within a few percent of each other for an 8B model)
    best = r.ranked[0]
    assert best.label() in text and best.decode.tp >= 4
    assert best.tpot_p95_ms == min(c.tpot_p95_ms for c in r.ranked if not math.isnan(c.tpot_p95_ms))
    assert f"TPOT target of {math.ceil(best.tpot_p95_ms)} ms" in text


def test_a_model_no_gpu_can_hold_is_explained() -> None:
    doc = base(model={"preset": "Llama-3.1-70B"}, gpus=[{"type": "L40S", "count": 2}])
    r = search(parse_profile(doc))
    assert r.winner is None and not r.ranked
    assert "leave no KV cache" in render(r)


def test_moe_config_plans_like_its_preset() -> None:
    q = get_model("Qwen3-30B-A3B")
    cfg = {"layers": q.layers, "hidden": q.hidden, "heads": q.heads, "kvHeads": q.kv_heads, "headDim": q.head_dim,
           "vocab": q.vocab, "numExperts": q.num_experts, "expertsPerToken": q.experts_per_token,
           "moeIntermediate": q.moe_intermediate, "maxPosition": q.max_position}
    by_cfg = search(parse_profile(base(model={"config": cfg, "name": "Qwen/Qwen3-30B-A3B"}))).winner
    by_preset = search(parse_profile(base(model={"preset": "Qwen3-30B-A3B"}))).winner
    assert by_cfg is not None and by_preset is not None
    assert by_cfg.label() == by_preset.label()
    assert by_cfg.goodput == pytest.approx(by_preset.goodput)


def test_search_over_three_gpu_types_covers_every_type_and_mode() -> None:
    # how long it takes is a figure, not a test: `disagg plan` prints it ("searched N candidates in X s")
    gpus = {"H100-SXM", "H200", "A100-80GB"}
    doc = base(gpus=[{"type": "H100-SXM", "count": 16}, {"type": "H200", "count": 16, "cost": 1.3},
                     {"type": "A100-80GB", "count": 16, "cost": 0.6}])
    doc["traffic"]["inputTokens"] = {"mean": 3000, "p95": 9000}
    r = search(parse_profile(doc))
    assert r.evaluated > 1000 and not r.skipped
    assert {c.decode.gpu for c in r.ranked} == gpus
    assert {c.prefill.gpu for c in r.ranked if c.prefill is not None} == gpus
    assert {c.mode for c in r.ranked} == {"aggregated", "disaggregated", "conditional"}


# ---------------------------------------------------------------------------------------------- emitted spec


@pytest.mark.parametrize("path", [CHAT, RAG])
def test_every_emitted_spec_validates(path: Path) -> None:
    r = search(load_profile(path))
    shown = list(r.ranked[:6])
    modes: tuple[Mode, ...] = ("aggregated", "disaggregated", "conditional")
    shown += [c for m in modes if (c := r.best_of(m)) is not None and c not in shown]
    assert {c.mode for c in shown} == {"aggregated", "disaggregated", "conditional"}
    for c in shown:
        doc = to_model(r, c)
        assert errors_of(copy.deepcopy(doc)) == [], c.label()
        b = bounds(r.profile, c)
        spec = doc["spec"]
        assert spec["decode"]["minReplicas"] <= spec["decode"]["replicas"] <= spec["decode"]["maxReplicas"]
        assert spec["autoscaling"]["gpuBudget"] >= c.gpus
        if c.prefill is None:
            assert spec["mode"] == "Aggregated" and spec["prefill"]["replicas"] == 0
            assert "routing" not in spec
        else:
            assert spec["mode"] == "Auto"
            rp, lp = spec["routing"]["remotePrefill"], spec["routing"]["localPrefill"]
            assert rp["minInputTokens"] == max(1, c.threshold or 0)
            assert lp["maxInputTokens"] == rp["minInputTokens"] - 1
            assert b.ratio is not None
            lo, hi = spec["autoscaling"]["prefillDecodeRatio"]["min"], spec["autoscaling"]["prefillDecodeRatio"]["max"]
            assert lo <= c.prefill.replicas / c.decode.replicas <= hi
            assert spec["prefill"]["parallelism"]["tensor"] == c.prefill.tp == spec["prefill"]["gpu"]["count"]


def test_prometheus_url_turns_autoscaling_on() -> None:
    r = search(parse_profile(base(prometheusUrl="http://prometheus:9090")))
    assert r.winner is not None
    auto = to_model(r, r.winner)["spec"]["autoscaling"]
    assert auto["enabled"] is True and auto["prometheus"] == {"url": "http://prometheus:9090"}
    assert errors_of(to_model(r, r.winner)) == []


def test_min_replicas_come_from_the_mean_rate() -> None:
    doc = base()
    doc["traffic"]["rate"] = {"meanRps": 20, "peakRps": 150}
    r = search(parse_profile(doc))
    assert r.winner is not None
    b = bounds(r.profile, r.winner)
    assert b.decode[0] + b.prefill[0] < b.decode[1] + b.prefill[1]
    assert b.decode[2] >= b.decode[1]


# ---------------------------------------------------------------------------------------------- command line


def test_cli_writes_a_valid_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rag.yaml"
    assert main(["plan", str(RAG), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "why: " in text and "binds" in text and f"wrote {out}" in text
    assert [errs for _, errs in validate_documents(out)] == [[]]
    assert yaml.safe_load(out.read_text())["metadata"]["name"] == "rag-70b"


def test_cli_no_plan_exits_1_and_bad_profile_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = base()
    doc["slo"]["ttftP95Ms"] = 1
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(f), "--out", str(tmp_path / "m.yaml")]) == 1
    assert "No feasible plan" in capsys.readouterr().out
    assert not (tmp_path / "m.yaml").exists()
    del doc["gpus"]
    f.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(f)]) == 2
    assert f"{f}: gpus: Field required: list GPU types on offer" in capsys.readouterr().err


def test_percentiles_are_consistent_with_the_shares() -> None:
    r = search(load_profile(CHAT))
    w = r.winner
    assert w is not None
    assert w.ttft_share >= 0.95 and w.ttft_p95_ms <= r.profile.slo.ttft_p95_ms
    assert w.tpot_share >= 0.95 and w.tpot_p95_ms <= r.profile.slo.tpot_p95_ms
    assert math.isfinite(w.xfer_p95_ms) == (w.prefill is not None)
    wl = r.workload
    assert w.cost_per_mtok == pytest.approx(w.cost_per_hour / (wl.peak_rps * wl.mean_out * 3600) * 1e6)


def test_cli_out_dash_prints_the_spec(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(CHAT), "--out", "-"]) == 0
    text = capsys.readouterr().out
    spec_text = text[text.index("# generated by `disagg plan"):]
    doc = yaml.safe_load(spec_text)
    assert doc["kind"] == "DisaggregatedModel" and errors_of(doc) == []
    assert doc["spec"]["autoscaling"]["enabled"] is True


def test_many_bins_are_merged_keeping_the_mean() -> None:
    hist = [{"tokens": 100 * (k + 1), "share": 1 + k % 3} for k in range(64)]
    doc = base()
    doc["traffic"]["inputTokens"] = {"histogram": hist}
    wl = build_workload(parse_profile(doc))
    mean = sum(h["tokens"] * h["share"] for h in hist) / sum(h["share"] for h in hist)
    assert len(wl.in_tokens) <= 10
    assert sum(t * w for t, w in zip(wl.in_tokens, wl.in_weight, strict=True)) == pytest.approx(mean)
    assert sum(wl.in_weight) == pytest.approx(1.0)
