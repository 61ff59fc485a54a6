"""The package layering the harness split established (issue 11): the local substrate and load generation are
shared by the demo and the benchmarks, and import neither; the demo and the benchmarks do not import each other;
polling (disagg.poll) depends on nothing, so every layer can use it.
(An import cycle between them once erased their types to Any.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "operator" / "disagg"

# package → packages it must not import
FORBIDDEN = {
    "local": {"bench", "demo"},
    "load": {"bench", "demo", "local"},
    "demo": {"bench"},
    "bench": {"demo"},
}


def _imported_packages(path: Path) -> set[str]:
    """The disagg sub-packages a module imports (absolute ``disagg.x`` or relative ``..x``)."""
    module = ["disagg", *path.relative_to(PKG).with_suffix("").parts]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module[:len(module) - node.level]
                names = [".".join([*base, node.module] if node.module else base)]
                if not node.module:
                    names = [".".join([*base, a.name]) for a in node.names]
            elif node.module:
                names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "disagg" and len(parts) > 1:
                out.add(parts[1])
    return out


def test_the_import_walker_sees_relative_and_absolute_imports() -> None:
    assert "load" in _imported_packages(PKG / "bench" / "autoscale.py")
    assert {"local", "load"} <= _imported_packages(PKG / "demo" / "acts.py")


def test_polling_and_kube_helpers_depend_on_no_harness() -> None:
    assert _imported_packages(PKG / "poll.py") == set()  # the one polling helper: standard library only
    assert not _imported_packages(PKG / "kube.py") & {"local", "load", "demo", "bench"}  # used by the operator


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_layering(package: str) -> None:
    bad = {str(p.relative_to(PKG)): sorted(_imported_packages(p) & FORBIDDEN[package])
           for p in sorted((PKG / package).rglob("*.py"))}
    assert not {k: v for k, v in bad.items() if v}, f"{package}/ must not import {sorted(FORBIDDEN[package])}"
