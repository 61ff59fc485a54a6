"""docs/reference.md, generated from the code (issue 31): ``python -m disagg.bench.reference`` (``make docs``).

What drifts when written by hand, read where it is defined:

* every value of the Helm chart (charts/disagg-operator): path, type and description from ``values.schema.json``,
  default from ``values.yaml`` (a ``# --`` comment above a key, the helm-docs convention, describes it when the
  schema does not);
* every metric family the operator, the router and the simulator export, from their prometheus_client
  definitions (the families are instantiated here, in throw-away registries; nothing is served);
* every status condition type and reason, every Event reason the operator writes, and every routing decision
  reason and remote-path fallback cause, read from the source by an AST walk (:class:`Literals`): the string
  constants that flow into ``condition(type, status, reason, …)``, ``emit(body, type, reason, …)`` and
  ``Decision(kind, reason, …)``, through local assignments, parameters (their defaults and their call sites),
  module constants and f-strings (a part that cannot be resolved is shown as ``…``).

``--check`` changes nothing and exits 1 when docs/reference.md differs from what the code generates
(tests/docs/test_reference.py runs it). Sits in ``disagg.bench`` beside :mod:`disagg.bench.docs`, the other docs
generator: it reads the operator, the router and the simulator, so it belongs above all three.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from ..vllm_versions import DEFAULT, DEFAULT_VERSION, METRICS, OLDEST_CHECKED, fmt, profile

REFERENCE = Path("docs") / "reference.md"
CHART = Path("charts") / "disagg-operator"
PACKAGE = Path(__file__).resolve().parents[1]  # operator/disagg
COMMAND = "python -m disagg.bench.reference"
UNRESOLVED = "…"


def cell(text: Any) -> str:
    """A markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def code(text: str) -> str:
    return f"`{text}`" if text else ""


def table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    head = list(header)
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------ Helm values


