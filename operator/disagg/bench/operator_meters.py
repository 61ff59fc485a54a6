"""The operator benchmark's instruments (bench/operator_bench.py): the apiserver's request counters (writes by
class, reads), CPU per process and per thread class from /proc, the reconcile timer around the operator's
handlers, the sampler of its executor, a watch that stamps when each model's status and children change, and the
Events between two moments."""

from __future__ import annotations

import contextlib
import os
import re
import ssl
import statistics
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..api import GROUP, PLURAL, VERSION
from ..local.controlplane import ControlPlane

WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION")
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager")

_REQUEST_LINE = re.compile(r'^apiserver_request_total\{([^}]*)\}\s+([0-9.eE+-]+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')



def parse_request_totals(text: str) -> Counter[tuple[str, str, str, str]]:
    """``apiserver_request_total`` summed by (verb, resource, subresource, code) from the apiserver's /metrics."""
    out: Counter[tuple[str, str, str, str]] = Counter()
    for line in text.splitlines():
        m = _REQUEST_LINE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group(1)))
        key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""),
               labels.get("code", ""))
        out[key] += int(float(m.group(2)))
    return out


def writes_by_class(before: Counter[tuple[str, str, str, str]], after: Counter[tuple[str, str, str, str]],
                    ) -> dict[str, int]:
    """Successful (2xx) write requests between two scrapes, keyed "VERB resource[/subresource]" (zero classes left
    out; a refused write, e.g. a create answered 409 AlreadyExists, changed nothing)."""
    out: dict[str, int] = {}
    for key, value in after.items():
        verb, resource, sub, code = key
        delta = value - before.get(key, 0)
        if verb in WRITE_VERBS and code.startswith("2") and delta > 0:
            name = f"{verb} {resource}{'/' + sub if sub else ''}"
            out[name] = out.get(name, 0) + delta
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def reads_total(before: Counter[tuple[str, str, str, str]], after: Counter[tuple[str, str, str, str]]) -> int:
    return sum(v - before.get(k, 0) for k, v in after.items() if k[0] in ("GET", "LIST"))


class ApiserverMetrics:
    """Scrapes kube-apiserver's /metrics with the control plane's admin client certificate."""

    def __init__(self, cp: ControlPlane) -> None:
        kc = cp.kubeconfig_dict()
        user, cluster = kc["users"][0]["user"], kc["clusters"][0]["cluster"]
        self.ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.ctx.load_cert_chain(user["client-certificate"], user["client-key"])
        self.url = f"{cp.server}/metrics"

    def scrape(self) -> Counter[tuple[str, str, str, str]]:
        with urllib.request.urlopen(self.url, context=self.ctx, timeout=30) as r:
            return parse_request_totals(r.read().decode())


def _ticks(stat: str) -> tuple[str, int, int]:
    """(comm, ppid, utime+stime ticks) from a /proc/<pid>[/task/<tid>]/stat line."""
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    return comm, int(fields[1]), int(fields[11]) + int(fields[12])


BENCH_THREADS: set[int] = set()  # native ids of the benchmark's own threads (not the operator's)


def bench_thread() -> None:
    """Called first in every thread of the benchmark itself, so that its CPU is not counted as the operator's."""
    BENCH_THREADS.add(threading.get_native_id())


class CpuMeter:
    """CPU seconds of the control-plane processes (children of this process) and of the operator: this process
    minus the benchmark's own threads (main, creators, watches, sampler: ``bench_thread``)."""

    def __init__(self, handler_threads: str = "") -> None:
        self.hz = os.sysconf("SC_CLK_TCK")
        self.pid = os.getpid()
        self.handler_threads = handler_threads  # name prefix of kopf's executor threads (sync handlers)
        bench_thread()

    def read(self) -> dict[str, float]:
        out = dict.fromkeys((*CONTROL_PLANE, "operator", "operator_handlers", "benchmark"), 0.0)
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                comm, ppid, ticks = _ticks((entry / "stat").read_text())
                name = next((n for n in CONTROL_PLANE if n[:15] == comm), None)  # comm is cut at 15 characters
                if ppid == self.pid and name is not None:
                    out[name] += ticks / self.hz
        _, _, total = _ticks(Path(f"/proc/{self.pid}/stat").read_text())
        bench = 0
        for tid in list(BENCH_THREADS):
            with contextlib.suppress(OSError):
                bench += _ticks(Path(f"/proc/{self.pid}/task/{tid}/stat").read_text())[2]
        out["operator"] = (total - bench) / self.hz
        out["benchmark"] = bench / self.hz
        handlers = 0  # live executor threads only (an idle one that exited is counted in "operator" alone)
        for t in threading.enumerate():
            if self.handler_threads and t.name.startswith(self.handler_threads) and t.native_id:
                with contextlib.suppress(OSError):
                    handlers += _ticks(Path(f"/proc/{self.pid}/task/{t.native_id}/stat").read_text())[2]
        out["operator_handlers"] = handlers / self.hz
        return out


