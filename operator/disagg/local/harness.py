"""One DisaggregatedModel on the local stack, driven from outside: deploy it, wait until it serves with both pools
ready, send traffic through its router, inject faults into its workers, and sample its status into a timeline.

Used by ``disagg demo``, ``disagg bench autoscale`` and the e2e tests (:class:`ModelHarness`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ..load import loadgen
from ..load.workload import Mix, Request, generate
from ..poll import WaitTimeoutError
from ..sim.args import env_name
from ..sim.faults import FAULTS_BY_NAME
from .controlplane import REPO_ROOT
from .stack import LocalStack, pod_ready

DEMO_MODEL = REPO_ROOT / "docs" / "examples" / "local-demo.yaml"
POOLS = ("prefill", "decode")
REAL_TIME = {"DISAGG_SIM_TIME_SCALE": "1.0"}  # the sims at the speed they model (the e2e tests' timing)


@contextlib.contextmanager
def started_stack(namespace: str, log_dir: Path | None, say: Callable[[str], None] = lambda _: None,
                  **stack: Any) -> Iterator[LocalStack]:
    """A started :class:`LocalStack` (``stack``: its options) with ``namespace`` created; stopped on exit."""
    from kubernetes import client

    local = LocalStack(namespace=namespace, log_dir=log_dir, **stack)
    try:
        local.start(say)
        client.CoreV1Api(local.api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        yield local
    finally:
        local.stop()


@contextlib.contextmanager
def serving(stack: LocalStack, overrides: dict[str, Any] | None = None, timeout: float = 120,
            **harness: Any) -> Iterator[ModelHarness]:
    """One model (``harness``: :class:`ModelHarness` options) deployed on ``stack`` with ``overrides`` and serving
    (:meth:`ModelHarness.deploy`); its sampler stopped on exit."""
    model = ModelHarness(stack, **harness)
    try:
        model.deploy(overrides, timeout=timeout)
        yield model
    finally:
        model.stop()


@dataclass
class Timeline:
    """Model status sampled once a second (for the plots and the e2e assertions)."""

    samples: list[dict[str, Any]] = field(default_factory=list)
    marks: list[tuple[float, str]] = field(default_factory=list)

    def mark(self, t0: float, label: str) -> None:
        self.marks.append((time.monotonic() - t0, label))

    def modes(self) -> list[str]:
        out: list[str] = []
        for s in self.samples:
            if s["mode"] and (not out or out[-1] != s["mode"]):
                out.append(s["mode"])
        return out

    def first_growth(self, pool: str, since: float) -> float | None:
        """Seconds after ``since`` when the pool's desired replicas first rose above their value then."""
        after = [s for s in self.samples if s["t"] >= since]
        if not after:
            return None
        base = after[0][f"{pool}_desired"]
        return next((s["t"] - since for s in after if s[f"{pool}_desired"] > base), None)


@dataclass
class PhaseResult:
    name: str
    results: list[loadgen.Result]
    summary: loadgen.Summary


def router_workers(metrics_text: str) -> dict[str, int]:
    """Ready workers per pool as the router sees them (its ``disagg_workers{pool}`` gauge)."""
    out: dict[str, int] = {}
    for fam in text_string_to_metric_families(metrics_text):
        if fam.name == "disagg_workers":
            for s in fam.samples:
                out[s.labels.get("pool", "")] = int(s.value)
    return out


def router_workers_at(router_url: str) -> dict[str, int]:
    """:func:`router_workers` of the router at ``router_url`` ({} when it does not answer)."""
    return router_workers(_get(router_url + "/metrics"))


def requests_running_at(worker_ip: str, port: int = 8000) -> float:
    """``vllm:num_requests_running`` of the worker (a pool's pod, a group's leader) at ``worker_ip`` (0 when it does
    not answer)."""
    text = _get(f"http://{worker_ip}:{port}/metrics")
    return sum(s.value for fam in text_string_to_metric_families(text) if fam.name == "vllm:num_requests_running"
               for s in fam.samples)


