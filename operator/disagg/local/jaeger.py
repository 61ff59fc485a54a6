"""A real Jaeger (v2: the OpenTelemetry-collector-based binary, built from the Go module proxy by
hack/build-jaeger.sh) on loopback: in-memory trace store, OTLP/HTTP and OTLP/gRPC receivers and the query API/UI on
free ports.

Used by the tracing tests and the demo. Stopped (process group killed, temp dir removed) by :meth:`LocalJaeger.stop`.
The query API is Jaeger's HTTP JSON API (``/api/traces/<id>``, ``/api/traces?service=…``), the one its UI uses.
A binary built from the Go module has no UI: Jaeger's JavaScript UI is built separately (npm) and embedded only in
release images, so the query port serves Jaeger's placeholder page at ``/``; :func:`waterfall` renders a trace as
text instead, and :meth:`LocalJaeger.trace_url` is the trace's JSON.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..htmlpage import SpanBar
from ..poll import WaitTimeoutError, wait_for
from .controlplane import REPO_ROOT
from .procs import HOST, free_ports, stop_group, tail_lines, wait_http

BUILD_SCRIPT = REPO_ROOT / "hack" / "build-jaeger.sh"


def jaeger_binary() -> str:
    """The cached binary (``DISAGG_JAEGER`` overrides), built on first use (many minutes on 2 cores)."""
    override = os.environ.get("DISAGG_JAEGER")
    if override:
        return override
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed ({proc.returncode}); it builds jaeger from the Go module proxy "
                           "and needs Go >= 1.24")
    return proc.stdout.strip().splitlines()[-1]


def config(otlp_http: str, query_http: str, query_grpc: str, health: str, max_traces: int = 100_000,
           otlp_grpc: str | None = None) -> dict[str, Any]:
    """A loopback-only all-in-one: OTLP/HTTP (and, given ``otlp_grpc``, OTLP/gRPC) in, memory store, query API out
    (Jaeger's own all-in-one.yaml, cmd/jaeger/internal/all-in-one.yaml in v1.76.0, less every other receiver and
    port)."""
    protocols: dict[str, Any] = {"http": {"endpoint": otlp_http}}
    if otlp_grpc:
        protocols["grpc"] = {"endpoint": otlp_grpc}
    return {
        "service": {
            "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
            "pipelines": {"traces": {"receivers": ["otlp"], "processors": ["batch"],
                                     "exporters": ["jaeger_storage_exporter"]}},
            "telemetry": {"resource": {"service.name": "jaeger"}, "metrics": {"level": "none"},
                          "logs": {"level": "warn"}},
        },
        "extensions": {
            "jaeger_query": {"storage": {"traces": "memstore"}, "http": {"endpoint": query_http},
                             "grpc": {"endpoint": query_grpc}},
            "jaeger_storage": {"backends": {"memstore": {"memory": {"max_traces": max_traces}}}},
            "healthcheckv2": {"use_v2": True, "http": {"endpoint": health}},
        },
        "receivers": {"otlp": {"protocols": protocols}},
        "processors": {"batch": {"timeout": "100ms"}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "memstore"}},
    }


@dataclass
class LocalJaeger:
    """``otlp_endpoint``: the OTLP/HTTP traces URL to give the router and the workers; ``otlp_grpc_endpoint``: the
    OTLP/gRPC one (``http://host:port``, no path); ``url``: the query API/UI."""

    otlp_endpoint: str = ""
    otlp_grpc_endpoint: str = ""
    url: str = ""
    _proc: subprocess.Popen[bytes] | None = None
    _tmp: Path | None = None
    _ports: list[int] = field(default_factory=list)

    def __enter__(self) -> LocalJaeger:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 60.0) -> None:
        binary = jaeger_binary()
        self._tmp = Path(tempfile.mkdtemp(prefix="disagg-jaeger-"))
        atexit.register(self.stop)
        otlp, query, grpc, health, otlp_grpc = self._ports = free_ports(5)
        cfg = config(f"{HOST}:{otlp}", f"{HOST}:{query}", f"{HOST}:{grpc}", f"{HOST}:{health}",
                     otlp_grpc=f"{HOST}:{otlp_grpc}")
        (self._tmp / "jaeger.yaml").write_text(yaml.safe_dump(cfg))
        self.otlp_endpoint = f"http://{HOST}:{otlp}/v1/traces"
        self.otlp_grpc_endpoint = f"http://{HOST}:{otlp_grpc}"
        self.url = f"http://{HOST}:{query}"
        with open(self._tmp / "jaeger.log", "ab") as log:
            self._proc = subprocess.Popen([binary, "--config", f"file:{self._tmp / 'jaeger.yaml'}"],
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_http(f"http://{HOST}:{health}/status", timeout, self._proc, interval=0.2)
            wait_http(f"{self.url}/api/services", timeout, self._proc, interval=0.2)
        except RuntimeError as e:
            raise RuntimeError(f"jaeger exited {self._proc.returncode}: {self.log_tail()}") from e
        except WaitTimeoutError as e:
            raise RuntimeError(f"jaeger not ready after {timeout}s: {self.log_tail()}") from e

    def trace_url(self, trace_id: str) -> str:
        """One trace as JSON from the query API (the UI path, ``/trace/<id>``, needs a Jaeger with its UI)."""
        return f"{self.url}/api/traces/{trace_id}"

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return json.load(r)

    def services(self) -> list[str]:
        return list(self._get("/api/services").get("data") or [])

    def traces(self, service: str, limit: int = 100) -> list[dict[str, Any]]:
        """Recent traces that hold a span of ``service`` (Jaeger's JSON model: spans, processes)."""
        q = urllib.parse.urlencode({"service": service, "limit": limit, "lookback": "1h"})
        return list(self._get(f"/api/traces?{q}").get("data") or [])

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        """One trace by id, or None while Jaeger does not have it."""
        try:
            data = self._get(f"/api/traces/{trace_id}").get("data") or []
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise
        return data[0] if data else None

    def wait_trace(self, trace_id: str, min_spans: int, timeout: float = 30.0) -> dict[str, Any]:
        """The trace once it holds at least ``min_spans`` spans (exporters batch; spans arrive in pieces)."""
        def ready() -> dict[str, Any] | None:
            t = self.trace(trace_id)
            return t if t is not None and len(t.get("spans") or []) >= min_spans else None

        return wait_for(ready, timeout, f"trace {trace_id} with {min_spans} spans in jaeger", interval=0.2)

    def log_tail(self, lines: int = 20) -> str:
        return tail_lines(self._tmp / "jaeger.log" if self._tmp else None, lines)

    def stop(self) -> None:
        stop_group(self._proc, grace=10)
        self._proc = None
        if self._tmp and self._tmp.exists():
            shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp = None


def spans_by_name(trace: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """A Jaeger trace's spans grouped by operation name, each with ``service`` (its process' serviceName) and
    ``tags`` as a dict added."""
    procs = trace.get("processes") or {}
    out: dict[str, list[dict[str, Any]]] = {}
    for s in trace.get("spans") or []:
        s = dict(s)
        s["service"] = (procs.get(s.get("processID")) or {}).get("serviceName")
        s["tag"] = {t["key"]: t["value"] for t in s.get("tags") or []}
        out.setdefault(s["operationName"], []).append(s)
    return out


def parent_id(span: dict[str, Any]) -> str | None:
    for ref in span.get("references") or []:
        if ref.get("refType") == "CHILD_OF":
            return str(ref["spanID"])
    return None


def span_bars(trace: dict[str, Any]) -> list[SpanBar]:
    """A Jaeger trace's spans in start order, each with its offset from the trace's start and duration in ms, its
    depth in the span tree, operation, service, and the latency attributes as a note (``gen_ai.latency.*`` in ms,
    ``disagg.decision``/``path``)."""
    spans = list(trace.get("spans") or [])
    if not spans:
        return []
    procs = trace.get("processes") or {}
    by_id = {s["spanID"]: s for s in spans}

    def depth(s: dict[str, Any]) -> int:
        d, p = 0, parent_id(s)
        while p in by_id and d < 32:
            d, p = d + 1, parent_id(by_id[p])
        return d

    t0 = min(s["startTime"] for s in spans)
    out = []
    for s in sorted(spans, key=lambda s: (s["startTime"], depth(s))):
        tags = {t["key"]: t["value"] for t in s.get("tags") or []}
        notes = [f"{k.removeprefix('gen_ai.latency.')}={v * 1000:.1f}" for k, v in sorted(tags.items())
                 if k.startswith("gen_ai.latency.") and isinstance(v, (int, float))]
        notes += [f"{k.removeprefix('disagg.')}={tags[k]}" for k in ("disagg.decision", "disagg.path")
                  if k in tags]
        out.append(SpanBar((s["startTime"] - t0) / 1000, s["duration"] / 1000, depth(s), s["operationName"],
                           (procs.get(s.get("processID")) or {}).get("serviceName", "?"), " ".join(notes)))
    return out


def waterfall(trace: dict[str, Any]) -> list[str]:
    """A trace as text (:func:`span_bars`), one line per span, indented by depth."""
    return [f"{b.start_ms:9.1f} ms {b.duration_ms:9.1f} ms  {'  ' * b.depth}{b.name} [{b.service}] {b.note}".rstrip()
            for b in span_bars(trace)]
