"""What the operator writes and the router decides, read from the source by an AST walk, for docs/reference.md
(:mod:`.reference`): every status condition type and reason, every Event reason, every routing decision reason.
:class:`Literals` follows the string constants that flow into ``condition(type, status, reason, …)``,
``emit(body, type, reason, …)`` and ``Decision(kind, reason, …)``, through local assignments, parameters (their
defaults and their call sites), module constants and f-strings (a part that cannot be resolved is ``…``)."""

from __future__ import annotations

import ast
import itertools
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # operator/disagg
UNRESOLVED = "…"



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
    lit = Literals(package_files("router/policy.py", "router/slo_policy.py", "router/core.py", "router/probe.py",
                                 "router/placement.py"),
                   attributes=True)
    out: dict[str, set[str]] = defaultdict(set)
    for mod, call in lit.calls():
        name = lit.callee(call)
        if name == "Decision" and (call.args or call.keywords):
            kinds = lit.strings(mod, lit.arg(call, 0, "decision"))
            reasons = lit.strings(mod, lit.arg(call, 1, "reason"))
        elif name == "replace" and any(kw.arg == "reason" for kw in call.keywords):
            kinds = lit.strings(mod, lit.arg(call, 10**6, "decision")) or {"as decided"}
            reasons = lit.strings(mod, lit.arg(call, 10**6, "reason"))
        else:
            continue
        for r in reasons:
            out[r] |= kinds
    return dict(out)
