"""``disagg bench decision``: the routing decision's cost per policy at 64 workers. The figures are the
benchmark's business; the tests check what it measures (the fleet, both policies, loads that make the SLO placement
overrule the ladder) and the results document."""

from __future__ import annotations

from pathlib import Path

from disagg import results
from disagg.bench import decision


def test_snapshots_span_idle_to_busy_on_a_64_worker_fleet() -> None:
    snaps = decision.snapshots(5, seed=1)
    assert all(len(s.prefill) == 16 and len(s.decode) == 48 for s in snaps)
    assert sum(w.running for w in snaps[0].decode) < sum(w.running for w in snaps[-1].decode)
    assert decision.snapshots(5, seed=1) == snaps  # seeded


def test_the_document_has_both_policies_and_the_target(tmp_path: Path) -> None:
    out = tmp_path / "decision.json"
    doc = decision.run(n_snapshots=12, rounds=1, out=out)
    assert results.validate(doc, "decision") == [] and out.exists()
    rows = {r["policy"]: r for r in doc["results"]["rows"]}
    assert set(rows) == {"Thresholds", "SLO"}
    assert all(r["calls"] == 12 * len(decision.PROMPTS) for r in rows.values())
    # the loads are ones where the SLO placement overrules the ladder (else it would measure nothing but the ladder)
    assert any(k.split(":")[1].startswith("slo_") for k in rows["SLO"]["decisions"])
    assert not any(k.split(":")[1].startswith("slo_") for k in rows["Thresholds"]["decisions"])
    t = doc["results"]["target"]
    assert t["extra_p50_us"] == round(rows["SLO"]["p50_us"] - rows["Thresholds"]["p50_us"], 1)
    table = decision.render_tables(doc)["cost"]
    assert "| SLO |" in table and "| Thresholds |" in table
    assert table.endswith("met.") if t["met"] else table.endswith("**missed**.")
