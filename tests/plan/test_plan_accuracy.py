"""The planner's accuracy benchmark (disagg.bench.plan_accuracy): its committed results and the tables
docs/planning.md shows from them."""

from __future__ import annotations

import json
from pathlib import Path

from disagg import results
from disagg.bench import docs
from disagg.bench.plan_accuracy import HELD_OUT, near, render_tables
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
    assert set(tables) == {"accuracy", "pick"}
    for m in res["mixes"]:
        assert m["mix"] in tables["accuracy"] and m["mix"] in tables["pick"]
        # the verdicts follow from the numbers
        err = (m["pick"]["predicted"] - m["pick"]["twin"]) / m["pick"]["twin"]
        assert abs(err - m["accuracy"]["error"]) < 1e-3
        assert m["accuracy"]["ok"] == (abs(m["accuracy"]["error"]) <= res["accuracy_tolerance"])
        assert m["pick"]["config"] in {r["config"] for r in m["sweep"]}


def test_planning_md_shows_what_the_results_render() -> None:
    """The generated blocks in docs/planning.md equal what the committed results render (python -m
    disagg.bench.docs with the plan benchmark registered)."""
    registry = {**docs.REGISTRY, "plan": PLAN}
    rel = Path("docs/planning.md")
    text = (ROOT / rel).read_text()
    blocks, errors = docs.find_blocks(text, rel)
    assert not errors
    mine = [b for b in blocks if b.bench == "plan"]
    assert {b.table for b in mine} == {"accuracy", "pick"}
    rend = docs.Renderer(ROOT, registry)
    rep = docs.Report()
    for b in mine:
        want, _ = docs.expected_body(rend, registry, b, rep, set())
        assert not rep.errors, rep.errors
        assert text[b.start:b.end] == want, f"{b.where} is stale: run python -m disagg.bench.docs"
