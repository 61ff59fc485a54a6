"""The install/ops docs: the seed's production launch checklist is mapped item by item, and what the docs point
at exists."""

from __future__ import annotations

import re

import pytest
from tests.paths import REPO

DOCS = REPO / "docs"

# The seed document's "Production Launch Checklist", verbatim.
SEED_CHECKLIST = [
    "Input token length distribution has been collected.",
    "Output token length distribution has been collected.",
    "Business types (RAG, Chat, Agent, Batch) have been distinguished.",
    "p95/p99 SLOs for TTFT and TPOT have been defined.",
    "Conditions for remote vs. local Prefill have been defined.",
    "Prefix cache hit rate has been considered.",
    "Fallback strategy for Prefill Queue overload has been configured.",
    "Canary support by model, tenant, and endpoint is in place.",
    "KV packing, transfer, and unpacking times are being monitored.",
    "KV layout compatibility across different parallel configurations has been verified.",
    "Transfer timeouts and failure fallbacks have been set.",
    "Network bandwidth and cross-node topology have been evaluated.",
    "Prefill Pool and Decode Pool have been stress-tested independently.",
    "Prefill Queue growth under burst traffic has been verified.",
    "Maximum active sequence limit for the Decode Pool has been configured.",
    "SLO-based scaling rules have been established.",
    "TTFT, TPOT, and E2E latency percentile dashboards have been created.",
    "Each request's prefill/decode worker, routing decision, and transfer time are logged.",
    "Alerts are configured for: transfer timeouts, queue backlogs, TPOT jitter, and cache hit rate drops.",
    "One-click rollback to aggregated serving is supported.",
]


def test_checklist_maps_every_seed_item() -> None:
    rows = {}
    for line in (DOCS / "production-checklist.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 2:
            rows[cells[0]] = cells[1]
    for item in SEED_CHECKLIST:
        assert item in rows, f"seed checklist item not mapped: {item}"
        assert len(rows[item]) > 20, f"no mapping for: {item}"


def test_checklist_fields_exist_in_the_crd() -> None:
    """Every `spec.…` path the checklist names is a field of the CRD."""
    import yaml

    crd = yaml.safe_load((REPO / "crds" / "disaggregatedmodels.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    text = "\n".join((DOCS / name).read_text() for name in
                     ("production-checklist.md", "troubleshooting.md", "gitops.md", "observability.md"))
    paths = set(re.findall(r"(?<![\w./])spec\.([a-zA-Z][a-zA-Z0-9.]*[a-zA-Z0-9])", text))
    assert paths
    for path in sorted(paths):
        node = spec
        for part in path.split("."):
            if part in ("<pool>",):
                break
            node = node.get("properties", {}).get(part) or node.get("items", {}).get("properties", {}).get(part)
            assert node is not None, f"spec.{path} (in the docs) is not a CRD field"


@pytest.mark.parametrize("name", ["install.md", "gitops.md", "production-checklist.md", "troubleshooting.md",
                                  "observability.md"])
def test_relative_links_resolve(name: str) -> None:
    text = (DOCS / name).read_text()
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (DOCS / target).exists(), f"{name}: broken link {target}"