def not_serving(model: dict[str, Any], workers: dict[str, int]) -> str | None:
    """Why the model does not yet serve as deployed — None when it does: Ready, both pools (the decode pool alone
    when the spec pins Aggregated) at their desired replicas (at least one) and known to the router as that many
    ready workers, and, unless pinned Aggregated, in Disaggregated mode. A pool still starting (the prefill pod
    loading its model, say) is not ready, whatever the Ready condition says in the meantime."""
    spec, status = model.get("spec") or {}, model.get("status") or {}
    pinned_aggregated = spec.get("mode", "Auto") == "Aggregated"
    conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    if conds.get("Ready") != "True":
        return "condition Ready is not True"
    pools = status.get("pools") or {}
    for pool in ("decode",) if pinned_aggregated else POOLS:
        st = pools.get(pool) or {}
        desired, ready = int(st.get("desiredReplicas") or 0), int(st.get("readyReplicas") or 0)
        if desired < 1 or ready < desired:
            return f"{pool} pool {ready}/{desired} ready"
        if workers.get(pool, 0) < desired:
            return f"the router knows {workers.get(pool, 0)} ready {pool} workers of {desired}"
    mode = status.get("activeMode")
    if not pinned_aggregated and mode != "Disaggregated":
        return f"mode is {mode}"
    return None


def request_log_lines(paths: Iterable[Path]) -> dict[str, dict[str, Any]]:
    """The router's request log lines (docs/router.md "The request log") in these container logs, by request id.
    Only complete lines are read: the router may be writing the last one as the file is read (it has no newline
    yet), and a JSON line cut short is not a log line to parse or to skip."""
    out: dict[str, dict[str, Any]] = {}
    for path in paths:
        data = path.read_bytes() if path.exists() else b""
        for raw in data[:data.rfind(b"\n") + 1].splitlines():
            if raw.startswith(b"{"):
                line = orjson.loads(raw)
                if isinstance(line, dict) and line.get("event") == "request" and line.get("request_id"):
                    out[str(line["request_id"])] = line
    return out