def value_comments(values_yaml: str) -> dict[str, str]:
    """``path → description`` from the ``# --`` comments of values.yaml (a comment block that starts with ``# --``
    right above a key; its ``#`` continuation lines join it)."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    for line in values_yaml.splitlines():
        stripped = line.strip()
        if re.match(r"# --(\s|$)", stripped):  # not "# --flag" inside a description
            pending = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if pending is not None:
                pending.append(stripped[1:].strip())
            continue
        if not stripped or stripped.startswith("-"):
            pending = None if not stripped else pending
            continue
        key = stripped.split(":", 1)[0].strip().strip('"')
        if ":" not in stripped:
            continue
        indent = len(line) - len(line.lstrip(" "))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        if pending is not None:
            out[".".join(k for _, k in stack)] = " ".join(pending)
        pending = None
    return out


def schema_type(node: dict[str, Any]) -> str:
    if "enum" in node:
        return " | ".join(json.dumps(v) for v in node["enum"])
    if "const" in node:
        return f"always {json.dumps(node['const'])}"
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind else []
    if "array" in kinds and isinstance(node.get("items"), dict) and node["items"].get("type"):
        kinds = [k if k != "array" else f"array of {node['items']['type']}" for k in kinds]
    text = " or ".join(kinds) or "any"
    bounds = [f"{k} {node[k]}" for k in ("minimum", "maximum") if k in node]
    return text + (f" ({', '.join(bounds)})" if bounds else "")


def _default(values: Any, path: list[str]) -> Any:
    for key in path:
        if not isinstance(values, dict) or key not in values:
            return None
        values = values[key]
    return values


def helm_values(root: Path) -> list[tuple[str, str, str, str]]:
    """(path, type, default, description) for every value of the chart's schema, in schema order; an object with
    properties of its own gets a row when something describes it or it takes other keys too (then with its whole
    default), then its properties."""
    schema = json.loads((root / CHART / "values.schema.json").read_text())
    text = (root / CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    comments = value_comments(text)
    rows: list[tuple[str, str, str, str]] = []

    def walk(node: dict[str, Any], path: list[str]) -> None:
        for key, sub in (node.get("properties") or {}).items():
            p = [*path, key]
            name = ".".join(p)
            desc = sub.get("description") or comments.get(name, "")
            has_props = bool(sub.get("properties"))
            open_object = has_props and sub.get("additionalProperties", True) is not False  # more keys allowed
            if not has_props or desc or open_object:
                default = _default(values, p)
                shown = "" if (has_props and not open_object) or default is None else code(json.dumps(default))
                rows.append((code(name), schema_type(sub), shown, desc))
            if has_props:
                walk(sub, p)

    walk(schema, [])
    return rows


# ------------------------------------------------------------------------------------------------ metrics


@dataclass(frozen=True)
class Family:
    name: str  # as exposed (counters with _total)
    kind: str
    labels: tuple[str, ...]
    help: str


def exposed(name: str, kind: str) -> str:
    return name + "_total" if kind == "counter" and not name.endswith("_total") else name


def wrapper_family(c: MetricWrapperBase) -> Family:
    """A prometheus_client metric's family. Its label names have no public accessor (``_labelnames`` is what
    ``labels()`` checks against)."""
    (desc,) = c.describe()
    return Family(exposed(desc.name, desc.type), desc.type, tuple(c._labelnames), desc.documentation)  # noqa: SLF001


def router_families() -> list[Family]:
    from ..router.metrics import RouterMetrics

    m = RouterMetrics(CollectorRegistry())
    found: list[MetricWrapperBase] = []
    for v in vars(m).values():
        found += [x for x in (v.values() if isinstance(v, dict) else [v]) if isinstance(x, MetricWrapperBase)]
    return sorted((wrapper_family(c) for c in found), key=lambda f: f.name)


def operator_families() -> list[Family]:
    from ..controller import autoscaler
    from ..controller.metrics import ReconcilerCollector
    from ..controller.reconcile import Reconciler

    out = [wrapper_family(v) for v in vars(autoscaler).values() if isinstance(v, MetricWrapperBase)]
    counters = SimpleNamespace(counters=defaultdict(int))
    for fam in ReconcilerCollector(cast(Reconciler, counters)).collect():
        out.append(Family(exposed(fam.name, fam.type), fam.type, (), fam.documentation))
    return sorted(out, key=lambda f: f.name)


def sim_families() -> list[tuple[Family, str]]:
    """The simulator's vLLM families (with NIXL's), each with the vLLM releases that export it."""
    from ..sim.metrics import Metrics, Registry

    class Catalogue(Registry):
        def __init__(self) -> None:
            super().__init__()
            self.seen: dict[str, Family] = {}

        def family(self, cls: Any, name: str, doc: str, labelnames: list[str], exported: bool = True,
                   **kw: Any) -> Any:
            kind = {Counter: "counter", Gauge: "gauge", Histogram: "histogram"}[cls]
            self.seen[name] = Family(exposed(name, kind), kind, tuple(labelnames), doc)
            return super().family(cls, name, doc, labelnames, exported, **kw)

    cat = Catalogue()
    for release in (profile(OLDEST_CHECKED), DEFAULT):
        Metrics("model", 4096, nixl=True, shared=cat, release=release)
    facts = {f.what: f for f in METRICS}
    out = []
    for name, fam in sorted(cat.seen.items()):
        fact = facts.get(name)
        if fact is None:
            releases = f"all checked ({fmt(OLDEST_CHECKED)} to {fmt(DEFAULT_VERSION)})"
        elif fact.until is None:
            releases = f"≥ {fmt(fact.since)}"
        else:
            releases = (f"< {fmt(fact.until)}" if fact.since == (0, 0, 0)
                        else f"{fmt(fact.since)} to < {fmt(fact.until)}")
        out.append((fam, releases))
    return out


def family_rows(fams: Iterable[Family]) -> list[list[str]]:
    return [[code(f.name), f.kind, ", ".join(code(x) for x in f.labels), f.help] for f in fams]


# ------------------------------------------------------------------------------------------------ literals in code


@dataclass
class _Module:
    path: Path
    tree: ast.Module
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)


class Literals:
    """The string constants that can reach an expression in a set of modules (best effort, for the reference):
    constants, conditional expressions, ``or``, f-strings and ``+`` (unresolved parts become ``…``), local
    assignments, parameters (default + the arguments at every call site: a plain name in the same module, a
    method or attribute call in any), comprehension targets over literal tuples, module constants, ``obj.a`` as
    the keyword ``a=`` of every ``Obj(…)`` call, and an attribute ``x.a`` (``attributes``) as what flows into
    parameters named ``a``."""

    def __init__(self, files: Iterable[Path], attributes: bool = False) -> None:
        self.attributes = attributes  # resolve ``x.a`` through parameters named ``a``
        self.modules: list[_Module] = []
        self.consts: dict[str, str] = {}
        self.functions: dict[str, list[tuple[_Module, ast.FunctionDef]]] = defaultdict(list)
        for path in sorted(files):
            mod = _Module(path, ast.parse(path.read_text()))
            for node in ast.walk(mod.tree):
                for child in ast.iter_child_nodes(node):
                    mod.parents[child] = node
                if isinstance(node, ast.FunctionDef):
                    self.functions[node.name].append((mod, node))
            for stmt in mod.tree.body:
                if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                        and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)):
                    self.consts[stmt.targets[0].id] = stmt.value.value
            self.modules.append(mod)

    def calls(self) -> Iterator[tuple[_Module, ast.Call]]:
        for mod in self.modules:
            for node in ast.walk(mod.tree):
                if isinstance(node, ast.Call):
                    yield mod, node

    @staticmethod
    def callee(call: ast.Call) -> str | None:
        f = call.func
        return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None

    def enclosing(self, mod: _Module, node: ast.AST) -> ast.FunctionDef | None:
        cur: ast.AST | None = mod.parents.get(node)
        while cur is not None and not isinstance(cur, ast.FunctionDef):
            cur = mod.parents.get(cur)
        return cur

    @staticmethod
    def parent(mod: _Module, node: ast.AST) -> ast.AST:
        return mod.parents.get(node, node)

    def arg(self, call: ast.Call, index: int, name: str) -> ast.expr | None:
        for kw in call.keywords:
            if kw.arg == name:
                return kw.value
        return call.args[index] if index < len(call.args) and not isinstance(call.args[index], ast.Starred) else None

    def strings(self, mod: _Module, expr: ast.expr | None, seen: frozenset[int] = frozenset()) -> set[str]:
        if expr is None or id(expr) in seen or len(seen) > 12:
            return set()
        seen = seen | {id(expr)}
        if isinstance(expr, ast.Constant):
            return {expr.value} if isinstance(expr.value, str) else set()
        if isinstance(expr, ast.IfExp):
            return self.strings(mod, expr.body, seen) | self.strings(mod, expr.orelse, seen)
        if isinstance(expr, ast.BoolOp):
            return set().union(*(self.strings(mod, v, seen) for v in expr.values))
        if isinstance(expr, ast.JoinedStr | ast.BinOp):
            parts = expr.values if isinstance(expr, ast.JoinedStr) else [expr.left, expr.right]
            options = []
            for part in parts:
                value = part.value if isinstance(part, ast.FormattedValue) else part
                options.append(sorted(self.strings(mod, value, seen)) or [UNRESOLVED])
            return {"".join(p) for p in itertools.product(*options)}
        if isinstance(expr, ast.Name):
            return self.name(mod, expr, seen)
        if isinstance(expr, ast.Attribute):
            if expr.attr in self.consts:
                return {self.consts[expr.attr]}
            if isinstance(expr.value, ast.Name):  # ``sample.reason``: the ``reason=`` of every ``Sample(…)``
                built = {s for cmod, call in self.calls() if (self.callee(call) or "").lower() == expr.value.id
                         for kw in call.keywords if kw.arg == expr.attr for s in self.strings(cmod, kw.value, seen)}
                if built:
                    return built
            return self.parameter_values(expr.attr, None, seen) if self.attributes else set()
        return set()

    def name(self, mod: _Module, expr: ast.Name, seen: frozenset[int]) -> set[str]:
        func = self.enclosing(mod, expr)
        out: set[str] = set()
        if func is not None:
            for node in ast.walk(func):
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == expr.id
                                                        for t in node.targets):
                    out |= self.strings(mod, node.value, seen)
                elif isinstance(node, ast.comprehension):
                    out |= self.comprehension(mod, node, expr.id, seen)
            params = [a.arg for a in (*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs)]
            if expr.id in params:
                out |= self.parameter_values(expr.id, (mod, func), seen)
        if not out and expr.id in self.consts:
            out.add(self.consts[expr.id])
        return out

    def comprehension(self, mod: _Module, comp: ast.comprehension, name: str, seen: frozenset[int]) -> set[str]:
        """``for a, (b, c) in (("x", f), …)``: what ``name`` takes from the literal tuples iterated."""
        if not isinstance(comp.iter, ast.Tuple | ast.List):
            return set()
        out: set[str] = set()
        for item in comp.iter.elts:
            out |= self.unpack(mod, comp.target, item, name, seen)
        return out

    def unpack(self, mod: _Module, target: ast.expr, value: ast.expr, name: str, seen: frozenset[int]) -> set[str]:
        if isinstance(target, ast.Name):
            return self.strings(mod, value, seen) if target.id == name else set()
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts):
            return set().union(*(self.unpack(mod, t, v, name, seen) for t, v in zip(target.elts, value.elts,
                                                                                     strict=True)))
        if isinstance(target, ast.Tuple):  # a tuple from a call: what the called function returns
            index = next((i for i, t in enumerate(target.elts) if isinstance(t, ast.Name) and t.id == name), None)
            return set() if index is None else self.returned(value, index, seen)
        return set()

    def returned(self, value: ast.expr, index: int, seen: frozenset[int]) -> set[str]:
        """Element ``index`` of the tuples returned by the function whose result ``value`` (``r.x``: the keyword
        ``x=f(…)`` of some call) holds."""
        funcs: set[str] = set()
        if isinstance(value, ast.Attribute):
            funcs = {n for _, call in self.calls() for kw in call.keywords
                     if kw.arg == value.attr and isinstance(kw.value, ast.Call) and (n := self.callee(kw.value))}
        out: set[str] = set()
        for fname in funcs:
            for mod, func in self.functions.get(fname, []):
                for node in ast.walk(func):
                    if (isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple)
                            and index < len(node.value.elts)):
                        out |= self.strings(mod, node.value.elts[index], seen)
        return out

    def parameter_values(self, param: str, where: tuple[_Module, ast.FunctionDef] | None,
                         seen: frozenset[int]) -> set[str]:
        """What parameter ``param`` of ``where`` (None: of every function that has one so named) receives."""
        targets = [where] if where else [(m, f) for fs in self.functions.values() for m, f in fs]
        out: set[str] = set()
        for mod, func in targets:
            a = func.args
            positional = [x.arg for x in (*a.posonlyargs, *a.args)]
            if param not in positional and param not in [x.arg for x in a.kwonlyargs]:
                continue
            defaults = dict(zip(positional[len(positional) - len(a.defaults):], a.defaults, strict=True))
            defaults.update({x.arg: d for x, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None})
            if param in defaults:
                out |= self.strings(mod, defaults[param], seen)
            for cmod, call in self.calls():
                if self.callee(call) != func.name or (isinstance(call.func, ast.Name) and cmod is not mod):
                    continue
                offset = 1 if positional[:1] in (["self"], ["cls"]) and isinstance(call.func, ast.Attribute) else 0
                index = positional.index(param) - offset if param in positional else 10**6
                out |= self.strings(cmod, self.arg(call, index, param), seen)
        return out


def package_files(*parts: str) -> list[Path]:
    out: list[Path] = []
    for part in parts:
        p = PACKAGE / part
        out += sorted(p.glob("*.py")) if p.is_dir() else [p]
    return out


STATUS = {True: "True", False: "False", None: "Unknown"}


def _status(expr: ast.expr | None) -> set[str]:
    if isinstance(expr, ast.Constant) and (expr.value is None or isinstance(expr.value, bool)):
        return {STATUS[expr.value]}
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return {expr.value}
    return {"True", "False"} if expr is not None else set()


def conditions() -> dict[str, dict[str, set[str]]]:
    """condition type → reason → statuses, from ``condition(type, ok, reason, …)`` calls, dict literals with
    ``type`` and ``reason`` keys, and ``*_condition`` functions returning (status, reason, message) tuples that a
    comprehension pairs with a type."""
    lit = Literals(package_files("controller", "autoscaling", "builders"))
    out: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for mod, call in lit.calls():
        if lit.callee(call) != "condition" or len(call.args) < 4:  # (type, ok, reason, message, generation)
            continue
        types = lit.strings(mod, call.args[0])
        reasons = lit.strings(mod, call.args[2])
        statuses = _status(call.args[1])
        tuple_status = _tuple_statuses(lit, mod, call)
        if tuple_status:  # type and reason come paired from a comprehension's tuples
            for (t, r), st in tuple_status.items():
                out[t][r] |= st
            continue
        for t, r in itertools.product(types, reasons):
            out[t][r] |= statuses
    for mod in lit.modules:
        for node in ast.walk(mod.tree):
            func = lit.enclosing(mod, node)
            if isinstance(node, ast.Dict) and (func is None or func.name != "condition"):  # the helper's own dict
                keys = {k.value: v for k, v in zip(node.keys, node.values, strict=True)
                        if isinstance(k, ast.Constant) and isinstance(k.value, str)}
                if {"type", "reason", "status"} <= keys.keys():
                    for t, r in itertools.product(lit.strings(mod, keys["type"]), lit.strings(mod, keys["reason"])):
                        out[t][r] |= _status(keys["status"])
    return {t: dict(rs) for t, rs in out.items() if t != UNRESOLVED}


def _tuple_statuses(lit: Literals, mod: _Module, call: ast.Call) -> dict[tuple[str, str], set[str]]:
    """For a ``condition(type_, ok, reason, …)`` inside ``for type_, (ok, reason, _) in (("T", r.x), …)``: each
    (type, reason) with the statuses the function behind ``r.x`` returns beside that reason."""
    comp = next((n for n in ast.walk(lit.enclosing(mod, call) or mod.tree) if isinstance(n, ast.comprehension)
                 and isinstance(n.iter, ast.Tuple) and call in list(ast.walk(lit.parent(mod, n)))), None)
    if comp is None or not isinstance(comp.iter, ast.Tuple):
        return {}
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    for item in comp.iter.elts:
        if not (isinstance(item, ast.Tuple) and len(item.elts) == 2 and isinstance(item.elts[1], ast.Attribute)):
            continue
        for t in lit.strings(mod, item.elts[0]):
            for status, reason in _returned_pairs(lit, item.elts[1]):
                out[(t, reason)].add(status)
    return out


def _returned_pairs(lit: Literals, value: ast.Attribute) -> set[tuple[str, str]]:
    funcs = {n for _, c in lit.calls() for kw in c.keywords
             if kw.arg == value.attr and isinstance(kw.value, ast.Call) and (n := lit.callee(kw.value))}
    out: set[tuple[str, str]] = set()
    for fname in funcs:
        for mod, func in lit.functions.get(fname, []):
            for node in ast.walk(func):
                if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple) and len(node.value.elts) >= 2:
                    for s, r in itertools.product(lit.strings(mod, node.value.elts[0]),
                                                  lit.strings(mod, node.value.elts[1])):
                        out.add((s, r))
    return out


def events() -> dict[str, set[str]]:
    """Event reason → types (Normal, Warning), from every ``emit(body, type, reason, message)`` call."""
    lit = Literals(package_files("controller"))
    out: dict[str, set[str]] = defaultdict(set)
    for mod, call in lit.calls():
        if lit.callee(call) not in ("emit", "_emit") or len(call.args) < 4:
            continue
        for reason in lit.strings(mod, call.args[2]):
            out[reason] |= lit.strings(mod, call.args[1])
    return dict(out)


def decisions() -> dict[str, set[str]]:
    """Routing decision reason → decisions (remote, local, reject), from every ``Decision(kind, reason, …)`` and
    ``dataclasses.replace(d, …, reason=…)`` in the router's policy, core and probes."""
    lit = Literals(package_files("router/policy.py", "router/core.py", "router/probe.py", "router/placement.py"),
                   attributes=True)
    out: dict[str, set[str]] = defaultdict(set)
    for mod, call in lit.calls():
        name = lit.callee(call)
        if name == "Decision" and (call.args or call.keywords):
            kinds = lit.strings(mod, lit.arg(call, 0, "decision"))
            reasons = lit.strings(mod, lit.arg(call, 1, "reason"))
        elif name == "replace" and any(kw.arg == "reason" for kw in call.keywords):
            kinds = lit.strings(mod, lit.arg(call, 10**6, "decision")) or {"(unchanged)"}
            reasons = lit.strings(mod, lit.arg(call, 10**6, "reason"))
        else:
            continue
        for r in reasons:
            out[r] |= kinds
    return dict(out)


