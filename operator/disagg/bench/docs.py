"""Benchmark tables in the docs, generated from the committed results (issue 17): ``python -m disagg.bench.docs``.

The convention, in one place:

* every benchmark writes one small JSON file, ``docs/results/<name>.json``, shaped
  ``{"schema": 1, "benchmark": name, "command": <the exact command>, "machine": {cpus, cpu, python, platform,
  date, ...}, "results": {...}}`` (:func:`results_doc`, :func:`machine_facts`, :func:`write_results`);
* its module exposes ``render_tables(results_doc: dict) -> dict[str, str]`` (table name → markdown);
* a doc (``docs/*.md``) places a table with a marker pair, each marker a line of its own::

      <!-- results:<benchmark>:<table> -->
      (generated: the table, then a line naming the results file, the command, the machine and the date)
      <!-- /results -->

``python -m disagg.bench.docs`` rewrites every marked block from the results files (``make docs``; ``make bench``
ends with it). ``--check`` changes nothing and exits 1 naming each block that is stale, each marker that names an
unknown benchmark or table, each malformed results file and each results file that no doc uses
(tests/bench/test_results_docs.py runs it on the repo).

A benchmark whose results file does not exist yet is *pending*: its blocks hold one line saying so and naming the
command that produces it (:func:`pending_text`). ``--check`` accepts exactly that line for a missing file and
lists every pending block on stdout; a block with anything else in it (an old hand-written table, say) is stale.
A pending block's table name cannot be checked (there is no results document to render); it is once the file exists.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..results import validate

RESULTS_DIR = Path("docs") / "results"
DOCS_DIR = Path("docs")


@dataclass(frozen=True)
class Benchmark:
    """A benchmark whose results the docs show: its results file, the module with ``render_tables``, the command
    that produces the file."""

    name: str
    module: str
    produce: str

    @property
    def results(self) -> Path:
        return RESULTS_DIR / f"{self.name}.json"


REGISTRY: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("goodput", "disagg.bench.goodput", "make bench-goodput"),
    Benchmark("goodput-heldout", "disagg.bench.goodput", "make bench-goodput-heldout"),
    Benchmark("goodput-16gpu", "disagg.bench.goodput", "make bench-goodput-16gpu"),
    Benchmark("router", "disagg.bench.router_bench", "make bench-router"),
    Benchmark("sim", "disagg.sim.bench", "make bench-sim"),
    Benchmark("autoscale", "disagg.bench.autoscale", "make bench-autoscale"),
    Benchmark("autoscale_day", "disagg.bench.autoscale_day", "disagg bench autoscale --virtual"),
    Benchmark("autoscale_day-2h", "disagg.bench.autoscale_day",
              "python -m disagg.bench.autoscale_day --day 7200 --scalers predictive --name autoscale_day-2h"),
    Benchmark("operator", "disagg.bench.operator_bench", "make bench-operator"),
    Benchmark("soak", "disagg.bench.soak", "make bench-soak"),
    Benchmark("plan", "disagg.bench.plan_accuracy", "make bench-plan"),
    Benchmark("twin", "disagg.twin.bench", "make bench-twin"),
    Benchmark("overload", "disagg.bench.overload", "make bench-overload"),
    Benchmark("real-engine", "disagg.bench.real_engine", "make bench-real-engine"),
    Benchmark("decision", "disagg.bench.decision", "make bench-decision"),
    Benchmark("prefix-cache", "disagg.bench.prefix_cache", "disagg bench prefix-cache"),
    Benchmark("prediction", "disagg.bench.prediction", "make bench-prediction"),
    # measured on an H200 (torch, not vLLM); it feeds the twin's calibration, whose module renders it
    Benchmark("h200-microbench", "disagg.sim.bench", "make gpu-microbench (on an H200)"),
    Benchmark("h200-steps", "disagg.sim.bench", "make gpu-microbench (on an H200)"),
)}

BEGIN = re.compile(r"<!-- results:(?P<bench>[A-Za-z0-9_.-]+):(?P<table>[A-Za-z0-9_.-]+) -->")
END = "<!-- /results -->"
# a marker is a line of its own (a marker quoted inside a sentence or inline code is prose)
ANY_MARKER = re.compile(r"^<!-- (?:results:[^>]*|/results) -->[ \t]*$", re.MULTILINE)


# ------------------------------------------------------------------------------------------------ rendering
def describe_machine(m: dict[str, Any]) -> str:
    cpus = m.get("cpus") or m.get("nproc") or m.get("cores")
    cpu = m.get("cpu") or m.get("cpu_model")
    parts = []
    if cpus:
        parts.append(f"{cpus} CPUs" + (f" ({cpu})" if cpu else ""))
    if m.get("gpu"):
        parts.append(str(m["gpu"]))
    if m.get("python"):
        parts.append(f"Python {m['python']}")
    return ", ".join(parts) or "machine not recorded"


def provenance(doc: dict[str, Any], results: Path, doc_path: Path) -> str:
    """The line under a generated table: results file, command, machine, date."""
    link = Path(os.path.relpath(results, doc_path.parent)).as_posix()
    return (f"<sub>Generated by `python -m disagg.bench.docs` from [`{results.as_posix()}`]({link}): "
            f"`{doc['command']}` on {describe_machine(doc['machine'])}, {doc['machine']['date']}.</sub>")


def pending_text(bench: Benchmark) -> str:
    return (f"> **Pending:** `{bench.results.as_posix()}` does not exist yet: run `{bench.produce}` to produce "
            f"it (then `make docs` fills this table).")


def block_body(table: str, footer: str) -> str:
    return f"\n{table.strip()}\n\n{footer}\n"


@dataclass
class Block:
    doc: Path  # relative to the root
    line: int
    bench: str
    table: str
    start: int  # offset of the body (just after the begin marker)
    end: int  # offset of the end marker

    @property
    def where(self) -> str:
        return f"{self.doc.as_posix()}:{self.line}"


@dataclass
class Report:
    errors: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # stale blocks (--check) or rewritten ones


def find_blocks(text: str, doc: Path) -> tuple[list[Block], list[str]]:
    """The marker pairs of one doc, and the marker errors (unclosed, nested, stray end)."""
    blocks: list[Block] = []
    errors: list[str] = []
    open_: tuple[re.Match[str], int, int] | None = None  # (begin marker, its line, offset after it)
    for m in ANY_MARKER.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        marker = m.group(0).rstrip()
        if marker == END:
            if open_ is None:
                errors.append(f"{doc.as_posix()}:{line}: {END} without a results marker before it")
                continue
            begin, bline, body_start = open_
            blocks.append(Block(doc, bline, begin["bench"], begin["table"], body_start, m.start()))
            open_ = None
            continue
        b = BEGIN.fullmatch(marker)
        if b is None:
            errors.append(f"{doc.as_posix()}:{line}: malformed marker {marker!r} "
                          "(want <!-- results:<benchmark>:<table> -->)")
            continue
        if open_ is not None:
            errors.append(f"{doc.as_posix()}:{open_[1]}: results:{open_[0]['bench']}:{open_[0]['table']} is not "
                          f"closed before the next marker (line {line})")
        open_ = (b, line, m.end())
    if open_ is not None:
        errors.append(f"{doc.as_posix()}:{open_[1]}: results:{open_[0]['bench']}:{open_[0]['table']} has no {END}")
    return blocks, errors


class Renderer:
    """Loads each benchmark's results once and renders its tables (or says why it cannot)."""

    def __init__(self, root: Path, registry: dict[str, Benchmark]) -> None:
        self.root = root
        self.registry = registry
        self._tables: dict[str, tuple[dict[str, Any] | None, dict[str, str] | None, str | None]] = {}

    def load(self, name: str) -> tuple[dict[str, Any] | None, dict[str, str] | None, str | None]:
        """(results doc, tables, error); (None, None, None) when the results file does not exist (pending)."""
        if name not in self._tables:
            self._tables[name] = self._load(self.registry[name])
        return self._tables[name]

    def _load(self, bench: Benchmark) -> tuple[dict[str, Any] | None, dict[str, str] | None, str | None]:
        path = self.root / bench.results
        if not path.exists():
            return None, None, None
        try:
            doc = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            return None, None, f"{bench.results.as_posix()}: not JSON ({e})"
        problems = validate(doc, bench.name)
        if problems:
            return None, None, f"{bench.results.as_posix()}: " + "; ".join(problems)
        try:
            render = importlib.import_module(bench.module).render_tables
        except (ImportError, AttributeError) as e:
            return None, None, f"{bench.module}.render_tables: {e} (benchmark {bench.name!r})"
        try:
            tables = render(doc)
        except Exception as e:  # noqa: BLE001 - any failure of a benchmark's renderer is reported as its error
            return None, None, f"{bench.module}.render_tables failed on {bench.results.as_posix()}: " \
                               f"{type(e).__name__}: {e}"
        if not isinstance(tables, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in tables.items()):
            return None, None, f"{bench.module}.render_tables did not return a dict of str → str"
        return doc, tables, None


