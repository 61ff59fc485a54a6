"""Wiring: config watcher (and its ConfigMap watch in cluster mode), workers (static flags or pod discovery),
Router and aiohttp server, until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .. import logs
from ..builders.vllm import KV_EVENTS_PORT
from .config import ConfigWatcher
from .kvsub import kv_endpoints
from .load import WorkerSet, parse_worker_arg
from .policy_types import Tuning
from .server import Router, RouterOptions

log = logs.get("disagg.router")


def _kv_port(args: argparse.Namespace, static: bool) -> int:
    """--kv-events-port, else the operator's port in cluster mode and off with static worker URLs."""
    port = getattr(args, "kv_events_port", None)
    if port is not None:
        return int(port)
    return 0 if static else KV_EVENTS_PORT


@dataclass
class RouterApp:
    router: Router
    host: str
    port: int
    discovery_args: dict[str, Any] | None = None
    shutdown_grace: float = 30.0
    worker_index: int | None = None  # one of `--workers N` (prefork.py): listen with SO_REUSEPORT

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RouterApp:
        watcher = ConfigWatcher(args.config, interval=args.config_poll_seconds)
        workers = WorkerSet()
        static = bool(args.prefill or args.decode or args.aggregated)
        if static:
            for role, values in (("prefill", args.prefill), ("decode", args.decode),
                                 ("aggregated", args.aggregated)):
                workers.set_pool(role, [parse_worker_arg(v) for v in values])
        opts = RouterOptions(
            max_body_bytes=args.max_body_bytes, chars_per_token=args.chars_per_token,
            scrape_interval=args.scrape_interval, client_write_timeout=args.client_write_timeout,
            header_timeout=args.header_timeout, idle_timeout=args.idle_timeout,
            max_connections=args.max_connections,
            tuning=Tuning(decode_pressure_kv_usage=args.decode_pressure_kv_usage,
                          decode_pressure_running=args.decode_pressure_running,
                          hedge_factor=args.hedge_factor, hedge_min_s=args.hedge_min_ms / 1000.0,
                          elastic_idle_s=args.elastic_idle_seconds),
            tokenize=getattr(args, "tokenize", None),
            workers=getattr(args, "workers", 1),
            otlp_traces_endpoint=getattr(args, "otlp_traces_endpoint", None),
            trace_sample_ratio=getattr(args, "trace_sample_ratio", None),
            kv_events=kv_endpoints(_kv_port(args, static), getattr(args, "kv_events_replay_port", 0),
                                   getattr(args, "kv_events_endpoint", [])),
            kv_events_topic=getattr(args, "kv_events_topic", ""),
        )
        discovery = None
        if not static:
            discovery = {"namespace": args.namespace, "model": args.model_name, "kubeconfig": args.kubeconfig}
        return cls(Router(watcher, workers, opts), args.host, args.port, discovery,
                   worker_index=getattr(args, "worker_index", None))

    def _start_discovery(self) -> None:
        from ..kube import api_client
        from .configwatch import ConfigMapWatch
        from .discovery import PodDiscovery, model_name_from_config

        d = self.discovery_args or {}
        cfg = self.router.config
        model = d.get("model") or model_name_from_config(cfg)
        if not model:
            raise SystemExit("disagg router: cluster mode needs --model-name or `pools` services in the config")
        ports = {role: getattr(cfg.pools, role).port if getattr(cfg.pools, role) else 8000
                 for role in ("prefill", "decode", "aggregated")}
        kube = api_client(d.get("kubeconfig"))
        loop = asyncio.get_running_loop()
        # The router's own ConfigMap through the API: a new router.yaml applies in well under a second, not when
        # the kubelet refreshes the mounted file (up to about a minute); the file poll is the fallback.
        ConfigMapWatch(self.router.watcher, d["namespace"], model, loop, kube).start()
        disc = PodDiscovery(self.router.workers, d["namespace"], model, ports, loop, kube)
        disc.start()
        log.info("discovery_started", namespace=d["namespace"], model=model)

    async def serve_forever(self) -> None:
        runner = self.router.runner(access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, backlog=2048, shutdown_timeout=self.shutdown_grace,
                           reuse_port=self.worker_index is not None or None)
        await site.start()
        if self.discovery_args is not None:
            self._start_discovery()
        log.info("router_listening", host=self.host, port=self.port,
                 workers={r: [w.url for w in self.router.workers.pools[r].values()] for r in WorkerSet.ROLES},
                 mode=self.router.config.effective_mode().value,
                 **({} if self.worker_index is None else {"worker": self.worker_index, "pid": os.getpid()}))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):  # pragma: no cover
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("router_stopping")
        await runner.cleanup()
