"""The one command line: ``disagg <subcommand>``."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

# Each part of the project that owns a subcommand exposes ``add_parser(subparsers)`` in its own
# ``cli`` module (argument definitions only; heavy imports happen inside the handler). Every module listed here
# must exist: a missing one is an error (SubcommandError), never a subcommand silently left out.
SUBCOMMAND_MODULES = (
    "disagg.controller.cli",  # operator, render
    "disagg.router.cli",  # router
    "disagg.sim.cli",  # sim
    "disagg.bench.cli",  # bench
    "disagg.plan.cli",  # plan
    "disagg.twin.cli",  # twin
)


class SubcommandError(RuntimeError):
    """A registered subcommand module is missing or does not define ``add_parser``."""


def _register(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        # the module itself (or a package above it) is missing — not a module it imports
        if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
            raise SubcommandError(f"subcommand module {name} is registered in disagg.cli but does not exist") from e
        raise
    add_parser = getattr(module, "add_parser", None)
    if not callable(add_parser):
        raise SubcommandError(f"subcommand module {name} defines no add_parser(subparsers)")
    add_parser(sub)


DEFAULT_CRD_PATH = Path("crds/disaggregatedmodels.yaml")
CHART_CRD_PATH = Path("charts/disagg-operator/crds/disaggregatedmodels.yaml")


def _cmd_crds(args: argparse.Namespace) -> int:
    from .api.crd import render_crd_yaml

    text = render_crd_yaml()
    if str(args.out) == "-":
        sys.stdout.write(text)
        return 0
    # the chart ships a byte-identical copy when the default output is used
    outs = [args.out] + ([CHART_CRD_PATH] if args.out == DEFAULT_CRD_PATH and CHART_CRD_PATH.parent.is_dir() else [])
    if args.check:
        stale = [o for o in outs if (o.read_text() if o.exists() else "") != text]
        for o in stale:
            print(f"{o} is out of date with operator/disagg/api/models.py: run `disagg crds`", file=sys.stderr)
        if not stale:
            print(", ".join(map(str, outs)) + " up to date")
        return 1 if stale else 0
    for o in outs:
        o.parent.mkdir(parents=True, exist_ok=True)
        o.write_text(text)
        print(f"wrote {o}")
    return 0


def _yaml_error(path: str, exc: Exception) -> str:
    """``<file>:<line>:<column>: <problem>`` for YAML that does not parse (1-based, as editors count)."""
    import yaml

    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}"
        problem = exc.problem or "invalid YAML"
        if exc.context:
            context = exc.context
            if exc.context_mark is not None and exc.context_mark.line != mark.line:
                context += f" at line {exc.context_mark.line + 1}"
            problem += f" ({context})"
        return f"{where}: {problem}"
    return f"{path}: invalid YAML: {exc}"


def _cmd_validate(args: argparse.Namespace) -> int:
    import yaml

    from .api.validate import validate_documents

    failures = 0
    for path in args.files:
        try:
            for ref, errors in validate_documents(Path(path)):
                if errors:
                    failures += 1
                    for e in errors:
                        print(f"{ref}: {e}", file=sys.stderr)
                else:
                    print(f"{ref}: valid")
        except yaml.YAMLError as exc:  # the documents before the broken one were reported above
            failures += 1
            print(_yaml_error(path, exc), file=sys.stderr)
        except (OSError, UnicodeDecodeError) as exc:
            failures += 1
            print(f"{path}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
    return 1 if failures else 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo.run import run_demo

    return run_demo(keep=args.keep, results_dir=args.results, quick=args.quick, node=args.node)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="disagg", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("crds", help="generate the DisaggregatedModel CRD from the API models")
    p.add_argument("--out", type=Path, default=DEFAULT_CRD_PATH, help="output file, or - for stdout")
    p.add_argument("--check", action="store_true", help="exit 1 if --out differs from the generated CRD")
    p.set_defaults(func=_cmd_crds)

    p = sub.add_parser("validate", help="validate DisaggregatedModel YAML files offline (same rules as the CRD)")
    p.add_argument("files", nargs="+", help="YAML files (multi-document allowed)")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("demo", help="the whole loop on this machine: route, fall back, scale (see README)")
    p.add_argument("--keep", action="store_true", help="keep everything running at the end until Ctrl-C")
    p.add_argument("--quick", action="store_true", help="half-length traffic phases")
    p.add_argument("--results", type=Path, default=None, help="results directory (default results/demo-<time>)")
    p.add_argument("--node", choices=("process", "real"), default="process",
                   help="process: pods run as processes (default, fast); real: kubelet + containerd on this machine, "
                        "the chart installed by Helm, pods are containers (root; docs/development.md 'The real node')")
    p.set_defaults(func=_cmd_demo)

    for name in SUBCOMMAND_MODULES:
        _register(sub, name)
    return parser


def _wire(args: argparse.Namespace) -> None:
    """Parts a subcommand takes from a layer above its own, given here, at the top: the operator's predictive
    autoscaler sizes pools with the capacity planner's performance model (disagg.plan sits above the controller)."""
    if getattr(args, "needs_sizer", False):
        from .plan.sizing import sizer_for_spec

        args.sizer_for = sizer_for_spec


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _wire(args)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
