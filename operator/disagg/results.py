"""Writing a benchmark's results document: the convention's data side (docs/benchmarks.md; the docs side, tables
generated from these files, is disagg.bench.docs).

Every benchmark writes one small JSON file, ``docs/results/<name>.json``, shaped ``{"schema": 1, "benchmark": name,
"command": <the exact command>, "machine": {cpus, cpu, python, platform, date, ...}, "results": {...}}``. This
module is standard library only and sits below every benchmark (the simulator's, the twin's and disagg.bench's), so
none of them imports the docs generator.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SCHEMA = 1


def machine_facts(**extra: Any) -> dict[str, Any]:
    """Where a benchmark ran: cores, CPU model, Python, platform, date (UTC, ISO seconds), plus ``extra``."""
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), cpu)
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "platform": platform.platform(), "date": datetime.now(UTC).isoformat(timespec="seconds"), **extra}


def invoked_command(default: str) -> str:
    """The command line as typed when run as ``disagg ...``; ``default`` (the equivalent command) otherwise."""
    if Path(sys.argv[0]).name == "disagg":
        return shlex.join(["disagg", *sys.argv[1:]])
    return default


def results_doc(benchmark: str, command: str, results: dict[str, Any],
                machine: dict[str, Any] | None = None) -> dict[str, Any]:
    """The results document of the convention."""
    return {"schema": SCHEMA, "benchmark": benchmark, "command": command, "machine": machine or machine_facts(),
            "results": results}


def write_results(path: Path, doc: dict[str, Any]) -> None:
    problems = validate(doc, doc.get("benchmark", "?"))
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str, ensure_ascii=False) + "\n")


def validate(doc: Any, name: str) -> list[str]:
    """What is wrong with a results document (empty when nothing)."""
    if not isinstance(doc, dict):
        return ["not a JSON object"]
    out = []
    if doc.get("schema") != SCHEMA:
        out.append(f"schema is {doc.get('schema')!r}, want {SCHEMA}")
    if doc.get("benchmark") != name:
        out.append(f"benchmark is {doc.get('benchmark')!r}, want {name!r}")
    if not isinstance(doc.get("command"), str) or not doc["command"].strip():
        out.append("command missing (the exact command that produced it)")
    machine = doc.get("machine")
    if not isinstance(machine, dict) or not machine.get("date"):
        out.append("machine missing or without a date")
    if not isinstance(doc.get("results"), dict):
        out.append("results missing (an object)")
    return out