def expected_body(rend: Renderer, registry: dict[str, Benchmark], blk: Block, rep: Report,
                used: set[str]) -> tuple[str | None, str]:
    """What a block should hold and where that comes from; (None, why) after recording an error in ``rep``."""
    label = f"results:{blk.bench}:{blk.table}"
    bench = registry.get(blk.bench)
    if bench is None:
        rep.errors.append(f"{blk.where}: {label} names an unknown benchmark (known: {', '.join(registry)})")
        return None, ""
    used.add(bench.name)
    doc, tables, err = rend.load(bench.name)
    if err:
        rep.errors.append(f"{blk.where}: {label}: {err}")
        return None, ""
    if doc is None or tables is None:
        rep.pending.append(f"{blk.where}: {label} (no {bench.results.as_posix()}; run `{bench.produce}`)")
        return f"\n{pending_text(bench)}\n", (f"the pending line ({bench.results.as_posix()} does not exist, so "
                                              "the block holds only that line)")
    if blk.table not in tables:
        rep.errors.append(f"{blk.where}: {label} names an unknown table of {bench.module}.render_tables "
                          f"(it renders: {', '.join(tables) or 'nothing'})")
        return None, ""
    return block_body(tables[blk.table], provenance(doc, bench.results, blk.doc)), \
        f"what {bench.results.as_posix()} renders"


