"""Operator convergence for N models, where the time goes, and the writes in a quiet minute.

Runs the real operator (kopf, in process via KopfRunner) against the real local control plane (etcd +
kube-apiserver + kube-controller-manager, ``disagg.local.controlplane``): N copies of
``docs/examples/llama-8b-nvlink.yaml`` are created at once in one namespace. Measured per run:

- **convergence**: when every model's status carries ``observedGeneration`` 1 and a ``Ready`` condition (the
  operator's first complete report: every child applied, status written), when every Deployment reports its
  replicas (kube-controller-manager's part), and when every model's ``status.pools`` shows those replicas (the
  status has caught up with the cluster). The models never become ``Ready=True``: there is no kubelet, so no pod
  ever runs (``Ready=False``, reason ``PrefillStarting``: the status a real cluster shows while pods start);
- **where the time goes**: the apiserver's own request counters (``apiserver_request_total`` from its /metrics,
  by verb and resource: every writer, ours and kube-controller-manager's), the operator's reconcile latency by
  trigger (timed around ``Reconciler.reconcile``; it includes the wait for the model's lock), the sync handler
  calls waiting for one of kopf's worker threads (its executor's queue: kopf's queueing), and the CPU seconds of
  the operator (this process without the benchmark's main thread), kube-apiserver, etcd and
  kube-controller-manager (from /proc);
- **quiet minute**: after convergence (the operator idle and the statuses settled), the apiserver writes in a
  window with no change (default 60 s), by verb and resource, and the operator's own writes in it (must be 0).

``render_tables`` turns the results JSON (``docs/results/operator.json``) into the tables of docs/benchmarks.md §5.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from ..api import GROUP, PLURAL, VERSION
from ..local.controlplane import REPO_ROOT, ControlPlane
from ..poll import WaitTimeoutError, wait_for
from .operator_meters import (
    ApiserverMetrics,
    CpuMeter,
    ModelWatch,
    ReconcileTimer,
    Sampler,
    bench_thread,
    event_index,
    events_between,
    reads_total,
    writes_by_class,
)

EXAMPLE = REPO_ROOT / "docs" / "examples" / "llama-8b-nvlink.yaml"
NAMESPACE = "bench"
WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION")
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager")
CREATORS = 8  # concurrent create calls of the benchmark's client
TARGET_MODELS, TARGET_SECONDS = 500, 60.0  # issue 17: 500 models with their status within 60 s on 2 cores

def command_line(models: list[int], steady_window_s: float, out: Path | None, controller_manager: bool = True) -> str:
    parts = ["disagg bench operator", "--models", *map(str, models), "--steady-window", f"{steady_window_s:g}"]
    if not controller_manager:
        parts.append("--without-controller-manager")
    if out is not None:
        parts += ["--out", str(out)]
    return " ".join(parts)


def deployment_settled(d: dict[str, Any]) -> bool:
    return bool((d.get("status") or {}).get("replicas", 0) == (d.get("spec") or {}).get("replicas")
                and (d.get("status") or {}).get("observedGeneration") == d["metadata"].get("generation"))


def status_current(model: dict[str, Any], deployments: dict[str, dict[str, Any]]) -> bool:
    """Does the model's status show what its worker Deployments report (pools.<pool>.replicas)?"""
    name = model["metadata"]["name"]
    pools = (model.get("status") or {}).get("pools") or {}
    for role in ("prefill", "decode"):
        d = deployments.get(f"{name}-{role}")
        if d is None or (pools.get(role) or {}).get("replicas") != (d.get("status") or {}).get("replicas", 0):
            return False
    return True


# ------------------------------------------------------------------------------------------- one run

def _phase(check: Callable[[], bool], timeout: float, what: str, t0: float) -> float | None:
    """Seconds from t0 until ``check`` holds (polled), or None when it did not within ``timeout``."""
    try:
        wait_for(check, timeout, what, interval=0.5)
    except WaitTimeoutError:
        return None
    return round(time.monotonic() - t0, 2)


