from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg.api.models import DisaggregatedModel
from disagg.api.semantics import model_errors
from disagg.builders import parse_model

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = {p.stem: p for p in sorted((REPO / "docs" / "examples").glob("*.yaml"))}
GOLDEN = Path(__file__).parent / "golden"
UID = "00000000-0000-4000-8000-000000000001"


def example_body(name: str, namespace: str = "serving") -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(EXAMPLES[name].read_text())
    body["metadata"] = {**body["metadata"], "namespace": namespace, "uid": UID}
    return body


def model(name: str = "llama-8b-nvlink", **spec_patch: Any) -> DisaggregatedModel:
    """An example DisaggregatedModel with top-level spec keys replaced (camelCase, as in YAML)."""
    body = example_body(name)
    body["spec"].update(spec_patch)
    return parse_model(body)


def refused(dm: DisaggregatedModel, lws_installed: bool = False) -> str:
    """What the operator refuses ``dm`` for before building it (api/semantics.py ``model_errors``, joined as the
    reconciler reports them: Ready=False reason InvalidSpec); empty when the API admits it. The builders assume a
    model the API admits, so the checks of what they cannot render live there."""
    return "; ".join(model_errors(dm.metadata, dm.spec, lws_installed=lws_installed))


@pytest.fixture(params=sorted(EXAMPLES))
def example(request: pytest.FixtureRequest) -> str:
    return str(request.param)