def run(root: Path, check: bool, registry: dict[str, Benchmark] | None = None) -> Report:
    """Regenerate (or, with ``check``, only compare) every marked block under ``root/docs/*.md``."""
    registry = REGISTRY if registry is None else registry
    rep = Report()
    rend = Renderer(root, registry)
    used: set[str] = set()
    for path in sorted((root / DOCS_DIR).glob("*.md")):
        rel = path.relative_to(root)
        text = path.read_text()
        blocks, errors = find_blocks(text, rel)
        rep.errors += errors
        out: list[str] = []
        pos = 0
        for blk in blocks:
            body = text[blk.start:blk.end]
            want, what = expected_body(rend, registry, blk, rep, used)
            if want is not None and want != body:
                rep.changed.append(f"{blk.where}: results:{blk.bench}:{blk.table}")
                if check:
                    rep.errors.append(f"{blk.where}: results:{blk.bench}:{blk.table} is stale: it differs from "
                                      f"{what} (run `python -m disagg.bench.docs`)")
            else:
                want = body
            out.append(text[pos:blk.start])
            out.append(want)
            pos = blk.end
        out.append(text[pos:])
        new = "".join(out)
        if not check and new != text:
            path.write_text(new)
    for bench in registry.values():
        if (root / bench.results).exists() and bench.name not in used:
            rep.errors.append(f"{bench.results.as_posix()}: no doc uses it (add a <!-- results:{bench.name}:<table> "
                              "--> marker to a docs/*.md)")
    known = {bench.results.as_posix() for bench in registry.values()}
    for path in sorted((root / RESULTS_DIR).glob("*.json")):
        name = path.relative_to(root).as_posix()
        if name not in known:
            rep.errors.append(f"{name}: no benchmark in disagg.bench.docs.REGISTRY writes it, and no doc uses it")
    return rep


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m disagg.bench.docs",
                                description="Regenerate the benchmark tables in docs/*.md from docs/results/*.json.")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when a table is stale or a "
                   "marker or results file is wrong")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="the repository (default: the current directory)")
    args = p.parse_args(argv)
    if not (args.root / DOCS_DIR).is_dir():
        p.error(f"--root {args.root}: no docs/ directory there")
    rep = run(args.root, args.check)
    for line in rep.pending:
        print(f"pending: {line}")
    if not args.check:
        for line in rep.changed:
            print(f"updated: {line}")
    for line in rep.errors:
        print(f"error: {line}", file=sys.stderr)
    if not rep.errors:
        print("docs: " + ("up to date" if args.check or not rep.changed else f"{len(rep.changed)} block(s) updated"))
    return 1 if rep.errors else 0


if __name__ == "__main__":
    sys.exit(main())
