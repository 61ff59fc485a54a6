"""docs/install.md against the code: the RBAC table is the rendered chart's, the migration waits for columns and
conditions that exist, and the migration's model can download a gated model."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from tests.docs import rbac_table
from tests.paths import REPO

from disagg.api.crd import build_crd

INSTALL = REPO / "docs" / "install.md"


def _section(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


# ------------------------------------------------------------------------------------------------------- RBAC


def test_rbac_table_is_the_rendered_charts() -> None:
    """The table between the rbac-table markers is what tests/docs/rbac_table.py generates from the chart's rendered
    ClusterRole/Role (both watch scopes); regenerate with `python -m tests.docs.rbac_table`."""
    documented = rbac_table.documented(INSTALL.read_text())
    assert documented == rbac_table.table(), (
        "docs/install.md's RBAC table differs from the rendered chart: run `.venv/bin/python -m tests.docs.rbac_table`")


def test_rbac_table_has_a_row_for_every_rule_of_either_scope() -> None:
    rows = [line for line in rbac_table.table().splitlines()[2:] if line.startswith("| ")]
    rules = rbac_table.granted()
    assert len(rows) == len(rules)
    for (_, resources, verbs), row in zip(rules, rows, strict=True):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[0].startswith(", ".join(f"`{r}`" for r in resources)) and cells[1] == " ".join(verbs), row
    granted = {(r, v) for (_, resources, verbs) in rules for r in resources for v in verbs}
    assert ("pods", "delete") in granted  # the old table's "cannot delete pods" was wrong: the chart grants it
    assert {("statefulsets", "create"), ("leaderworkersets", "create"), ("deployments/scale", "patch"),
            ("namespaces", "get"), ("disaggregatedmodels/finalizers", "update")} <= granted


# What the prose below the table says the operator cannot do, each checked against every rendered rule.
def _verbs(rules: dict[rbac_table.Rule, list[str]], resource: str) -> set[str]:
    return {v for (_, resources, verbs) in rules for r in resources if r == resource for v in verbs}


CANNOT: dict[str, Any] = {
    # patch: the deletion-cost annotation before a scale-down (the prose says so); never create or update
    "creates no pods": lambda rules: not _verbs(rules, "pods") & {"create", "update", "*"},
    "cannot list or watch Secrets": lambda rules: _verbs(rules, "secrets") <= {"get"},
    "cannot touch cluster roles or nodes": lambda rules: not any(
        _verbs(rules, r) for r in ("clusterroles", "clusterrolebindings", "nodes", "*")),
    "cannot create or delete DisaggregatedModels":
        lambda rules: not _verbs(rules, "disaggregatedmodels") & {"create", "delete", "deletecollection", "*"},
}


@pytest.mark.parametrize("claim", list(CANNOT))
def test_what_the_operator_cannot_do_holds(claim: str) -> None:
    prose = " ".join(_section(INSTALL.read_text(), "## RBAC").split(rbac_table.END, 1)[1].split())
    assert claim in prose, f"install.md's RBAC section no longer says {claim!r}: update CANNOT"
    for values in rbac_table.SCOPES.values():
        rules: dict[rbac_table.Rule, list[str]] = {rule: [] for rule in rbac_table.operator_rules(values)}
        assert CANNOT[claim](rules), f"{claim!r} is false for the chart rendered with {values}"


def test_the_rbac_generator_fails_on_a_rule_without_a_why(monkeypatch: pytest.MonkeyPatch) -> None:
    granted = rbac_table.granted()
    extra: rbac_table.Rule = (("",), ("nodes",), ("get",))
    monkeypatch.setattr(rbac_table, "granted", lambda: {**granted, extra: ["cluster"]})
    with pytest.raises(KeyError, match="nodes"):
        rbac_table.table()


# ---------------------------------------------------------------------------------------------- the migration

MIGRATION = "## 7. Migrate an existing aggregated vLLM Deployment with zero downtime"


def _printer_columns() -> set[str]:
    cols = build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    return {"NAME"} | {c["name"].upper() for c in cols}


def _conditions() -> set[str]:
    """Every condition type the operator or its autoscaler writes."""
    from disagg.controller import status

    autoscaler = (REPO / "operator" / "disagg" / "controller" / "autoscaler.py").read_text()
    written = set(re.findall(r"\(\"([A-Z]\w+)\", r\.\w+\)|condition\(\"([A-Z]\w+)\"", autoscaler))
    return set(status.OWNED_CONDITIONS) | {"KVTransferHealthy"} | {a or b for a, b in written}


def test_the_migration_waits_for_what_exists() -> None:
    """A `kubectl get dm -w  # wait: …` comment names printer columns only (upper case; `kubectl get dm` prints no
    condition but Ready, as READY), `--for=condition=X` and "Wait for `X`" name conditions the operator writes, and
    `.status.…` paths are fields of the status schema (the old text waited in `kubectl get dm -w` for RouterReady
    and "the aggregated pool", which it never prints)."""
    section = _section(INSTALL.read_text(), MIGRATION)
    columns, conditions = _printer_columns(), _conditions()
    assert {"RouterReady", "SLOMet", "FallbackActive", "PrefillReady", "DecodeReady"} <= conditions
    waits = re.findall(r"kubectl get dm .*-w\s+# wait: (.*)", section)
    assert waits
    for wait in waits:
        wait = re.sub(r"\([^)]*\)", "", wait)
        for word in re.findall(r"\b[A-Z][A-Z0-9-]+\b", wait):
            assert word in columns, f"install.md waits for a column {word} that `kubectl get dm` does not print"
        for word in re.findall(r"\b[A-Z][a-z]+(?:[A-Z][a-z]+)+\b", wait):  # `kubectl get dm` prints no condition
            assert word not in conditions, f"install.md waits for {word} in `kubectl get dm`: a condition, not a column"
    named = re.findall(r"--for=condition=(\w+)", section) + re.findall(r"Wait for `(\w+)`", section)
    named += re.findall(r"and `(\w+Ready)`", section)
    assert "RouterReady" in named
    for cond in named:
        assert cond in conditions, f"install.md waits for condition {cond}, which nothing writes"
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    paths = re.findall(r"\{\.status\.([\w.]+)\}", section) + re.findall(r"`status\.([\w.]+)`", section)
    assert "pools.aggregated.summary" in paths
    for path in paths:
        node = schema["properties"]["status"]
        for part in path.split("."):
            node = node.get("properties", {}).get(part)
            assert node is not None, f"status.{path} (install.md) is not a status field"


def _migration_model() -> dict[str, Any]:
    section = _section(INSTALL.read_text(), MIGRATION)
    block = re.findall(r"```yaml\n(.*?)```", section, re.S)[0]
    doc: dict[str, Any] = yaml.safe_load(block)
    assert doc["kind"] == "DisaggregatedModel" and doc["spec"]["mode"] == "Aggregated"
    return doc


def test_ready_does_not_wait_for_the_aggregated_pool_and_the_router_uses_decode_meanwhile() -> None:
    """What the migration says happens before the aggregated pool is ready: Ready is True on the decode worker and
    the router, and the router serves on the decode worker, reason mode_aggregated."""
    from disagg.builders import parse_model
    from disagg.builders.router import router_config
    from disagg.controller.status import desired_status
    from disagg.router.policy import decide
    from disagg.router.policy_types import LoadSnapshot, RequestFeatures, WorkerLoad

    body = _migration_model()
    dm = parse_model(body)
    ready = {"spec": {"replicas": 1}, "status": {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}}
    starting = {"spec": {"replicas": 4}, "status": {"replicas": 4, "readyReplicas": 0, "updatedReplicas": 4}}
    status = desired_status(dm, {}, {"decode": ready, "router": ready, "aggregated": starting, "prefill": None}, 1)
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Ready"]["status"] == "True" and conds["RouterReady"]["status"] == "True"
    assert status["pools"]["aggregated"]["summary"] == "0/4"
    section = " ".join(_section(INSTALL.read_text(), MIGRATION).split())
    assert "`READY` does not wait for the aggregated pool" in section

    cfg = router_config(dm)
    decode = WorkerLoad("http://decode-0", role="decode")
    decision = decide(cfg, RequestFeatures(request_id="r", endpoint="/v1/completions", input_tokens=4000),
                      LoadSnapshot(decode=(decode,)))
    assert (decision.decision, decision.reason, decision.decode) == ("local", "mode_aggregated", decode.url)
    assert "the router serves every request on the decode worker instead, with the same `X-Disagg-Reason: " \
           "mode_aggregated`" in section


GATED = ("meta-llama/",)  # hub organisations whose models need an accepted licence and a token


def test_install_models_of_gated_hub_models_name_a_token() -> None:
    """A DisaggregatedModel written out in install.md that downloads a gated model from the hub names
    source.hub.tokenSecretRef (the migration's once had none: its workers would fail with 401 on the download)."""
    blocks = re.findall(r"```yaml\n(.*?)```", INSTALL.read_text(), re.S)
    models = [d for b in blocks for d in yaml.safe_load_all(b) if isinstance(d, dict)
              and d.get("kind") == "DisaggregatedModel"]
    gated = [m for m in models if m["spec"]["model"]["name"].startswith(GATED)
             and not (m["spec"]["model"].get("source") or {}).get("pvc")]
    assert gated
    for m in gated:
        hub = (m["spec"]["model"].get("source") or {}).get("hub") or {}
        assert hub.get("tokenSecretRef"), f"{m['metadata']['name']}: a gated hub model without tokenSecretRef"
