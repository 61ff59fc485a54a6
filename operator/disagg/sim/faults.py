"""The sim's fault table: one declaration per fault, from which everything else derives.

Each field of :class:`Faults` *is* a row of the table: its name is the runtime attribute and the admin key
(``POST /sim/faults``), its :class:`Kind` says the type, the validation and how a CLI/env string is read, and
its metadata carries the help. From the rows come the ``--fault-<name>`` flags and ``DISAGG_SIM_FAULT_<NAME>``
variables (:func:`disagg.sim.args.build_parser`), the values parsed into ``SimConfig.faults``
(:meth:`Faults.from_values`), the admin update (:meth:`Faults.update`) and the fault table of
docs/simulator.md (:func:`markdown_table`; ``python -m disagg.sim.faults docs/simulator.md`` rewrites it, a test
fails when it drifts).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Kind:
    """A fault's value type: how a CLI/env string is read, how a JSON value is checked, how docs name it."""

    type: type
    values: str  # for the docs: the accepted values
    from_text: Callable[[str], Any]  # CLI/env string → value; raises argparse.ArgumentTypeError
    check: Callable[[str, Any], Any]  # (name, JSON value) → value; raises ValueError naming the field


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None


def _text_fraction(text: str) -> float:
    v = _number(text)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return v


def _text_non_negative(text: str) -> float:
    v = _number(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def _text_count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def _text_switch(text: str) -> bool:
    return str(text).lower() in _TRUE


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_non_negative(name: str, v: Any) -> float:
    if not _is_number(v) or v < 0:
        raise ValueError(f"{name} must be a non-negative number")
    return float(v)


def _check_fraction(name: str, v: Any) -> float:
    rate = _check_non_negative(name, v)
    if rate > 1:
        raise ValueError(f"{name} must be between 0 and 1")
    return rate


def _check_count(name: str, v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ValueError(f"{name} must be a non-negative integer")
    return v


def _check_switch(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{name} must be a boolean")
    return v


RATE = Kind(float, "0–1", _text_fraction, _check_fraction)
MILLIS = Kind(float, "≥ 0 (simulated ms)", _text_non_negative, _check_non_negative)
COUNT = Kind(int, "integer ≥ 0", _text_count, _check_count)
SWITCH = Kind(bool, "bool (CLI/env: `1`, `true`, `yes`, `on` mean true)", _text_switch, _check_switch)


def fault(kind: Kind, default: Any, text: str) -> Any:
    """One row of the fault table (a dataclass field of :class:`Faults`); ``text`` is its help."""
    return dataclasses.field(default=default, metadata={"kind": kind, "help": text})


@dataclass
class Faults:
    """Injected faults, changeable at run time through ``POST /sim/faults``. One field = one fault."""

    kv_transfer_fail_rate: float = fault(RATE, 0.0, "probability a KV pull (decode side) fails; the request is then "
                                                    "recomputed or failed per `kv_load_failure_policy`")
    kv_transfer_delay_ms: float = fault(MILLIS, 0.0, "simulated ms added to every KV pull")
    prefill_error_rate: float = fault(RATE, 0.0, "probability a request needing local prefill gets HTTP 500")
    error_rate: float = fault(RATE, 0.0, "probability any completion request gets HTTP 500")
    prefill_stall_ms: float = fault(MILLIS, 0.0, "simulated ms added to every step that runs prompt tokens")
    health_fail: bool = fault(SWITCH, False, "`/health` answers 503")
    crash_after_requests: int = fault(COUNT, 0, "the N-th completion request gets HTTP 500 and the process exits 1 "
                                                "(0: never)")

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> Faults:
        """Build from already-validated values by fault name (missing names keep their defaults)."""
        return cls(**{spec.name: values[spec.name] for spec in FAULTS if spec.name in values})

    def update(self, data: dict[str, Any]) -> None:
        """Apply a partial update (admin endpoint), all or nothing; raises ValueError naming the bad field."""
        checked: dict[str, Any] = {}
        for k, v in data.items():
            spec = FAULTS_BY_NAME.get(k)
            if spec is None:
                raise ValueError(f"unknown fault {k!r}; known: {', '.join(FAULT_FIELDS)}")
            checked[k] = spec.kind.check(k, v)
        for k, v in checked.items():
            setattr(self, k, v)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in FAULT_FIELDS}


@dataclass(frozen=True)
class FaultSpec:
    """A row of the table as the rest of the sim reads it."""

    name: str
    kind: Kind
    default: Any
    help: str

    @property
    def flag(self) -> str:
        return "--fault-" + self.name.replace("_", "-")


def _rows() -> Iterator[FaultSpec]:
    for f in dataclasses.fields(Faults):
        yield FaultSpec(f.name, f.metadata["kind"], f.default, f.metadata["help"])


FAULTS: tuple[FaultSpec, ...] = tuple(_rows())
FAULTS_BY_NAME: dict[str, FaultSpec] = {spec.name: spec for spec in FAULTS}
FAULT_FIELDS: tuple[str, ...] = tuple(FAULTS_BY_NAME)

DOCS_BEGIN = "<!-- BEGIN fault table: generated from disagg/sim/faults.py by `python -m disagg.sim.faults " \
             "docs/simulator.md`; do not edit by hand -->"
DOCS_END = "<!-- END fault table -->"


def _doc_default(spec: FaultSpec) -> str:
    if isinstance(spec.default, bool):
        return "true" if spec.default else "false"
    return f"{spec.default:g}" if isinstance(spec.default, float) else str(spec.default)


def markdown_table(env_name: Callable[[str], str]) -> str:
    """The fault table of docs/simulator.md (``env_name`` maps a flag to its variable)."""
    lines = ["| Admin key (`/sim/faults`) | Flag | Env | Default | Values | Effect |", "|---|---|---|---|---|---|"]
    for spec in FAULTS:
        lines.append(f"| `{spec.name}` | `{spec.flag}` | `{env_name(spec.flag)}` | {_doc_default(spec)} | "
                     f"{spec.kind.values} | {spec.help} |")
    return "\n".join(lines)


def replace_docs_table(text: str, table: str) -> str:
    """``text`` with the block between the markers replaced by ``table``; ValueError without the markers."""
    head, begin, rest = text.partition(DOCS_BEGIN)
    _, end, tail = rest.partition(DOCS_END)
    if not begin or not end:
        raise ValueError("the fault-table markers are missing")
    return f"{head}{DOCS_BEGIN}\n{table}\n{DOCS_END}{tail}"


def docs_table(text: str) -> str:
    """The table currently between the markers of ``text``."""
    _, begin, rest = text.partition(DOCS_BEGIN)
    table, end, _ = rest.partition(DOCS_END)
    if not begin or not end:
        raise ValueError("the fault-table markers are missing")
    return table.strip("\n")


def main(argv: list[str]) -> int:
    from .args import env_name

    table = markdown_table(env_name)
    if not argv:
        print(table)
        return 0
    path = Path(argv[0])
    path.write_text(replace_docs_table(path.read_text(), table))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
