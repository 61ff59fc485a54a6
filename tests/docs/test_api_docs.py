"""docs/api.md's `kubectl get dm` sentence lists the CRD's printer columns as kubectl prints them: the default
columns (priority 0), then what `-o wide` adds (priority > 0), in the CRD's order."""

from __future__ import annotations

import re

import yaml
from tests.paths import REPO

from disagg.api.crd import build_crd

API = REPO / "docs" / "api.md"
COLUMN = re.compile(r"(?<![\w.-])[A-Z][A-Z0-9]*(?:-[A-Z0-9]+)*(?![\w-])")


def _columns(text: str) -> list[str]:
    """Column names (NAME, TTFT-P95, …) of a sentence, parenthesised explanations left out."""
    return COLUMN.findall(re.sub(r"\([^)]*\)", "", text))


def _documented() -> tuple[list[str], list[str], bool]:
    """(default columns, the columns -o wide adds, whether the doc says they come before AGE)."""
    text = " ".join(API.read_text().split())
    start = text.index("`kubectl get dm` columns:")
    default, rest = text[start:].split("`kubectl get dm -o wide` adds", 1)
    wide = rest.split(";", 1)[0].split(". ", 1)[0]
    before_age = " before AGE" in wide
    return (_columns(default.removeprefix("`kubectl get dm` columns:")),
            _columns(wide.split(" before AGE", 1)[0]), before_age)


def _printer_columns() -> list[dict[str, object]]:
    cols: list[dict[str, object]] = build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    on_disk = yaml.safe_load((REPO / "crds" / "disaggregatedmodels.yaml").read_text())
    assert on_disk["spec"]["versions"][0]["additionalPrinterColumns"] == cols, "crds/ is stale: run `disagg crds`"
    return cols


def test_the_doc_lists_the_default_and_the_wide_columns() -> None:
    cols = _printer_columns()
    names = [str(c["name"]).upper() for c in cols]
    default = ["NAME"] + [n for n, c in zip(names, cols, strict=True) if not c.get("priority")]
    wide = [n for n, c in zip(names, cols, strict=True) if c.get("priority")]
    assert wide, "the CRD has wide-only columns: the doc's `-o wide` part would be vacuous otherwise"
    doc_default, doc_wide, before_age = _documented()
    assert doc_default == default, f"api.md's default columns {doc_default} are not the CRD's {default}"
    assert doc_wide == wide, f"api.md's -o wide columns {doc_wide} are not the CRD's priority > 0 ones {wide}"
    if before_age:  # kubectl keeps the CRD's order: the wide columns print where they are defined
        assert max(names.index(n) for n in wide) < names.index("AGE")


def test_the_doc_no_longer_says_wide_adds_nothing() -> None:
    text = " ".join(API.read_text().split())
    assert "the same with `-o wide`" not in text
    assert "READY" in _documented()[0]