def run(models: int, steady_window_s: float = 60.0, timeout: float = 900.0, settle_timeout: float = 600.0,
        say: Callable[[str], None] = print, controller_manager: bool = True) -> dict[str, Any]:
    """One count on a fresh control plane. ``controller_manager=False`` leaves kube-controller-manager out (no
    ReplicaSets, pods or Deployment status: the operator's own cost on the apiserver, alone)."""
    import kopf
    from kopf.testing import KopfRunner
    from kubernetes import client

    from ..api import DisaggregatedModel
    from ..api.crd import build_crd
    from ..builders import build_children
    from ..controller.handlers import ControllerConfig, operator_settings, register
    from ..kube import api_client, install_crd

    load_start = [round(x, 2) for x in os.getloadavg()]  # the machine is shared: how busy it was
    with ControlPlane(with_controller_manager=controller_manager) as cp:
        api = api_client(cp.kubeconfig)
        install_crd(api, build_crd())
        client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
        base = yaml.safe_load(EXAMPLE.read_text())
        registry = kopf.OperatorRegistry()
        config = ControllerConfig(kubeconfig=str(cp.kubeconfig))
        rec_build = config.build
        rec = register(registry, config)
        timer = ReconcileTimer()
        rec.reconcile = timer.wrap(rec.reconcile)  # type: ignore[method-assign]  # the handlers call it late-bound
        settings = operator_settings()
        metrics = ApiserverMetrics(cp)
        cpu = CpuMeter(getattr(settings.execution.executor, "_thread_name_prefix", "") or "ThreadPoolExecutor")
        co = client.CustomObjectsApi(api)
        with (ThreadPoolExecutor(CREATORS, thread_name_prefix="bench-create", initializer=bench_thread) as creators,
              KopfRunner(["run", "--standalone", "-n", NAMESPACE], registry=registry, settings=settings,
                         timeout=60),
              ModelWatch(api, NAMESPACE) as watch,
              Sampler(settings.execution.executor, timer) as sampler):
            m0, c0 = metrics.scrape(), cpu.read()
            w0, a0 = rec.kube.writes, int(rec.counters["applies"])
            say(f"{models} models: creating")
            t0 = time.monotonic()

            def create(i: int) -> None:
                body = copy.deepcopy(base)
                body["metadata"]["name"] = f"m{i}"
                co.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)

            list(creators.map(create, range(models)))  # "at once": as a GitOps sync or a script would
            created = time.monotonic() - t0

            wait_for(lambda: len(watch.reported) == models, timeout,
                     "every model's status (observedGeneration 1 + Ready)", interval=0.2)
            all_reported = max(watch.reported.values()) - t0
            m1, c1, q1 = metrics.scrape(), cpu.read(), sampler.mark()
            say(f"{models} models: every status reported after {all_reported:.1f}s")

            def all_settled() -> bool:
                return len(watch.deployments) == 3 * models and all(
                    deployment_settled(d) for d in list(watch.deployments.values()))

            def all_current() -> bool:
                return len(watch.models) == models and all(
                    status_current(m, watch.deployments) for m in list(watch.models.values()))

            # kube-controller-manager's part (ReplicaSets, pods, Deployment status) may outlast the deadline at
            # large N on a loaded machine: then the figure is null and the quiet window shows its writes.
            settled = current = None
            if controller_manager:
                settled = _phase(all_settled, settle_timeout, "every Deployment to report its replicas", t0)
                current = _phase(all_current, settle_timeout, "every model's status to show its Deployments' replicas",
                                 t0)
            say(f"{models} models: Deployments settled after {settled}s, statuses current after {current}s")

            # Idle: no reconcile running or queued for 3 s in a row (polled), then the quiet window.
            idle_since: list[float] = []

            def idle() -> bool:
                if timer.in_flight or (sampler.queued[-1:] or [0])[0]:
                    idle_since.clear()
                    return False
                if not idle_since:
                    idle_since.append(time.monotonic())
                return time.monotonic() - idle_since[0] >= 3.0

            wait_for(idle, timeout, "the operator to go idle", interval=0.25)
            m2, c2, q2 = metrics.scrape(), cpu.read(), sampler.mark()
            w2, r2 = rec.kube.writes, int(rec.counters["reconciles"])
            ready_when = time.monotonic() - t0
            say(f"{models} models: quiet window of {steady_window_s:g}s")
            events0 = event_index(api)
            time.sleep(steady_window_s)  # the measurement itself: a window with no change, not a synchronisation
            m3, c3 = metrics.scrape(), cpu.read()
            quiet_events = events_between(events0, event_index(api))
            quiet_operator = rec.kube.writes - w2
            quiet_reconciles = int(rec.counters["reconciles"]) - r2

        reported_lat = sorted(v - t0 for v in watch.reported.values())
        converge_writes = writes_by_class(m0, m2)
        converge_s = ready_when
        result = {
            "models": models,
            "controller_manager": controller_manager,
            "loadavg": {"start": load_start, "end": [round(x, 2) for x in os.getloadavg()]},
            "children_per_model": len(build_children(DisaggregatedModel.model_validate(base), rec_build)),
            "created_s": round(created, 2),
            "status_reported_s": round(all_reported, 2),
            "status_reported_p50_s": round(reported_lat[len(reported_lat) // 2], 2),
            "deployments_settled_s": settled,
            "status_current_s": current,
            "idle_s": round(converge_s, 2),
            "target": {"models": TARGET_MODELS, "seconds": TARGET_SECONDS,
                       "met": models >= TARGET_MODELS and all_reported <= TARGET_SECONDS},
            "applies": int(rec.counters["applies"]) - a0,
            "status_patches": int(rec.counters["status_patches"]),
            "reconciles": int(rec.counters["reconciles"]),
            "operator_writes": w2 - w0,
            "to_status": {
                "apiserver_writes": writes_by_class(m0, m1),
                "apiserver_writes_total": sum(writes_by_class(m0, m1).values()),
                "apiserver_reads": reads_total(m0, m1),
                "writes_per_s": round(sum(writes_by_class(m0, m1).values()) / max(all_reported, 1e-9), 1),
                "cpu_s": {k: round(c1[k] - c0[k], 1) for k in c1},
                "queue": sampler.summary(0, q1),
            },
            "to_idle": {
                "apiserver_writes": converge_writes,
                "apiserver_writes_total": sum(converge_writes.values()),
                "apiserver_reads": reads_total(m0, m2),
                "writes_per_s": round(sum(converge_writes.values()) / max(converge_s, 1e-9), 1),
                "cpu_s": {k: round(c2[k] - c0[k], 1) for k in c2},
                "queue": sampler.summary(0, q2),
            },
            "reconcile_latency": timer.summary(),
            "reconcile_failures": dict(timer.failures.most_common(10)),
            "counters": {k: int(v) for k, v in rec.counters.items()},
            "quiet": {
                "window_s": steady_window_s,
                "apiserver_writes": writes_by_class(m2, m3),
                "apiserver_writes_total": sum(writes_by_class(m2, m3).values()),
                "operator_writes": quiet_operator,
                "events_by_source": quiet_events,
                "reconciles": quiet_reconciles,
                "cpu_s": {k: round(c3[k] - c2[k], 1) for k in c3},
            },
        }
    return result


# ------------------------------------------------------------------------------------------ output

def _fmt_s(v: Any) -> str:
    return "–" if v is None else f"{v:.1f} s"


def _load(r: dict[str, Any]) -> str:
    load = r.get("loadavg") or {}
    return " → ".join(f"{v[0]:.1f}" for v in (load.get("start"), load.get("end")) if v) or "–"


def _label(r: dict[str, Any]) -> str:
    return str(r["models"]) if r.get("controller_manager", True) else f"{r['models']} (no controller-manager)"


def render_tables(results_doc: dict[str, Any]) -> dict[str, str]:
    """Markdown tables from docs/results/operator.json: ``summary`` (convergence per N), ``time`` (where the time
    goes until every status is reported), ``quiet`` (writes in the quiet window)."""
    runs = results_doc["results"]["runs"]
    summary = ["| models | created | every status reported (p50) | Deployments settled | statuses current "
               "| operator idle | applies | status patches | reconciles | target (500 in 60 s) | load average |",
               "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in runs:
        target = ("met" if r["target"]["met"] else "missed") if r["models"] >= TARGET_MODELS else "n/a"
        summary.append(
            f"| {_label(r)} | {_fmt_s(r['created_s'])} | {_fmt_s(r['status_reported_s'])} "
            f"({_fmt_s(r['status_reported_p50_s'])}) | {_fmt_s(r['deployments_settled_s'])} "
            f"| {_fmt_s(r['status_current_s'])} | {_fmt_s(r['idle_s'])} | {r['applies']} | {r['status_patches']} "
            f"| {r['reconciles']} | {target} | {_load(r)} |")
    time_rows = ["| models | phase | apiserver writes (per s) | top write classes | apiserver reads "
                 "| CPU s: operator (its handler threads) / apiserver / etcd / controller-manager "
                 "| CPU s in all ÷ 2 cores | kopf queue max (mean) |",
                 "| ---: | --- | ---: | --- | ---: | --- | ---: | ---: |"]
    for r in runs:
        for phase, key in (("to every status", "to_status"), ("to idle", "to_idle")):
            p = r[key]
            top = ", ".join(f"{k} {v}" for k, v in list(p["apiserver_writes"].items())[:4])
            cpu = p["cpu_s"]
            total = sum(cpu.get(k, 0.0) for k in ("operator", *CONTROL_PLANE))
            time_rows.append(
                f"| {_label(r)} | {phase} | {p['apiserver_writes_total']} ({p['writes_per_s']}) | {top} "
                f"| {p['apiserver_reads']} | {cpu['operator']} ({cpu.get('operator_handlers', 0.0)}) / "
                f"{cpu['kube-apiserver']} / {cpu['etcd']} / {cpu['kube-controller-manager']} "
                f"| {total:.1f} ÷ 2 = {total / 2:.1f} s | {p['queue']['queued_max']} ({p['queue']['queued_mean']}) |")
    latency = ["| models | trigger | calls | total s | p50 ms | p95 ms | max ms |",
               "| ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in runs:
        for cls, v in r["reconcile_latency"].items():
            latency.append(f"| {_label(r)} | {cls} | {v['calls']} | {v['total_s']} | {v['p50_ms']} "
                           f"| {v['p95_ms']} | {v['max_ms']} |")
    quiet = ["| models | window | apiserver writes | by class | Events written, by reporting component "
             "| operator writes | reconciles | operator CPU s |",
             "| ---: | ---: | ---: | --- | --- | ---: | ---: | ---: |"]
    for r in runs:
        q = r["quiet"]
        classes = ", ".join(f"{k} {v}" for k, v in q["apiserver_writes"].items()) or "none"
        events = ", ".join(f"{k} {v}" for k, v in (q.get("events_by_source") or {}).items()) or "none"
        quiet.append(f"| {_label(r)} | {q['window_s']:g} s | {q['apiserver_writes_total']} | {classes} | {events} "
                     f"| {q['operator_writes']} | {q['reconciles']} | {q['cpu_s']['operator']} |")
    return {"summary": "\n".join(summary), "time": "\n".join(time_rows), "latency": "\n".join(latency),
            "quiet": "\n".join(quiet)}


def results_doc(runs: list[dict[str, Any]], command: str, machine: dict[str, Any]) -> dict[str, Any]:
    from .. import results

    return results.results_doc("operator", command, {"example": str(EXAMPLE.relative_to(REPO_ROOT)),
                                                  "namespace": NAMESPACE, "runs": runs}, machine)


def main(models: list[int], out: Path | None, steady_window_s: float, controller_manager: bool = True) -> int:
    for n in models:
        if n < 1:
            raise SystemExit(f"--models: {n} is not a positive count")
    if steady_window_s <= 0:
        raise SystemExit(f"--steady-window: {steady_window_s:g} must be > 0 seconds")
    from .. import results

    machine = results.machine_facts(loadavg_start=[round(x, 2) for x in os.getloadavg()])
    command = results.invoked_command(command_line(models, steady_window_s, out, controller_manager))
    runs = []
    for n in models:
        # (sys.__stderr__: KopfRunner's click runner swaps sys.stdout/sys.stderr while the operator runs)
        runs.append(run(n, steady_window_s, controller_manager=controller_manager,
                        say=lambda m: print(f"bench operator: {m}", file=sys.__stderr__, flush=True)))
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    doc = results_doc(runs, command, machine)
    for name, table in render_tables(doc).items():
        print(f"\n{name}:\n{table}")
    if out:
        results.write_results(out, doc)
    return 0
