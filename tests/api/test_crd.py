"""The committed CRD is what the models generate, and it is a well-formed structural schema."""

from __future__ import annotations

from typing import Any

import yaml
from tests.api.schema import crd_schema, schema_nodes
from tests.paths import REPO

from disagg.api.crd import build_crd, render_crd_yaml
from disagg.api.rules import RULES
from disagg.cli import main

CRD_PATH = REPO / "crds" / "disaggregatedmodels.yaml"


def test_committed_crd_matches_models() -> None:
    assert CRD_PATH.read_text() == render_crd_yaml(), "crds/ drifted from the API models: run `make crds`"


def test_crds_check_flag_detects_drift(tmp_path) -> None:
    stale = tmp_path / "crd.yaml"
    stale.write_text(render_crd_yaml().replace("maxReplicas", "maxReplica"))
    assert main(["crds", "--out", str(stale), "--check"]) == 1
    assert main(["crds", "--out", str(stale)]) == 0
    assert main(["crds", "--out", str(stale), "--check"]) == 0


def test_every_spec_and_status_field_is_described() -> None:
    root = crd_schema()["properties"]
    missing = [p for part in ("spec", "status") for p, node in schema_nodes(root[part], part)
               if not node.get("description") and not p.endswith(("[]", "{}"))]
    assert not missing, f"fields without a description (kubectl explain shows nothing): {missing}"


def test_schema_is_structural() -> None:
    for path, node in schema_nodes(crd_schema(), ""):
        assert "$ref" not in node and "anyOf" not in node and "allOf" not in node, path
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields") or node.get(
            "x-kubernetes-int-or-string"), f"{path} has no type"
        if "properties" in node:
            assert "additionalProperties" not in node, path


def test_cel_rules_come_from_the_table() -> None:
    """Each CEL rule in the CRD is a row of disagg.api.rules.RULES (where: tests/api/test_rules.py)."""
    in_crd = [r for _, node in schema_nodes(crd_schema(), "") for r in node.get("x-kubernetes-validations", [])]
    table = [r.validation() for r in RULES]
    assert all(r in table for r in in_crd), [r for r in in_crd if r not in table]
    assert all(r in in_crd for r in table), [r for r in table if r not in in_crd]


def test_printer_columns() -> None:
    version = build_crd()["spec"]["versions"][0]
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names == ["Mode", "Ready", "Prefill", "Decode", "TTFT-P95", "TPOT-P95", "Goodput", "Reason", "Spec-Mode",
                     "Transport", "Prefill-Scaled", "Decode-Scaled", "Age"]
    wide = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority", 0) > 0]
    assert wide == ["Reason", "Spec-Mode", "Transport", "Prefill-Scaled", "Decode-Scaled"]
    assert version["subresources"] == {"status": {}}
    root = crd_schema()
    for col in version["additionalPrinterColumns"][:-1]:  # every path exists in the schema, with a printable type
        path = col["jsonPath"].lstrip(".")
        if path.startswith("status.conditions["):
            continue  # a condition's status/reason (Condition's fields are strings)
        node: dict[str, Any] = root
        for part in path.split("."):
            node = node["properties"][part]
        assert node["type"] in ("string", "number", "integer"), col


def test_crd_yaml_parses() -> None:
    doc = yaml.safe_load(CRD_PATH.read_text())
    assert doc["spec"]["names"]["shortNames"] == ["dm"]
    assert doc["spec"]["group"] == "serving.disagg.dev"
