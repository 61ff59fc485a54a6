"""`disagg validate` on files that are not YAML: an error naming the file, line and column, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.paths import EXAMPLES

from disagg.cli import main

BROKEN = """apiVersion: serving.disagg.dev/v1alpha1
kind: DisaggregatedModel
metadata:
  name: broken
spec:
  model: {name: Qwen/Qwen3-8B
  decode: {replicas: 1}
"""


def _line_of_problem(text: str) -> tuple[int, int]:
    """Where PyYAML itself places the problem (1-based), so the test does not hard-code its parser's opinion."""
    with pytest.raises(yaml.MarkedYAMLError) as info:
        list(yaml.safe_load_all(text))
    mark = info.value.problem_mark
    assert mark is not None
    return mark.line + 1, mark.column + 1


def test_malformed_yaml_is_an_error_naming_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    line, column = _line_of_problem(BROKEN)
    assert line in (6, 7)  # the unclosed flow mapping of spec.model
    assert main(["validate", str(path)]) == 1
    out, err = capsys.readouterr()
    assert err.startswith(f"{path}:{line}:{column}: "), err
    assert "expected ',' or '}'" in err and "Traceback" not in err + out


def test_documents_before_a_broken_one_are_still_reported(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    good = EXAMPLES[0].read_text()
    path = tmp_path / "two.yaml"
    path.write_text(f"{good}\n---\n{BROKEN}")
    line, _ = _line_of_problem(path.read_text())
    assert main(["validate", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out.strip().endswith(": valid"), out
    assert f"{path}:{line}:" in err and "Traceback" not in err


def test_a_tab_indent_and_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tab = tmp_path / "tab.yaml"
    tab.write_text("spec:\n\tmodel: {}\n")
    missing = tmp_path / "missing.yaml"
    assert main(["validate", str(tab), str(missing), str(EXAMPLES[0])]) == 1
    out, err = capsys.readouterr()
    assert f"{tab}:2:1: found character '\\t' that cannot start any token" in err
    assert f"{missing}: No such file or directory" in err
    assert f"{EXAMPLES[0]}:" in out and "valid" in out  # the other files are still validated


def test_the_installed_command_prints_no_traceback(tmp_path: Path) -> None:
    """The real entry point, in a fresh process: exit status 1, one line on stderr."""
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    line, column = _line_of_problem(BROKEN)
    done = subprocess.run([sys.executable, "-m", "disagg.cli", "validate", str(path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"{path}:{line}:{column}: expected ',' or '}}', but got ':' (while parsing a flow mapping at line 6)"]
