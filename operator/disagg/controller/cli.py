"""``disagg operator`` (run the controller) and ``disagg render`` (print the child manifests of a CR file)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..builders import BuildSettings


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("operator", help="run the DisaggregatedModel operator (kopf)")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], metavar="NS",
                       help="watch this namespace (repeatable; glob patterns allowed)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch the whole cluster (default)")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    p.add_argument("--router-image", default=None, help="router image (default: $DISAGG_ROUTER_IMAGE or built-in)")
    p.add_argument("--router-replicas", type=int, default=None, help="router replicas per model (default 1)")
    p.add_argument("--upgrade-rollout-bound", type=float, default=None, metavar="SECONDS",
                   help="operator upgrades roll one model's GPU pools at a time; the next model starts when the "
                        "previous one has finished rolling out or after this many seconds "
                        "(default: $DISAGG_UPGRADE_ROLLOUT_BOUND_SECONDS or 1800)")
    p.add_argument("--liveness", default="http://0.0.0.0:8080/healthz",
                   help="liveness endpoint URL, or '' to disable (default: %(default)s)")
    peer = p.add_mutually_exclusive_group()
    peer.add_argument("--standalone", action="store_true", default=True,
                      help="no peering: assume one operator instance (default)")
    peer.add_argument("--peering", metavar="NAME", default=None,
                      help="coordinate replicas through kopf peering object NAME (needs kopf's peering CRDs)")
    p.add_argument("--priority", type=int, default=0, help="peering priority of this instance")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics (disagg_operator_*) on this port")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--log-format", choices=("json", "console"), default="json")
    p.set_defaults(func=_cmd_operator, needs_sizer=True)  # disagg.cli gives it args.sizer_for (plan/sizing.py)

    p = subparsers.add_parser("render", help="print the manifests the operator creates for a DisaggregatedModel")
    p.add_argument("file", nargs="?", type=Path, help="DisaggregatedModel YAML (multi-document allowed; - = stdin)")
    p.add_argument("-f", "--filename", dest="filename", type=Path, default=None, help="same as FILE")
    p.add_argument("-n", "--namespace", default=None,
                   help="namespace of the children (default: the CR's metadata.namespace, else 'default')")
    p.add_argument("--router-image", default=None, help="router image (default: $DISAGG_ROUTER_IMAGE or built-in)")
    p.add_argument("--router-replicas", type=int, default=None)
    p.set_defaults(func=_cmd_render)


def _build_settings(args: argparse.Namespace) -> BuildSettings:
    from dataclasses import replace

    from ..builders import BuildSettings

    settings = BuildSettings.from_env()
    if args.router_image:
        settings = replace(settings, router_image=args.router_image)
    if args.router_replicas is not None:
        settings = replace(settings, router_replicas=args.router_replicas)
    return settings


def _cmd_render(args: argparse.Namespace) -> int:
    import yaml

    from ..api.models import parse_model
    from ..api.validate import errors_of
    from ..builders import build_children

    path: Path | None = args.filename or args.file
    if path is None:
        print("disagg render: give a file (disagg render FILE, or -f FILE)", file=sys.stderr)
        return 2
    text = sys.stdin.read() if str(path) == "-" else path.read_text()
    settings = _build_settings(args)
    out: list[dict[str, Any]] = []
    failed = False
    for i, doc in enumerate(yaml.safe_load_all(text)):
        if doc is None:
            continue
        name = (doc.get("metadata") or {}).get("name", f"#{i}")
        ref = f"{path}:{name}"
        if doc.get("kind") != "DisaggregatedModel":
            print(f"{ref}: kind {doc.get('kind')!r} is not DisaggregatedModel; skipped", file=sys.stderr)
            continue
        # the apiserver's checks and the operator's (as on a cluster without the LeaderWorkerSet CRD, which is how
        # the children are rendered): the builders render only what both admit
        errors = errors_of({k: v for k, v in doc.items() if k != "status"})
        if errors:
            failed = True
            for e in errors:
                print(f"{ref}: {e}", file=sys.stderr)
            continue
        doc = dict(doc)
        doc["metadata"] = {**(doc.get("metadata") or {})}
        doc["metadata"]["namespace"] = args.namespace or doc["metadata"].get("namespace") or "default"
        out += build_children(parse_model(doc), settings)
    if failed:
        return 1
    sys.stdout.write(yaml.safe_dump_all(out, sort_keys=False, width=120))
    return 0


def _cmd_operator(args: argparse.Namespace) -> int:
    import os

    import kopf

    from .. import logs
    from ..autoscaling.access import default_from_env
    from .handlers import ControllerConfig, operator_settings, register
    from .upgrade import UPGRADE_BOUND_SECONDS

    logs.configure(level=args.log_level, json=args.log_format == "json")
    registry = kopf.get_default_registry()
    bound = args.upgrade_rollout_bound
    if bound is None:
        bound = float(os.environ.get("DISAGG_UPGRADE_ROLLOUT_BOUND_SECONDS") or UPGRADE_BOUND_SECONDS)
    try:  # a wrong operator setting (DISAGG_ROUTER_*, DISAGG_TRACING_*, DISAGG_PROMETHEUS_*) stops it here, named
        config = ControllerConfig(kubeconfig=args.kubeconfig, build=_build_settings(args), upgrade_bound=bound,
                                  default_prometheus=default_from_env(os.environ),
                                  sizer_for=getattr(args, "sizer_for", None))
    except ValueError as e:
        print(f"disagg operator: {e}", file=sys.stderr)
        return 2
    reconciler = register(registry, config)
    if args.metrics_port:
        from prometheus_client import REGISTRY, start_http_server

        from .metrics import ReconcilerCollector

        REGISTRY.register(ReconcilerCollector(reconciler))
        start_http_server(args.metrics_port)
    settings = operator_settings()
    namespaces = args.namespace or []
    kopf.run(
        registry=registry,
        settings=settings,
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=args.priority,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=args.liveness or None,
    )
    return 0
