"""Does a live object still carry what the operator applied? Pure comparisons, no I/O.

A child needs applying when it is missing, when its spec-hash annotation differs from the freshly built
manifest's (the spec changed, including removed fields), or when a field the operator sets was changed by
someone else (``covers`` fails). Fields others add (defaults, other controllers' annotations) are ignored, as
server-side apply would leave them alone too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from ..builders.meta import ANNOTATION_SPEC_HASH

_EMPTY: tuple[Any, ...] = (None, False, 0, "", {}, [])


def _scalar_equal(live: Any, desired: Any) -> bool:
    if live == desired:
        return True
    if isinstance(live, bool) or isinstance(desired, bool):
        return False
    if isinstance(live, (int, float, str)) and isinstance(desired, (int, float, str)):
        if str(live) == str(desired):
            return True
        try:  # resource quantities are normalised by the apiserver ("1000m" → "1")
            return bool(parse_quantity(live) == parse_quantity(desired))
        except (ValueError, TypeError):
            return False
    return False


def covers(live: Any, desired: Any) -> bool:
    """True when every field in ``desired`` has the same value in ``live`` (extra fields in live are fine).

    Lists compare element-wise with equal length. An empty/false/zero desired value matches an absent field
    (the apiserver omits such values).
    """
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return live in (None,) and all(v in _EMPTY for v in desired.values())
        for key, value in desired.items():
            if key not in live:
                if value in _EMPTY:
                    continue
                return False
            if not covers(live[key], value):
                return False
        return True
    if isinstance(desired, list):
        if live is None:
            return not desired
        if not isinstance(live, list) or len(live) != len(desired):
            return False
        return all(covers(lv, dv) for lv, dv in zip(live, desired, strict=True))
    return _scalar_equal(live, desired)


def spec_hash(obj: Mapping[str, Any] | None) -> str | None:
    if not obj:
        return None
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_SPEC_HASH)


def why_apply(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> str | None:
    """None when ``live`` is up to date; else "missing", "changed" (the desired manifest changed) or
    "drifted" (someone else changed a field the operator sets)."""
    if live is None:
        return "missing"
    if spec_hash(live) != spec_hash(desired):
        return "changed"
    comparable = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind", "status")}
    if not covers(live, comparable):
        return "drifted"
    return None


def drifted_fields(desired: Any, live: Any, path: str = "") -> list[str]:
    """Paths of the fields where ``live`` no longer covers ``desired`` (for Events and logs)."""
    if isinstance(desired, dict) and isinstance(live, dict):
        out: list[str] = []
        for key, value in desired.items():
            sub = f"{path}.{key}" if path else key
            if key not in live:
                if value not in _EMPTY:
                    out.append(sub)
            elif not covers(live[key], value):
                out += drifted_fields(value, live[key], sub)
        return out
    return [] if covers(live, desired) else [path or "."]
