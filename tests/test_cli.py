"""The top-level command line: every registered subcommand module exists and is wired; a missing one is an error."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from disagg import cli


def _subcommands() -> set[str]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert isinstance(sub.choices, dict)
    return set(sub.choices)


def test_every_registered_module_adds_its_subcommands() -> None:
    assert {"crds", "validate", "demo", "operator", "render", "router", "sim", "bench"} <= _subcommands()


def test_a_missing_subcommand_module_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "SUBCOMMAND_MODULES", (*cli.SUBCOMMAND_MODULES, "disagg.autoscaling.cli"))
    with pytest.raises(cli.SubcommandError, match=r"disagg\.autoscaling\.cli .* does not exist"):
        cli.build_parser()
    monkeypatch.setattr(cli, "SUBCOMMAND_MODULES", ("disagg.no_such_package.cli",))
    with pytest.raises(cli.SubcommandError, match="does not exist"):
        cli.build_parser()


def test_a_module_without_add_parser_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "disagg_test_empty_cli", types.ModuleType("disagg_test_empty_cli"))
    monkeypatch.setattr(cli, "SUBCOMMAND_MODULES", ("disagg_test_empty_cli",))
    with pytest.raises(cli.SubcommandError, match="defines no add_parser"):
        cli.build_parser()


def test_an_import_error_inside_a_module_is_not_hidden(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # the module exists, but a dependency it imports does not: that error is reported as it is
    (tmp_path / "disagg_test_broken_cli.py").write_text("import disagg_test_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "SUBCOMMAND_MODULES", ("disagg_test_broken_cli",))
    with pytest.raises(ModuleNotFoundError) as exc:
        cli.build_parser()
    assert exc.type is ModuleNotFoundError and exc.value.name == "disagg_test_missing_dependency"
