"""Benchmark tables in docs/*.md are generated from docs/results/*.json (disagg.bench.docs): the repo's docs agree
with its results files, and the check fails on a stale table, an unknown benchmark or table, a malformed results
file, a results file no doc uses, and a pending block that holds anything but the pending line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from disagg import results as results_io
from disagg.bench import docs

REPO = Path(__file__).resolve().parents[2]

# the fake benchmark of the mechanics tests: this module renders it
FAKE = docs.Benchmark("fake", __name__, "make bench-fake")
PENDING = docs.Benchmark("later", __name__, "make bench-later")


def render_tables(doc: dict[str, Any]) -> dict[str, str]:
    rows = doc["results"]["rows"]
    return {"main": "| k | v |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows.items()),
            "count": f"{len(rows)} rows"}


def test_the_repo_docs_match_their_results_files() -> None:
    rep = docs.run(REPO, check=True)
    assert not rep.errors, "\n".join(rep.errors) + "\n(regenerate: .venv/bin/python -m disagg.bench.docs)"
    # a pending block only where its results file is missing (the docs say so in place)
    for line in rep.pending:
        name = line.split("results:", 1)[1].split(":", 1)[0]
        assert not (REPO / docs.REGISTRY[name].results).exists(), line


def test_committed_results_follow_the_convention() -> None:
    for path in sorted((REPO / docs.RESULTS_DIR).glob("*.json")):
        doc = json.loads(path.read_text())
        name = doc.get("benchmark", "?")
        assert results_io.validate(doc, path.stem) == [], path
        assert name in docs.REGISTRY, f"{path}: {name!r} is not in disagg.bench.docs.REGISTRY"


# ------------------------------------------------------------------------------------------------- mechanics
def _repo(tmp_path: Path, doc_text: str, results: dict[str, Any] | None = None) -> Path:
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "bench.md").write_text(doc_text)
    if results is not None:
        doc = results_io.results_doc("fake", "disagg bench fake --n 2", results,
                                     results_io.machine_facts(date="2026-11-30"))
        results_io.write_results(tmp_path / FAKE.results, doc)
    return tmp_path


REG = {"fake": FAKE, "later": PENDING}
DOC = "# B\n\nintro\n\n<!-- results:fake:main -->\nold table\n<!-- /results -->\n\nprose\n"


def test_write_fills_the_block_then_check_passes(tmp_path: Path) -> None:
    root = _repo(tmp_path, DOC, {"rows": {"a": 1, "b": 2}})
    first = docs.run(root, check=True, registry=REG)
    assert first.errors == ["docs/bench.md:5: results:fake:main is stale: it differs from what "
                            "docs/results/fake.json renders (run `python -m disagg.bench.docs`)"]
    assert (root / "docs/bench.md").read_text() == DOC  # --check changes nothing
    wrote = docs.run(root, check=False, registry=REG)
    assert not wrote.errors and wrote.changed == ["docs/bench.md:5: results:fake:main"]
    text = (root / "docs/bench.md").read_text()
    assert "| a | 1 |\n| b | 2 |" in text and "old table" not in text
    assert text.startswith("# B\n\nintro\n\n") and text.endswith("<!-- /results -->\n\nprose\n")  # prose kept
    footer = next(ln for ln in text.splitlines() if ln.startswith("<sub>"))
    assert "[`docs/results/fake.json`](results/fake.json)" in footer and "`disagg bench fake --n 2`" in footer
    assert "2026-11-30" in footer and "Python" in footer
    assert docs.run(root, check=True, registry=REG).errors == []
    assert docs.run(root, check=False, registry=REG).changed == []  # idempotent


def test_changed_results_make_the_table_stale(tmp_path: Path) -> None:
    root = _repo(tmp_path, DOC, {"rows": {"a": 1}})
    docs.run(root, check=False, registry=REG)
    doc = json.loads((root / FAKE.results).read_text())
    doc["results"]["rows"]["a"] = 3
    (root / FAKE.results).write_text(json.dumps(doc))
    errors = docs.run(root, check=True, registry=REG).errors
    assert len(errors) == 1 and "docs/bench.md:5: results:fake:main is stale" in errors[0]
    # so is a hand edit of a generated table
    docs.run(root, check=False, registry=REG)
    text = (root / "docs/bench.md").read_text()
    (root / "docs/bench.md").write_text(text.replace("| a | 3 |", "| a | 4 |"))
    assert "is stale" in docs.run(root, check=True, registry=REG).errors[0]


def test_unknown_table_and_unknown_benchmark_are_errors(tmp_path: Path) -> None:
    text = DOC + "\n<!-- results:fake:nope -->\n<!-- /results -->\n<!-- results:ghost:main -->\n<!-- /results -->\n"
    root = _repo(tmp_path, text, {"rows": {}})
    errors = docs.run(root, check=False, registry=REG).errors
    assert "docs/bench.md:11: results:fake:nope names an unknown table of tests.bench.test_results_docs." \
           "render_tables (it renders: main, count)" in errors
    assert any(e.startswith("docs/bench.md:13: results:ghost:main names an unknown benchmark (known: fake, later)")
               for e in errors)
    assert len(errors) == 2
    # the known block was still written; the bad ones were left as they are
    out = (root / "docs/bench.md").read_text()
    assert "| k | v |" in out and "<!-- results:fake:nope -->\n<!-- /results -->" in out


def test_a_results_file_no_doc_uses_is_an_error(tmp_path: Path) -> None:
    root = _repo(tmp_path, "# nothing marked\n", {"rows": {}})
    (root / "docs/results/stray.json").write_text("{}")
    errors = docs.run(root, check=True, registry=REG).errors
    assert errors == ["docs/results/fake.json: no doc uses it (add a <!-- results:fake:<table> --> marker to a "
                      "docs/*.md)",
                      "docs/results/stray.json: no benchmark in disagg.bench.docs.REGISTRY writes it, and no doc "
                      "uses it"]


def test_a_missing_results_file_renders_pending_and_only_that_passes(tmp_path: Path) -> None:
    text = "<!-- results:later:summary -->\n| an old hand-written | table |\n<!-- /results -->\n"
    root = _repo(tmp_path, text)
    rep = docs.run(root, check=True, registry=REG)
    assert rep.pending == ["docs/bench.md:1: results:later:summary (no docs/results/later.json; run "
                           "`make bench-later`)"]
    assert len(rep.errors) == 1 and "is stale" in rep.errors[0] and "pending line" in rep.errors[0]
    docs.run(root, check=False, registry=REG)
    out = (root / "docs/bench.md").read_text()
    assert out == ("<!-- results:later:summary -->\n> **Pending:** `docs/results/later.json` does not exist yet: "
                   "run `make bench-later` to produce it (then `make docs` fills this table).\n<!-- /results -->\n")
    rep = docs.run(root, check=True, registry=REG)
    assert rep.errors == [] and len(rep.pending) == 1  # listed, never silent


def test_malformed_results_and_markers_are_errors(tmp_path: Path) -> None:
    root = _repo(tmp_path, DOC + "<!-- results:fake:main -->\nunclosed\n")
    (root / FAKE.results).write_text(json.dumps({"benchmark": "fake", "results": {}}))
    errors = docs.run(root, check=True, registry=REG).errors
    assert any("docs/results/fake.json: schema is None, want 1; command missing" in e for e in errors)
    assert "docs/bench.md:10: results:fake:main has no <!-- /results -->" in errors
    with pytest.raises(ValueError, match="machine missing"):
        results_io.write_results(tmp_path / "x.json", {"schema": 1, "benchmark": "x", "command": "c", "results": {}})


def test_main_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "a.md").write_text("<!-- results:nobody:t -->\n<!-- /results -->\n")
    assert docs.main(["--check", "--root", str(tmp_path)]) == 1
    assert "results:nobody:t names an unknown benchmark" in capsys.readouterr().err
    (tmp_path / "docs" / "a.md").write_text("# no markers\n")
    assert docs.main(["--check", "--root", str(tmp_path)]) == 0
    with pytest.raises(SystemExit):
        docs.main(["--root", str(tmp_path / "nowhere")])


def test_a_marker_quoted_in_prose_is_not_a_marker(tmp_path: Path) -> None:
    text = "Use `<!-- results:fake:main -->` … `<!-- /results -->` in a doc.\n" + DOC
    root = _repo(tmp_path, text, {"rows": {"a": 1}})
    docs.run(root, check=False, registry=REG)
    out = (root / "docs/bench.md").read_text()
    assert out.startswith("Use `<!-- results:fake:main -->` … `<!-- /results -->` in a doc.\n# B")
    assert out.count("| a | 1 |") == 1 and docs.run(root, check=True, registry=REG).errors == []
    bad = "<!-- results:fake -->\n<!-- /results -->\n"  # a whole-line marker without a table name
    (root / "docs/bench.md").write_text(bad + DOC)
    errors = docs.run(root, check=True, registry=REG).errors
    assert "docs/bench.md:1: malformed marker '<!-- results:fake -->' (want <!-- results:<benchmark>:<table> -->)" \
        in errors


def test_a_renderer_that_fails_is_reported_not_raised(tmp_path: Path) -> None:
    root = _repo(tmp_path, DOC, {"no_rows": True})
    errors = docs.run(root, check=True, registry=REG).errors
    assert errors == ["docs/bench.md:5: results:fake:main: tests.bench.test_results_docs.render_tables failed on "
                      "docs/results/fake.json: KeyError: 'rows'"]
