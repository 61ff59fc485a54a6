"""docs/operator.md against the code: how the router discovers workers, and which models carry a finalizer."""

from __future__ import annotations

import inspect
import re
from typing import Any
from unittest import mock

import kopf
from tests.paths import REPO

from disagg.controller.handlers import ControllerConfig, operator_settings, register

OPERATOR = REPO / "docs" / "operator.md"


def _text() -> str:
    return " ".join(OPERATOR.read_text().split())


def _section(heading: str) -> str:
    return " ".join(OPERATOR.read_text().split(heading, 1)[1].split("\n## ", 1)[0].split())


# -------------------------------------------------------------------------------------------------- discovery


def test_the_router_discovers_workers_by_watching_pods() -> None:
    """The router lists and watches Pods by the pool labels, not EndpointSlices; operator.md says so."""
    from disagg.router import discovery

    src = inspect.getsource(discovery.PodDiscovery)
    assert "list_namespaced_pod" in src and "label_selector" in src
    router_src = "\n".join(p.read_text() for p in (REPO / "operator" / "disagg" / "router").glob("*.py"))
    assert not re.search(r"DiscoveryV1Api|endpoint_slice", router_src), "the router reads EndpointSlices now"
    text = _text()
    assert not re.search(r"discover\w*[^.|]{0,40}(?:through|via|from|uses?) (?:the )?EndpointSlices", text), (
        "operator.md says the router discovers workers through EndpointSlices; it watches Pods")
    paragraph = text[text.index("In a cluster the router finds worker pods itself"):].split(". ", 3)
    assert "watches the Pods" in paragraph[0] and "Pods, not EndpointSlices" in " ".join(paragraph)


# -------------------------------------------------------------------------------------------------- finalizer


def _finalizer_handlers() -> list[Any]:
    registry = kopf.OperatorRegistry()
    register(registry, ControllerConfig(autoscaler=True), reconciler=mock.MagicMock())
    spawning = list(registry._spawning.get_all_handlers())  # kopf exposes no public listing
    changing = list(registry._changing.get_all_handlers())
    assert not [h for h in changing if h.requires_finalizer], "a changing handler (on.delete?) needs a finalizer now"
    return [h for h in spawning if h.requires_finalizer]


MODELS: dict[str, dict[str, Any]] = {
    "plain": {"spec": {}, "status": {}},
    "spec.autoscaling.prometheus": {"spec": {"autoscaling": {"prometheus": {"url": "http://p:9090"}}}, "status": {}},
    "RolloutPending=True": {"spec": {}, "status": {"conditions": [{"type": "RolloutPending", "status": "True"}]}},
    "RolloutPending=False": {"spec": {}, "status": {"conditions": [{"type": "RolloutPending", "status": "False"}]}},
}


def test_the_finalizer_paragraph_names_every_model_that_gets_one() -> None:
    """kopf puts its finalizer on a model while a daemon or timer matches it: the autoscaler daemon (a Prometheus)
    and the held-rollouts timer (RolloutPending=True). operator.md names both (it once named the daemon only)."""
    handlers = _finalizer_handlers()
    assert {h.id for h in handlers} == {"autoscaler", "held-rollouts"}
    finalized = {case for case, body in MODELS.items() if any(
        h.when is None or h.when(spec=body["spec"], status=body["status"], body=body) for h in handlers)}
    assert finalized == {"spec.autoscaling.prometheus", "RolloutPending=True"}
    section = _section("## Ownership and deletion")
    assert f"`{operator_settings().persistence.finalizer}`" in section
    for case in finalized:
        assert f"`{case}`" in section, f"operator.md does not say models with {case} carry the finalizer"
    for h in handlers:
        assert h.id in section, f"operator.md does not name the {h.id} handler that holds the finalizer"
    assert "Only models that run the autoscaler daemon" not in section
