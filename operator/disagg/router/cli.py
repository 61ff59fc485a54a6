"""``disagg router``: the data-plane router (argument definitions only; heavy imports in the handler)."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
from collections.abc import Callable, Coroutine
from typing import Any

from ..api.contract import ROUTER_PORT
from ..builders.vllm import KV_EVENTS_PORT, KV_EVENTS_REPLAY_PORT
from .policy_types import Tuning


def _non_negative(text: str) -> float:
    """A finite number ≥ 0 (argparse names the flag in its error)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return v

def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "router",
        help="OpenAI-compatible router: per-request remote/local prefill with fallbacks",
        description="Local mode: --prefill/--decode URLs (URL or URL#compat-hash). Cluster mode (neither given): "
        "discover ready worker pods of the pools named in the config's `pools` in $POD_NAMESPACE.",
    )
    p.add_argument("--host", default="127.0.0.1", help="listen address (0.0.0.0 in a pod)")
    p.add_argument("--port", type=int, default=ROUTER_PORT, help="listen port")
    p.add_argument("--config", help="RouterConfig YAML (the operator's ConfigMap key router.yaml); "
                   "reloaded on change (cluster mode: its ConfigMap is also watched through the API)")
    p.add_argument("--prefill", nargs="+", default=[], metavar="URL", help="prefill worker base URLs")
    p.add_argument("--decode", nargs="+", default=[], metavar="URL", help="decode worker base URLs")
    p.add_argument("--aggregated", nargs="+", default=[], metavar="URL",
                   help="aggregated workers (serve mode Aggregated and fallbacks when present)")
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE"),
                   help="cluster mode: namespace of the worker pods (default $POD_NAMESPACE)")
    p.add_argument("--model-name", default=os.environ.get("DISAGG_MODEL_NAME"),
                   help="cluster mode: the DisaggregatedModel's name (default: from the config's pool Services)")
    p.add_argument("--kubeconfig", default=None, help="cluster mode: kubeconfig (default in-cluster, then ~/.kube)")
    p.add_argument("--config-poll-seconds", type=float, default=1.0, help="how often --config is checked")
    p.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between worker /metrics scrapes")
    p.add_argument("--max-body-bytes", type=int, default=16 * 1024 * 1024, help="largest request body accepted")
    p.add_argument("--chars-per-token", type=float, default=4.0,
                   help="input-token estimate for text prompts (bytes per token)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer.json for exact input-token counts (needs the `tokenizers` package)")
    p.add_argument("--client-write-timeout", type=float, default=30.0,
                   help="drop a streaming client that does not accept data for this many seconds")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="close a connection that has not sent a complete request head within this many seconds "
                   "(0: off)")
    p.add_argument("--idle-timeout", type=float, default=75.0,
                   help="close an idle keep-alive connection after this many seconds")
    p.add_argument("--max-connections", type=int, default=4096,
                   help="close new client connections at once while this many are open")
    p.add_argument("--decode-pressure-kv-usage", type=float, default=0.5,
                   help="requireDecodePoolPressure: a decode worker is under pressure at this KV-cache usage")
    p.add_argument("--decode-pressure-running", type=int, default=8,
                   help="… or with this many running + waiting sequences")
    p.add_argument("--hedge-factor", type=_non_negative, default=Tuning.hedge_factor,
                   help="a remote stream whose first token is this many times later than its decode worker's recent "
                   "remote first tokens (per prompt token) gets a local prefill beside it; the first answer serves "
                   "(fallback cause kv_transfer_slow); 0: off")
    p.add_argument("--hedge-min-ms", type=_non_negative, default=Tuning.hedge_min_s * 1000,
                   help="… and at least this many milliseconds after its decode leg started")
    p.add_argument("--elastic-idle-seconds", type=_non_negative, default=Tuning.elastic_idle_s,
                   help="one elastic fleet (policy Thresholds): a request kept local may run whole on a prefill "
                   "worker that has had no remote prefill (nor a whole prompt longer than its chunk placed there by "
                   "policy SLO) for this many seconds and is less loaded than the decode worker; 0: off, and no whole "
                   "requests on prefill workers under policy SLO either")
    p.add_argument("--otlp-traces-endpoint", default=None, metavar="URL",
                   help="send OpenTelemetry traces to this collector: OTLP/HTTP to a traces URL "
                   "(http://jaeger:4318/v1/traces) or OTLP/gRPC to host:port (http://otel-collector:4317), as "
                   "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL says or inferred (a path: HTTP, none: gRPC); the router's "
                   "span per request and its legs' spans, with W3C "
                   "traceparent sent to the workers (default: off, no spans at all)")
    p.add_argument("--trace-sample-ratio", default=None, metavar="RATIO",
                   help="share of new traces kept, 0 to 1 (default 0.01); a client's sampled traceparent is "
                   "always followed. An invalid value falls back to the default with a log line and "
                   "disagg_tracing_errors_total{reason=\"invalid_sample_ratio\"}, never a failed start or request")
    p.add_argument("--kv-events-port", type=int, default=None,
                   help="each worker's KV cache events (vLLM --kv-events-config) at tcp://<worker host>:PORT: the "
                   f"exact prefix index (0: off, the estimate only; default {KV_EVENTS_PORT} in cluster mode, where "
                   "the operator renders it, off with static worker URLs)")
    p.add_argument("--kv-events-replay-port", type=int, default=KV_EVENTS_REPLAY_PORT,
                   help="each worker's KV event replay socket (0: none; gaps then reset the worker's entries)")
    p.add_argument("--kv-events-endpoint", action="append", default=[], metavar="URL=tcp://H:P[,tcp://H:R]",
                   help="a worker's KV event endpoints, overriding the ports (workers sharing a host)")
    p.add_argument("--kv-events-topic", default="", help="the publishers' topic (vLLM's KVEventsConfig.topic)")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--workers", type=int, default=1,
                   help="router processes sharing the port (SO_REUSEPORT), one per core; each has its own load "
                   "view, /metrics answers for all of them")
    p.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)  # set by the parent
    p.set_defaults(func=_cmd_router, router_parser=p)


def _tokenizer(path: str) -> Callable[[str], int]:
    from tokenizers import Tokenizer  # optional dependency

    tok = Tokenizer.from_file(path)
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def _cmd_router(args: argparse.Namespace) -> int:
    import asyncio
    import sys

    from .. import logs
    from .app import RouterApp

    logs.configure(args.log_level)
    if not (args.prefill or args.decode or args.aggregated) and not args.namespace:
        print("disagg router: give --prefill/--decode URLs (local mode) or run in a pod with POD_NAMESPACE "
              "(cluster mode)", file=sys.stderr)
        return 2
    if args.tokenizer:
        try:
            args.tokenize = _tokenizer(args.tokenizer)
        except ImportError:
            print("disagg router: --tokenizer needs the `tokenizers` package", file=sys.stderr)
            return 2
    else:
        args.tokenize = None
    if args.workers < 1:
        print("disagg router: --workers must be ≥ 1", file=sys.stderr)
        return 2
    if args.workers > 1 and args.worker_index is None:
        from .prefork import child_argv, supervise

        return supervise([child_argv(args.router_parser, args, i) for i in range(args.workers)])
    runner: Callable[[Coroutine[Any, Any, None]], None]
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(RouterApp.from_args(args).serve_forever())
    return 0