class ModelHarness:
    """A DisaggregatedModel (``docs/examples/local-demo.yaml`` unless told otherwise) on a started LocalStack."""

    def __init__(self, stack: LocalStack, name: str = "demo", slo_ttft_ms: int = 3000, slo_tpot_ms: int = 60,
                 doc: Path = DEMO_MODEL) -> None:
        self.stack = stack
        self.name = name
        self.doc = doc
        self.slo = (slo_ttft_ms, slo_tpot_ms)
        self.served_name: str = yaml.safe_load(doc.read_text())["spec"]["model"]["servedName"]
        self.timeline = Timeline()
        self.t0 = time.monotonic()
        self.phases: list[PhaseResult] = []
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    # ------------------------------------------------------------------ set-up
    def deploy(self, overrides: dict[str, Any] | None = None, timeout: float = 120) -> str:
        """Apply the model and wait until it serves with both pools ready (:meth:`wait_serving`); returns the
        router's URL."""
        doc = yaml.safe_load(self.doc.read_text())
        doc["metadata"]["name"] = self.name
        doc["spec"]["autoscaling"]["prometheus"]["url"] = self.stack.prometheus.url
        for key, value in (overrides or {}).items():
            doc["spec"][key] = {**doc["spec"].get(key, {}), **value} if isinstance(value, dict) else value
        self.slo = (doc["spec"]["slo"]["ttftP95Ms"], doc["spec"]["slo"]["tpotP95Ms"])
        self.stack.apply(doc)
        self._sampler = threading.Thread(target=self._sample, daemon=True, name="timeline")
        self._sampler.start()
        return self.wait_serving(timeout)

    def wait_serving(self, timeout: float = 120) -> str:
        """Wait until :func:`not_serving` says nothing is missing (pod readiness, not a timer: a real vLLM
        worker takes minutes to load its weights); returns the router's URL."""
        why = ["nothing read yet"]

        def serving() -> str:
            """The router's URL once the model serves, else "" (and why not, for the timeout's message)."""
            url = self.router_url()
            if url is None:
                why[0] = "no ready router"
                return ""
            reason = not_serving(self.stack.model(self.name), router_workers_at(url))
            why[0] = reason or ""
            return url if reason is None else ""

        try:
            return self.stack.wait_for(serving, timeout, "the model to serve with both pools ready")
        except WaitTimeoutError as e:
            raise WaitTimeoutError(f"{e}; still missing: {why[0]}") from e

    def router_url(self) -> str | None:
        """The router's URL once a router pod is ready and answers /ready."""
        url = self.stack.router_url(self.name)
        if not url:
            return None
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2) as r:
                return url if r.status == 200 else None
        except OSError:
            return None

    def request_log(self) -> dict[str, dict[str, Any]]:
        """The router pods' request log lines (docs/router.md "The request log"), by request id."""
        runtime = self.stack.runtime
        assert runtime is not None
        paths = []
        for pod in self.stack.pods(self.name, "router"):
            assert pod.metadata is not None and pod.metadata.name is not None
            paths.append(runtime.log_path(self.stack.namespace, pod.metadata.name))
        return request_log_lines(paths)

    def router_metrics(self) -> str:
        """The router's /metrics text ("" when it has no ready router)."""
        url = self.stack.router_url(self.name)
        return _get(url + "/metrics") if url else ""

    def sample_once(self) -> None:
        try:
            st = self.stack.model(self.name).get("status") or {}
        except Exception:  # noqa: BLE001 - the apiserver may be stopping
            return
        pools = st.get("pools") or {}
        self.timeline.samples.append({
            "t": round(time.monotonic() - self.t0, 2), "mode": st.get("activeMode"),
            **{f"{p}_{k}": (pools.get(p) or {}).get(f"{k}Replicas", 0)
               for p in POOLS for k in ("ready", "desired")},
            **{f"{p}_last_scale": ((pools.get(p) or {}).get("lastScale") or {}).get("time") for p in POOLS},
            "ttft_p95_ms": (st.get("observed") or {}).get("ttftP95Ms"),
            "goodput": (st.get("observed") or {}).get("goodput"),
        })

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()

    # ------------------------------------------------------------------ traffic
    def send(self, requests: list[Request], on_done: Callable[[loadgen.Result], None] | None = None,
             timeout_s: float = 120, stop: Callable[[], bool] | None = None) -> list[loadgen.Result]:
        """Run the requests open-loop through the model's router (until ``stop()``, when given)."""
        url = self.stack.router_url(self.name)
        if url is None:
            raise RuntimeError("no ready router")
        return asyncio.run(loadgen.run(url, requests, on_done=on_done, timeout_s=timeout_s, stop=stop))

    def drive(self, name: str, mix: Mix, rate: float, seconds: float, seed: int = 0,
              progress: bool = True, stop: Callable[[], bool] | None = None) -> PhaseResult:
        """A named phase of ``mix`` at ``rate`` requests/s for ``seconds`` (less once ``stop()``); recorded in
        :attr:`phases`."""
        requests = generate(mix, rate, seconds, self.served_name, seed=seed)
        done: list[loadgen.Result] = []

        def on_done(r: loadgen.Result) -> None:
            done.append(r)
            if progress:
                _progress(name, len(done), len(requests), done)

        self.timeline.mark(self.t0, name)
        results = self.send(requests, on_done, stop=stop)
        if progress and sys.stderr.isatty():
            print(file=sys.stderr)
        phase = PhaseResult(name, results, loadgen.summarise(results, *self.slo))
        self.phases.append(phase)
        return phase

    # ------------------------------------------------------------------ faults
    def set_decode_faults(self, **faults: float) -> None:
        """A standing fault of the decode pool (``POST /sim/faults`` keys): on every decode worker serving now
        and on every one started later — the autoscaler may add one mid-fault, and a fault of the KV path would
        reach it too. The later ones start with the fault in their environment; those running now are waited
        for until ready (one still starting took its environment before the fault) and then told."""
        self.stack.set_pod_env(self.name, "decode", {env_name(FAULTS_BY_NAME[k].flag): str(v)
                                                     for k, v in faults.items()})

        self.stack.wait_for(lambda: all(pod_ready(p) for p in self.stack.live_pods(self.name, "decode")), 120,
                            "every decode pod ready before the fault is set on them")
        for ip in self.stack.ready_pod_ips(self.name, "decode"):
            req = urllib.request.Request(f"http://{ip}:8000/sim/faults", data=json.dumps(faults).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
            with urllib.request.urlopen(req, timeout=5) as r:
                r.read()

    def drive_until_mode(self, name: str, mix: Mix, rate: float, mode: str, timeout: float, label: str,
                         seed: int = 0) -> PhaseResult:
        """Traffic (a phase, as :meth:`drive`) until the operator sets the model's mode to ``mode``, for at most
        ``timeout`` seconds (then WaitTimeoutError). The mode controller returns a model to Disaggregated on
        evidence — remote-path probes, which ride on eligible traffic — so the traffic must go on meanwhile."""
        reached, finished = threading.Event(), threading.Event()

        def watch() -> None:
            try:
                self.stack.wait_for(lambda: finished.is_set() or self.active_mode() == mode, timeout,
                                    f"the operator to set the model's mode to {mode}")
            except (WaitTimeoutError, RuntimeError):
                return
            if not finished.is_set():
                reached.set()

        watcher = threading.Thread(target=watch, daemon=True, name=f"until-{mode}")
        watcher.start()
        try:
            phase = self.drive(name, mix, rate, timeout, seed=seed, stop=reached.is_set)
        finally:
            finished.set()
            watcher.join()
        if not reached.is_set():
            raise WaitTimeoutError(f"timed out after {timeout:g}s of traffic waiting for the operator to set the "
                                   f"model's mode to {mode} (it is {self.active_mode()})")
        self.sample_once()
        self.timeline.mark(self.t0, label)
        return phase

    # ------------------------------------------------------------------ status
    def wait_for_mode(self, mode: str, timeout: float, label: str) -> None:
        self.stack.wait_for(lambda: self.active_mode() == mode, timeout,
                            f"the operator to set the model's mode to {mode}")
        self.sample_once()
        self.timeline.mark(self.t0, label)

    def wait_quiet(self, timeout: float = 90) -> None:
        """Wait until an observation the operator made after this call began shows no SLO pressure: its p95 TTFT
        and TPOT (over spec.modePolicy.windowSeconds) within spec.slo, or no requests in the window. The last
        requests of a load step finish, and are counted, at its end; until they leave the window the autoscaler
        still answers that step, and a next step's scaling would start from its decisions."""
        since = datetime.now(UTC).replace(microsecond=0)
        ttft_slo, tpot_slo = self.slo

        def quiet() -> bool:
            seen = self.status().get("observed") or {}
            at = seen.get("time")
            if not at or datetime.fromisoformat(str(at).replace("Z", "+00:00")) <= since:
                return False
            ttft, tpot = seen.get("ttftP95Ms"), seen.get("tpotP95Ms")
            return (ttft is None or ttft <= ttft_slo) and (tpot is None or tpot <= tpot_slo)

        self.stack.wait_for(quiet, timeout, "an observation without SLO pressure (the last step out of the window)")

    def status(self) -> dict[str, Any]:
        return self.stack.model(self.name).get("status") or {}

    def active_mode(self) -> str | None:
        mode = self.status().get("activeMode")
        return str(mode) if mode else None

    def last_scale(self) -> dict[str, Any]:
        pools = self.status().get("pools") or {}
        return {p: (pools.get(p) or {}).get("lastScale") for p in POOLS}

    def desired(self, pool: str) -> int:
        return int(((self.status().get("pools") or {}).get(pool) or {}).get("desiredReplicas", 0))


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return str(r.read().decode())
    except OSError:
        return ""


def _progress(name: str, n: int, total: int, done: list[loadgen.Result]) -> None:
    tty = sys.stderr.isatty()
    if not tty and n != total and n % max(1, total // 4):
        return  # in a log, a line per quarter
    width = 30
    filled = int(width * n / max(total, 1))
    errors = sum(not r.ok for r in done)
    remote = sum(r.decision == "remote" for r in done)
    fallback = sum(r.path == "fallback" for r in done)
    print(f"\r    {name:<22} [{'#' * filled}{'.' * (width - filled)}] {n}/{total}  remote {remote}  "
          f"local {n - remote}  fallback {fallback}  errors {errors}", end="" if tty else "\n", file=sys.stderr,
          flush=True)
