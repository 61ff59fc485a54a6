"""docs/reference.md is what the code generates (disagg.bench.reference), and the generator reads what it claims:
every chart value, every metric family, every condition, Event and routing reason the code writes."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.paths import REPO

from disagg.bench import code_literals as lit
from disagg.bench import reference as ref
from disagg.controller.status import OWNED_CONDITIONS
from disagg.router.core import REMOTE_PATH_CAUSES
from disagg.router.metrics import RouterMetrics
from disagg.router.policy import LADDER_REASONS
from disagg.router.probe import PROBE_REASON
from disagg.vllm_versions import DEFAULT_VERSION, OLDEST_CHECKED, fmt

REFERENCE = REPO / "docs" / "reference.md"


def test_reference_is_what_the_code_generates() -> None:
    assert REFERENCE.read_text() == ref.render(REPO), (
        "docs/reference.md differs from the code: run `.venv/bin/python -m disagg.bench.reference` (make docs)")


def test_install_md_compatibility_matrix_is_generated_from_the_pins() -> None:
    text = (REPO / "docs" / "install.md").read_text()
    assert ref.with_matrix(text, ref.compatibility(REPO)) == text, (
        "docs/install.md's compatibility matrix differs from the pins: run "
        "`.venv/bin/python -m disagg.bench.reference`")
    block = text.split(ref.MATRIX_BEGIN, 1)[1].split(ref.MATRIX_END, 1)[0]
    assert f"{fmt(OLDEST_CHECKED)} to {fmt(DEFAULT_VERSION)}" in block
    assert "≥ 1.5.0 with vLLM ≥ 0.33.0" in block and "NIXL 1.5.2" in block
    for fact in ref.vllm_facts():  # every version-dependent fact of the one version table has a row
        assert f"| `{fact.what}` |" in block, fact.what
    with pytest.raises(ValueError, match="markers"):
        ref.with_matrix("no markers here", "x")


def test_check_mode_fails_on_a_stale_file_and_passes_on_a_fresh_one(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "docs").mkdir()
    shutil.copytree(REPO / "charts" / "disagg-operator", tmp_path / "charts" / "disagg-operator")
    (tmp_path / "docs" / "reference.md").write_text("# Reference\n\nwritten by hand\n")
    assert ref.main(["--check", "--root", str(tmp_path)]) == 1
    assert "stale" in capsys.readouterr().err
    assert ref.main(["--root", str(tmp_path)]) == 0
    assert ref.main(["--check", "--root", str(tmp_path)]) == 0


def test_the_docs_link_the_reference() -> None:
    for doc in (REPO / "README.md", REPO / "docs" / "install.md"):
        assert "reference.md" in doc.read_text(), f"{doc.name} does not link docs/reference.md"


# ------------------------------------------------------------------------------------------------ helm values


def _leaves(node: Any, path: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [leaf for k, v in node.items() for leaf in _leaves(v, f"{path}.{k}" if path else k)]
    return [path]


def test_every_value_in_values_yaml_has_a_row() -> None:
    values = yaml.safe_load((REPO / "charts" / "disagg-operator" / "values.yaml").read_text())
    rows = {r[0].strip("`") for r in ref.helm_values(REPO)}
    # an object the schema leaves open (resources, labels, securityContext) is one row with its default
    missing = [leaf for leaf in _leaves(values) if not any(leaf == r or leaf.startswith(r + ".") for r in rows)]
    assert missing == []


def test_value_comments_follow_the_helm_docs_convention() -> None:
    text = "a:\n  # -- first line\n  # second, with a --flag\n  b: 1\n  c: 2\n# -- top\nd: {}\n"
    assert ref.value_comments(text) == {"a.b": "first line second, with a --flag", "d": "top"}


# ------------------------------------------------------------------------------------------------ metrics


def test_every_router_family_is_listed_with_its_labels() -> None:
    listed = {f.name: f for f in ref.router_families()}
    m = RouterMetrics()
    exposed = {fam.name for fam in m.registry.collect()}
    assert {n.removesuffix("_total") for n in listed} == exposed
    assert listed["disagg_routing_decisions_total"].labels == ("decision", "reason")
    assert listed["disagg_first_token_emit_seconds"].kind == "histogram"


def test_operator_and_sim_families() -> None:
    op = {f.name for f in ref.operator_families()}
    assert {"disagg_operator_reconciles_total", "disagg_operator_scale_decisions_total",
            "disagg_operator_active_mode"} <= op
    sim = {f.name: rel for f, rel in ref.sim_families()}
    assert sim["vllm:time_per_output_token_seconds"] == "< 0.12.0"  # gone from 0.12.0 (vllm_versions.METRICS)
    assert sim["vllm:num_requests_waiting_by_reason"] == "≥ 0.20.0"
    assert "vllm:nixl_xfer_time_seconds" in sim


# ------------------------------------------------------------------------------------------------ reasons


def _operator_md_conditions() -> dict[str, set[str]]:
    """The conditions table of docs/operator.md: type → the reasons it names."""
    text = (REPO / "docs" / "operator.md").read_text()
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        m = re.match(r"\| `(\w+)` \| .* \| (.*) \|$", line)
        if m:
            out[m[1]] = set(re.findall(r"`(\w+)`", m[2]))
    return out


def test_the_walker_finds_every_condition_and_reason_operator_md_names() -> None:
    found = lit.conditions()
    assert set(OWNED_CONDITIONS) <= found.keys()
    assert {"SLOMet", "FallbackActive", "MetricsAvailable", "KVTransferHealthy"} <= found.keys()
    documented = _operator_md_conditions()
    assert {"PrefillReady", "Ready", "PodSecurity"} <= documented.keys()
    for ctype, reasons in documented.items():
        written = set(found[ctype])
        # Ready's pool reasons are computed: "…Starting", "…NotReady" stand for Prefill/Decode/Router + the suffix
        written |= {pool + r[1:] for r in written if r.startswith(lit.UNRESOLVED)
                    for pool in ("Prefill", "Decode", "Router")}
        # the prose names a ReplicaSet's Event (FailedCreate) and spec fields beside the reasons
        reasons = reasons - {"FailedCreate", "Aggregated"} - {c for c in reasons if c[0].islower()}
        assert reasons <= written or ctype in ("DecodeReady", "RouterReady"), (ctype, reasons - written)
    assert found["KVTransferHealthy"]["TransferFailures"] == {"False"}
    assert found["MetricsAvailable"].keys() >= {"PrometheusUnavailable", "NoScrapeTargets"}


def test_events_carry_their_reasons_and_types() -> None:
    ev = lit.events()
    assert ev["InvalidSpec"] == {"Warning"} and ev["ApplyFailed"] == {"Warning"}  # through invalid(reason=…)
    assert ev["Scaled"] == {"Normal"} and ev["ReplicasConflict"] == {"Warning"}
    assert {"Ready", "Starting", "NotReady", "GroupRestarted", "OperatorUpgradeRollout"} <= ev.keys()
    assert not [r for r in ev if lit.UNRESOLVED in r]


def test_decisions_cover_the_ladder_the_probes_and_the_slo_placements() -> None:
    d = lit.decisions()
    assert d.keys() >= LADDER_REASONS
    assert PROBE_REASON in d
    assert {"slo_local", "slo_remote", "slo_prefill_worker", "no_decode_worker", "tenant_always"} <= d.keys()
    assert d["no_decode_worker"] == {"reject"} and d["prefill_queue_overload"] == {"local", "reject"}
    assert not [r for r in d if lit.UNRESOLVED in r]
    text = REFERENCE.read_text()
    for cause in REMOTE_PATH_CAUSES:
        assert f"| `{cause}` |" in text