# ------------------------------------------------------------------------------------------------ the document


def remote_path_causes() -> list[tuple[str, str]]:
    from ..router.core import KV_CAUSES, PREFILL_CAUSES, REMOTE_PATH_CAUSES

    def group(c: str) -> str:
        if c in PREFILL_CAUSES:
            return "prefill leg (capacity or the prefill worker)"
        if c in KV_CAUSES:
            return "KV hand-off (a transport fault: breakers, the mode controller, `KVTransferHealthy`)"
        return "decode worker refused the KV parameters"

    return [(c, group(c)) for c in REMOTE_PATH_CAUSES]


def render(root: Path) -> str:
    from ..router.policy import LADDER_REASONS

    sim = sim_families()
    out = [
        "# Reference",
        "",
        f"<!-- generated by `{COMMAND}` (make docs) from the code; do not edit: tests/docs/test_reference.py fails "
        "when this file differs from what the code generates -->",
        "",
        "Generated from the code, so it cannot drift: the Helm chart's values, every metric the operator, the router "
        "and the simulator export, and every status condition, Event reason, routing decision reason and fallback "
        "cause. The guides explain them: [install](install.md), [api](api.md), [operator](operator.md), "
        "[router](router.md), [observability](observability.md), [troubleshooting](troubleshooting.md).",
        "",
        "- [Helm values](#helm-values)",
        "- [Metrics](#metrics): [router](#router-metrics), [operator](#operator-metrics), "
        "[simulator (vLLM's names)](#simulator-metrics-vllms-names)",
        "- [Status conditions](#status-conditions)",
        "- [Events](#events)",
        "- [Routing decision reasons](#routing-decision-reasons)",
        "- [Remote-path fallback causes](#remote-path-fallback-causes)",
        "",
        "## Helm values",
        "",
        "charts/disagg-operator: type from `values.schema.json` (which refuses unknown keys), default from "
        "`values.yaml`, description from the schema or the `# --` comment above the key.",
        "",
        table(["value", "type", "default", "description"], helm_values(root)),
        "",
        "## Metrics",
        "",
        "Counters are exposed with the `_total` suffix (shown); histograms as `_bucket`, `_sum` and `_count`.",
        "",
        "### Router metrics",
        "",
        "`disagg router` on `GET /metrics` (disagg.router.metrics.RouterMetrics).",
        "",
        table(["metric", "type", "labels", "help"], family_rows(router_families())),
        "",
        "### Operator metrics",
        "",
        "`disagg operator --metrics-port` (chart: `metrics.enabled`): the reconciler's counters "
        "(disagg.controller.metrics) and the autoscaler's families (disagg.controller.autoscaler).",
        "",
        table(["metric", "type", "labels", "help"], family_rows(operator_families())),
        "",
        "### Simulator metrics (vLLM's names)",
        "",
        f"`disagg sim` exports vLLM's own families, names, types and labels as vLLM {fmt(DEFAULT_VERSION)} does "
        "(the NIXL ones with a KV connector); `--emulate-version` drops the families a release lacks "
        "(disagg.vllm_versions.METRICS). The router and the autoscaler read these from real workers too.",
        "",
        table(["metric", "type", "labels", "vLLM releases", "help"],
              [[*row[:3], rel, row[3]] for row, (_, rel) in zip(family_rows(f for f, _ in sim), sim, strict=True)]),
        "",
        "## Status conditions",
        "",
        "`status.conditions[]` of a DisaggregatedModel: each type with the reasons the code writes and the status "
        "that goes with each (`…` is a part computed at run time: e.g. `…Starting` is `PrefillStarting`, "
        "`DecodeStarting` or `RouterStarting`). [operator](operator.md) and [autoscaling](autoscaling.md) say when.",
        "",
        table(["condition", "reason", "status"],
              [[code(t), code(r), ", ".join(sorted(s))] for t, rs in sorted(conditions().items())
               for r, s in sorted(rs.items())]),
        "",
        "## Events",
        "",
        "Events the operator posts on a DisaggregatedModel (`kubectl describe dm`), by reason; the types a call "
        "site can post with (one that computes the type lists both: `Ready` is Normal, `NotReady` a Warning except "
        "right after creation).",
        "",
        table(["reason", "type"], [[code(r), ", ".join(sorted(t))] for r, t in sorted(events().items())]),
        "",
        "## Routing decision reasons",
        "",
        "The `reason` label of `disagg_routing_decisions_total` and the request log's `reason`, with the decision "
        "it goes with. *SLO may overrule*: a choice of the threshold ladder that `spec.routing.policy: SLO` (the "
        "default) re-prices (its own choices are the `slo_*` reasons); [router](router.md) has the rules.",
        "",
        table(["reason", "decision", "SLO may overrule"],
              [[code(r), ", ".join(sorted(k)), "yes" if r in LADDER_REASONS else ""]
               for r, k in sorted(decisions().items())]),
        "",
        "## Remote-path fallback causes",
        "",
        "The `cause` label of `disagg_fallbacks_total` for a remote path that failed (disagg.router.core."
        "REMOTE_PATH_CAUSES); the alert `DisaggRemotePrefillFailures` covers every one.",
        "",
        table(["cause", "where"], [[code(c), g] for c, g in remote_path_causes()]),
        "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description="Write docs/reference.md from the code.")
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 when docs/reference.md differs from what the code generates")
    p.add_argument("--root", type=Path, default=Path("."), help="the repository root (default: .)")
    args = p.parse_args(argv)
    path = args.root / REFERENCE
    text = render(args.root)
    current = path.read_text() if path.exists() else None
    if args.check:
        if current != text:
            print(f"{path} is stale: run `{COMMAND}` (make docs)", file=sys.stderr)
            return 1
        print(f"{path}: up to date")
        return 0
    if current != text:
        path.write_text(text)
        print(f"{path}: written")
    else:
        print(f"{path}: up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
