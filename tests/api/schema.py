"""The generated CRD's OpenAPI schema, for the tests that read it (test_crd, test_rules, test_validate)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from disagg.api.crd import build_crd


def crd_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the CRD's one version, as the models generate it."""
    schema: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def schema_nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node below ``node`` (itself included) with its path: ``.spec.prefill``, ``[]`` for an array's
    items, ``{}`` for a map's values."""
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from schema_nodes(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from schema_nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from schema_nodes(node["additionalProperties"], f"{path}{{}}")