class ReconcileTimer:
    """Times every call of ``Reconciler.reconcile`` (by trigger class) and counts the calls in progress."""

    def __init__(self) -> None:
        self.durations: dict[str, list[float]] = {}
        self.in_flight = 0
        self.first: dict[str, float] = {}  # model → monotonic start of its first reconcile
        self.failures: Counter[str] = Counter()  # "trigger: error" → calls that raised (kopf retries handlers)
        self._lock = threading.Lock()

    @staticmethod
    def trigger_class(trigger: str) -> str:
        return trigger.split(" ")[0] if trigger else "other"  # "Deployment MODIFIED" → "Deployment"

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(namespace: str, name: str, *args: Any, trigger: str = "", **kwargs: Any) -> Any:
            t0 = time.monotonic()
            with self._lock:
                self.in_flight += 1
                self.first.setdefault(name, t0)
            try:
                return fn(namespace, name, *args, trigger=trigger, **kwargs)
            except Exception as exc:
                with self._lock:
                    self.failures[f"{self.trigger_class(trigger)}: {str(exc)[:120]}"] += 1
                raise
            finally:
                took = time.monotonic() - t0
                with self._lock:
                    self.in_flight -= 1
                    self.durations.setdefault(self.trigger_class(trigger), []).append(took)
        return timed

    def summary(self) -> dict[str, dict[str, float]]:
        out = {}
        with self._lock:
            for cls, ds in sorted(self.durations.items(), key=lambda kv: -len(kv[1])):
                s = sorted(ds)
                out[cls] = {"calls": len(s), "total_s": round(sum(s), 2),
                            "p50_ms": round(1000 * s[len(s) // 2], 1),
                            "p95_ms": round(1000 * s[min(len(s) - 1, int(len(s) * 0.95))], 1),
                            "max_ms": round(1000 * s[-1], 1)}
        return out


class Sampler:
    """Every ``interval`` seconds: the sync handler calls waiting for a kopf worker thread (the executor's queue)
    and the reconciles in progress."""

    def __init__(self, executor: Any, timer: ReconcileTimer, interval: float = 0.5) -> None:
        self.executor, self.timer, self.interval = executor, timer, interval
        self.queued: list[int] = []
        self.in_flight: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def _run(self) -> None:
        bench_thread()
        while not self._stop.wait(self.interval):
            queue = getattr(self.executor, "_work_queue", None)
            self.queued.append(queue.qsize() if queue is not None else 0)
            self.in_flight.append(self.timer.in_flight)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def mark(self) -> int:
        return len(self.queued)

    def summary(self, start: int = 0, end: int | None = None) -> dict[str, float]:
        q, f = self.queued[start:end] or [0], self.in_flight[start:end] or [0]
        return {"queued_max": max(q), "queued_mean": round(statistics.fmean(q), 1),
                "in_flight_max": max(f), "in_flight_mean": round(statistics.fmean(f), 1)}


def reported(model: dict[str, Any]) -> bool:
    """The operator's first complete report: status for generation 1 with a Ready condition."""
    status = model.get("status") or {}
    return bool(status.get("observedGeneration") == model["metadata"].get("generation")
                and any(c.get("type") == "Ready" for c in status.get("conditions") or []))


class ModelWatch:
    """The benchmark's view of the models and Deployments, from two watches (cheap for the apiserver, unlike
    listing 500 models every second): when each model's status was first written, and the latest copies."""

    def __init__(self, api: Any, namespace: str) -> None:
        from kubernetes import client, watch

        self.co = client.CustomObjectsApi(api)
        self.watch_mod = watch
        self.ns = namespace
        self.models: dict[str, dict[str, Any]] = {}
        self.deployments: dict[str, dict[str, Any]] = {}
        self.reported: dict[str, float] = {}  # model → monotonic time its status first had generation 1 + Ready
        self._stop = threading.Event()
        self._watches: list[Any] = []
        self._threads = [threading.Thread(target=self._loop, args=(kind,), daemon=True, name=f"bench-watch-{kind}")
                         for kind in ("models", "deployments")]

    def _stream(self, kind: str, w: Any) -> Iterator[dict[str, Any]]:
        # Both through the generic API: plain dicts, not the client's typed models (costly to build, and this
        # process's CPU is shared with the operator's).
        group, version, plural = (GROUP, VERSION, PLURAL) if kind == "models" else ("apps", "v1", "deployments")
        yield from w.stream(self.co.list_namespaced_custom_object, group, version, self.ns, plural,
                            timeout_seconds=3600)

    def _loop(self, kind: str) -> None:
        bench_thread()
        while not self._stop.is_set():
            w = self.watch_mod.Watch()
            self._watches.append(w)
            with contextlib.suppress(Exception):  # a dropped watch is re-opened (the copies stay)
                for ev in self._stream(kind, w):
                    obj = ev["object"]
                    name = obj["metadata"]["name"]
                    store = self.models if kind == "models" else self.deployments
                    if ev["type"] == "DELETED":
                        store.pop(name, None)
                        continue
                    store[name] = obj
                    if kind == "models" and name not in self.reported and reported(obj):
                        self.reported[name] = time.monotonic()
                    if self._stop.is_set():
                        return

    def __enter__(self) -> ModelWatch:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for w in self._watches:
            w.stop()


def event_index(api: Any) -> dict[str, tuple[str, int]]:
    """Every Event in the cluster: uid → ("reporting component: reason", count)."""
    from kubernetes import client

    out: dict[str, tuple[str, int]] = {}
    for e in client.CoreV1Api(api).list_event_for_all_namespaces().items:
        source = e.reporting_component or (e.source.component if e.source else None) or "?"
        out[str(e.metadata.uid)] = (f"{source}: {e.reason}", int(e.count or 1))
    return out


def events_between(before: dict[str, tuple[str, int]], after: dict[str, tuple[str, int]]) -> dict[str, int]:
    """Events written between two listings, by "reporting component: reason" (who wrote them: the apiserver's
    request counters cannot tell the operator from kube-controller-manager); "(repeated)": an existing Event whose
    count went up."""
    out: Counter[str] = Counter()
    for uid, (what, count) in after.items():
        was = before.get(uid)
        if was is None:
            out[what] += 1
        elif count > was[1]:
            out[f"{what} (repeated)"] += count - was[1]
    return dict(out.most_common())
