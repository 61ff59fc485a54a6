"""The planner's accuracy benchmark (disagg.bench.plan_accuracy): its committed results and the tables
docs/planning.md shows from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disagg import results
from disagg.bench import docs
from disagg.bench.plan_accuracy import (
    ARRIVALS,
    HELD_OUT,
    arrival_times,
    bursty_profile,
    gamma_times,
    mmpp_times,
    near,
    render_tables,
)
from disagg.plan.profile import parse_profile

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs/results/plan.json"
PLAN = docs.Benchmark("plan", "disagg.bench.plan_accuracy", "make bench-plan")


def test_held_out_mixes_are_valid_profiles_and_not_the_examples() -> None:
    examples = {p.name for p in (ROOT / "docs/examples/profiles").glob("*.yaml")}
    assert examples and len(HELD_OUT) >= 3
    for name, data in HELD_OUT.items():
        p = parse_profile(data)
        assert p.name not in {"chat-8b", "rag-70b"}, name


def test_sweep_thresholds_are_the_picks_and_its_neighbours() -> None:
    assert near([256, 512, 1024, 2048, 4096], 2048) == [1024, 2048, 4096]
    assert near([256, 512, 1024, 2048, 4096], 4096) == [1024, 2048, 4096]
    assert near([256, 512, 1024, 2048, 4096], None) == [512, 1024, 2048]
    assert near([512, 1024], 512) == [512, 1024]


def test_committed_results_render_and_every_mix_is_reported() -> None:
    doc = json.loads(RESULTS.read_text())
    assert results.validate(doc, "plan") == []
    res = doc["results"]
    assert {m["mix"] for m in res["mixes"]} == set(HELD_OUT)
    tables = render_tables(doc)
    assert set(tables) == {"accuracy", "pick", "bursty"}
    for m in res["mixes"]:
        assert m["mix"] in tables["accuracy"] and m["mix"] in tables["pick"]
        # the verdicts follow from the numbers
        err = (m["pick"]["predicted"] - m["pick"]["twin"]) / m["pick"]["twin"]
        assert abs(err - m["accuracy"]["error"]) < 1e-3
        assert m["accuracy"]["ok"] == (abs(m["accuracy"]["error"]) <= res["accuracy_tolerance"])
        if m["mix"] not in ARRIVALS:  # a bursty mix's sweep may stop below the pick's GPUs (it walks down)
            assert m["pick"]["config"] in {r["config"] for r in m["sweep"]}
        if m["mix"] in ARRIVALS:
            assert m["mix"] in tables["bursty"]
            # a bursty mix's verdicts follow from its windows: the worst is the lowest within the declared peak
            judged = [w["attainment"] for w in m["pick"]["twin_windows"] if w["rps"] <= m["peak_rps"] * (1 + 1e-9)]
            assert m["pick"]["twin_worst_window"] == (min(judged) if judged else None)
            best = m["best"]
            assert m["gpu_gap"] == (None if best is None else m["pick"]["gpus"] - best["gpus"])
            assert all(r["twin_feasible"] is False or r["cost_per_hour"] >= best["cost_per_hour"]
                       for r in m["sweep"])

def test_planning_md_shows_what_the_results_render() -> None:
    """The generated blocks in docs/planning.md equal what the committed results render (python -m
    disagg.bench.docs with the plan benchmark registered)."""
    registry = {**docs.REGISTRY, "plan": PLAN}
    rel = Path("docs/planning.md")
    text = (ROOT / rel).read_text()
    blocks, errors = docs.find_blocks(text, rel)
    assert not errors
    mine = [b for b in blocks if b.bench == "plan"]
    assert {b.table for b in mine} == {"accuracy", "pick", "bursty"}
    rend = docs.Renderer(ROOT, registry)
    rep = docs.Report()
    for b in mine:
        want, _ = docs.expected_body(rend, registry, b, rep, set())
        assert not rep.errors, rep.errors
        assert text[b.start:b.end] == want, f"{b.where} is stale: run python -m disagg.bench.docs"


def test_bursty_arrival_processes_are_seeded_and_have_their_mean_rate() -> None:
    assert set(ARRIVALS) <= set(HELD_OUT) and len(ARRIVALS) >= 2
    for name in ARRIVALS:
        a, b = arrival_times(name, 600.0, seed=0), arrival_times(name, 600.0, seed=0)
        assert a == b and a == sorted(a) and a != arrival_times(name, 600.0, seed=1)
    g = gamma_times(5.0, 3.0, 4000.0, seed=0)
    assert len(g) / 4000.0 == pytest.approx(5.0, rel=0.1)
    m = mmpp_times(8.0, 60.0, 15.0, 1.0, 4000.0, seed=0)
    assert len(m) / 4000.0 == pytest.approx((8 * 15 + 60 * 1) / 16, rel=0.15)


def test_a_bursty_mix_is_profiled_as_from_its_log() -> None:
    name = next(iter(ARRIVALS))
    times = arrival_times(name, 240.0, seed=0)
    bursty, smooth = bursty_profile(HELD_OUT[name], times)
    pb, ps = parse_profile(bursty), parse_profile(smooth)
    assert pb.traffic.rate == ps.traffic.rate
    assert pb.traffic.rate.mean_rps == pytest.approx((len(times) - 1) / (times[-1] - times[0]), rel=1e-3)
    assert ps.traffic.burstiness.interarrival_cv == 1.0 and ps.traffic.burstiness.peak_rps_10s is None
    assert pb.traffic.burstiness.peak_rps_10s is not None
    assert pb.traffic.burstiness.peak_rps_10s > pb.traffic.rate.peak
