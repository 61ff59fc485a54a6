"""The package layers: the contract in pyproject.toml (``[tool.importlinter]``, checked by ``lint-imports`` in
``make lint``) lists every package, and polling (disagg.poll) depends on nothing, so every layer can use it.
(An import cycle between the harnesses once erased their types to Any.)"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "operator" / "disagg"

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


def test_the_layers_contract_lists_every_package() -> None:
    conf = tomllib.loads((PKG.parents[1] / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = conf["contracts"]
    listed = {m.strip().removeprefix("disagg.") for layer in contract["layers"] for m in layer.split("|")}
    present = {p.stem for p in PKG.iterdir() if (p.suffix == ".py" and p.stem != "__init__")
               or (p.is_dir() and (p / "__init__.py").exists())}
    assert present - listed == set(), "packages missing from [tool.importlinter] layers"
    assert listed - present == set(), "layers name packages that do not exist"
