"""Just enough PromQL reading to check names: which metrics and labels an expression uses.

Syntax itself is checked by the real parser (``promtool check rules``); this only extracts names.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.chart.metric_catalog import Metric

_METRIC = re.compile(r"(?<![\w:\"'])((?:disagg|vllm)[_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric sample name, label names matched on it) for every selector of a disagg_/vllm: metric."""
    return [(m.group(1), set(_MATCHER.findall(m.group(2) or ""))) for m in _METRIC.finditer(expr)]


def grouping_labels(expr: str) -> set[str]:
    out: set[str] = set()
    for group in _GROUPING.findall(expr):
        out |= {label.strip() for label in group.split(",") if label.strip()}
    return out


def check(expr: str, catalog: dict[str, Metric], target_labels: frozenset[str]) -> list[str]:
    """Problems with the names in ``expr`` (empty when every metric and label exists)."""
    problems = []
    used = selectors(expr)
    if not used:
        problems.append(f"no disagg_/vllm: metric in {expr!r}")
    known_labels = set(target_labels) | {"le"}
    for name, labels in used:
        metric = catalog.get(name)
        if metric is None:
            problems.append(f"unknown metric {name}")
            continue
        known_labels |= metric.labels
        unknown = labels - metric.labels - target_labels - ({"le"} if name.endswith("_bucket") else set())
        if unknown:
            problems.append(f"{name}: unknown labels {sorted(unknown)}")
    unknown = grouping_labels(expr) - known_labels
    if unknown:
        problems.append(f"grouping by unknown labels {sorted(unknown)} in {expr!r}")
    return problems
