"""Lint and render the chart with Helm's Go SDK (the ``helm-python-sdk`` wheel: ctypes over libhelm_c, Helm v4).

No helm binary, no cluster: ``helm_python.lint`` is ``helm lint`` and ``Chart.render`` is ``helm template``
(values are validated against values.schema.json as an install would).
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from tests.paths import REPO

CHART = REPO / "charts" / "disagg-operator"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
RELEASE = "disagg-operator"
NAMESPACE = "disagg-system"


def helm() -> ModuleType:
    import helm_python

    return helm_python


def load_values(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    return yaml.safe_load(path.read_text()) or {}


def render(values: dict[str, Any] | None = None, *, name: str = RELEASE,
           namespace: str = NAMESPACE) -> dict[str, str]:
    """Template path → rendered text (NOTES.txt included)."""
    h = helm()
    with h.Chart.load(CHART) as chart:
        rendered: dict[str, str] = chart.render(values or {}, name=name, namespace=namespace, is_install=True)
        return rendered


def documents(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object the templates render (NOTES.txt excluded), in template order."""
    out: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc["__template__"] = path
                out.append(doc)
    return out


def strip(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "__template__"}


@functools.cache
def _render_file(path: str | None) -> tuple[dict[str, str], tuple[dict[str, Any], ...]]:
    rendered = render(load_values(Path(path)) if path else {})
    return rendered, tuple(documents(rendered))


def rendered_for(path: Path | None) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """Cached render of the defaults (None) or a ci/*-values.yaml file (copies: tests may not mutate the cache)."""
    import copy

    rendered, docs = _render_file(str(path) if path else None)
    return dict(rendered), copy.deepcopy(list(docs))


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = find(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]
