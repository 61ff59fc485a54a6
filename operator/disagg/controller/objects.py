"""Plain-object helpers the reconciler's parts share: kopf bodies as plain dicts, an object's name, canonical bytes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from ..api.models import KIND

Key = tuple[str, str]  # (kind, name) within the model's namespace
# Metadata that changes with every write and says nothing about content.
BOOKKEEPING = ("resourceVersion", "managedFields", "creationTimestamp", "selfLink")


def to_plain(obj: Any) -> Any:
    """kopf bodies are mapping views; pydantic and comparisons want plain dicts and lists."""
    if isinstance(obj, Mapping):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


def trim(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the watch cache keeps of an object: everything but managedFields."""
    out: dict[str, Any] = to_plain(body)
    out.get("metadata", {}).pop("managedFields", None)
    return out


def owned_by(child: Mapping[str, Any], parent: Mapping[str, Any]) -> bool:
    uid = parent.get("metadata", {}).get("uid")
    for ref_ in child.get("metadata", {}).get("ownerReferences") or []:
        if ref_.get("kind") == KIND and ref_.get("controller") and (not uid or ref_.get("uid") == uid):
            return True
    return False


def ref(obj: Mapping[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def canonical(value: Any) -> bytes:
    return orjson.dumps(value, default=str, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
