"""The soak (issue 12 §7): every component fails once under steady mixed load, and nothing is lost.

On a started :class:`~disagg.local.stack.LocalStack` with one model (:class:`~disagg.local.harness.ModelHarness`),
a steady open-loop load (:data:`disagg.load.workload.SOAK`: long prompts and short chats, streamed and not, long
streams) runs the whole time while, one after another:

1. ``kill-prefill``: a prefill pod's container is SIGKILLed while it prefills (the runtime restarts it);
2. ``kill-decode``: a decode pod's container is SIGKILLed while it runs several sequences (streams in flight);
3. ``kv-stall``: KV pulls on every decode worker stall past ``transferTimeoutMs`` (sim fault) until the operator
   flips the model to Aggregated (or a deadline passes), then heal; then traffic until it is back;
4. ``prometheus-outage``: Prometheus is stopped for two autoscaler intervals, then started again (same address);
5. ``operator-restart``: the operator is SIGKILLed and started again;
6. ``router-restart``: the router pod is deleted (graceful: it drains) and its Deployment starts a new one. The
   client stops sending to a terminating router, as a Service's endpoints do (a cluster removes the pod from the
   endpoints while it drains), and retries a request whose connection could not be opened.

:func:`run_soak` returns a :class:`SoakReport`: every request's result, the faults' wall-clock windows, the mode
history and scale events (Events and the sampled status), the children before and after, and the router's request
log lines, from which :meth:`SoakReport.figures` derives the figures that e2e/test_soak.py asserts and
``disagg bench soak`` (:mod:`disagg.bench.soak`) writes to docs/results/soak.json.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import shutil
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from kubernetes import client

from ..api.contract import ROUTER_PORT
from ..load import loadgen
from ..load.workload import SOAK, Request, generate
from ..poll import WaitTimeoutError, wait_for
from .harness import POOLS, ModelHarness, request_log_lines, router_workers_at
from .soak_report import Fault, SoakReport
from .stack import LocalStack, pod_ready

WORKER_PORT = 8000

# the soak's model: the demo model with two decode replicas (a decode kill leaves one to retry on), probes on
# (the return to Disaggregated needs evidence), a shorter healthy hold (CI time)
SOAK_OVERRIDES: dict[str, Any] = {
    "decode": {"replicas": 2, "minReplicas": 2, "maxReplicas": 3},
    "modePolicy": {"healthyHoldSeconds": 10,
                   "probe": {"ratePerMinute": 30, "maxShare": 1.0, "successesToReturn": 3}},
}


@dataclass
class Settings:
    rate: float = 1.5  # requests/s, open loop
    seed: int = 7
    warmup_results: int = 10  # results before the first fault
    between_results: int = 4  # results (sent after the previous fault recovered) before the next fault
    stall_ms: float = 12000.0  # > transferTimeoutMs (8000 in the demo model)
    flip_deadline_s: float = 60.0
    return_deadline_s: float = 120.0
    request_timeout_s: float = 120.0
    connect_retry_s: float = 30.0


class RouterEndpoint:
    """The model's router as its Service presents it to the client: the URL of a ready router pod that is not
    terminating (re-read every 0.25 s), so the load follows a router restart. :meth:`drain` takes a router out at
    once, as endpoint removal does before the pod's process sees SIGTERM take effect."""

    def __init__(self, model: ModelHarness) -> None:
        self.model = model
        self.url: str | None = None
        self.draining: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="router-endpoint")

    def __call__(self) -> str | None:
        return self.url

    def start(self) -> None:
        self.refresh()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def refresh(self) -> None:
        try:
            urls = [f"http://{ip}:{ROUTER_PORT}" for ip in self.model.stack.ready_pod_ips(self.model.name, "router")]
        except Exception:  # noqa: BLE001 - the apiserver may be busy: keep the last answer
            return
        urls = [u for u in urls if u not in self.draining]
        if self.url not in urls:
            self.url = urls[0] if urls else None

    def drain(self, url: str) -> None:
        self.draining.add(url)
        if self.url == url:
            self.url = None
        self.refresh()

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            self.refresh()


class SteadyLoad:
    """Open-loop load (a fixed arrival schedule) in a thread until :meth:`stop`; requests in flight then finish."""

    def __init__(self, endpoint: RouterEndpoint, requests: list[Request], s: Settings) -> None:
        self.endpoint = endpoint
        self.requests = requests
        self.s = s
        self.done: list[loadgen.Result] = []
        self.results: list[loadgen.Result] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="soak-load")

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            self.results = asyncio.run(loadgen.run(
                self.endpoint, self.requests, on_done=self.done.append, stop=self._stop.is_set,
                timeout_s=self.s.request_timeout_s, connect_retry_s=self.s.connect_retry_s, keep_alive=False))
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self.error = e

    def done_since(self, t: float) -> int:
        """Results of requests sent at or after wall time ``t``."""
        return sum(r.sent_at >= t for r in list(self.done))

    def stop(self, timeout: float) -> list[loadgen.Result]:
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise WaitTimeoutError(f"requests still in flight {timeout:g}s after the load stopped")
        if self.error is not None:
            raise RuntimeError(f"the load generator failed: {self.error!r}") from self.error
        return self.results


def _event_time(e: client.CoreV1Event) -> float:
    t: datetime | None = e.last_timestamp or e.event_time or e.first_timestamp or e.metadata.creation_timestamp
    return t.timestamp() if t else 0.0


_MODE = re.compile(r"\b(Aggregated|Disaggregated)\b")
_SCALED = re.compile(r"^(\w+) (\d+) → (\d+)")


class Soak:
    """Runs the soak on a deployed model (see the module docstring)."""

    def __init__(self, model: ModelHarness, settings: Settings | None = None,
                 say: Callable[[str], None] = lambda _: None) -> None:
        self.model = model
        self.stack: LocalStack = model.stack
        self.s = settings or Settings()
        self.say = say
        self.faults: list[Fault] = []
        self.endpoint = RouterEndpoint(model)
        self.router_pods: set[str] = set()
        spec = self.stack.model(model.name)["spec"]
        self.interval_s = float(spec["autoscaling"].get("intervalSeconds", 5))
        self.scale_down_window_s = float(spec["autoscaling"].get("scaleDownStabilizationSeconds", 300))
        self.limits = {p: {"min": int(spec[p].get("minReplicas", 1)), "max": int(spec[p].get("maxReplicas", 1))}
                       for p in POOLS}

    # ------------------------------------------------------------------ helpers
    def _pods(self, role: str) -> list[tuple[str, str]]:
        """(name, IP) of the model's ready, not terminating pods of ``role``."""
        return [(str(p.metadata.name), str(p.status.pod_ip)) for p in self.stack.pods(self.model.name, role)
                if p.metadata and not p.metadata.deletion_timestamp and pod_ready(p) and p.status
                and p.status.pod_ip]

    def _sim_state(self, ip: str) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"http://{ip}:{WORKER_PORT}/sim/state", timeout=2) as r:
                got = json.loads(r.read())
                return got if isinstance(got, dict) else {}
        except OSError:
            return {}

    def _busy_pod(self, role: str, at_least: int, counted: tuple[str, ...]) -> tuple[str, str, dict[str, Any]] | None:
        """The busiest ready pod of ``role`` whose sim has at least ``at_least`` sequences in the ``counted`` states
        ("running", "waiting"), with the state it was chosen on."""
        best: tuple[int, tuple[str, str, dict[str, Any]]] | None = None
        for name, ip in self._pods(role):
            st = self._sim_state(ip)
            n = sum(int(st.get(k, 0)) for k in counted)
            if n >= at_least and (best is None or n > best[0]):
                best = (n, (name, ip, st))
        return best[1] if best else None

    def _router_knows(self, pool: str, n: int) -> bool:
        url = self.endpoint()
        return url is not None and router_workers_at(url).get(pool, 0) >= n

    def _wait_load(self, load: SteadyLoad, since: float, n: int, what: str) -> None:
        wait_for(lambda: load.done_since(since) >= n, 120, f"{n} results {what}")

    def _kill(self, role: str, name: str, at_least: int, counted: tuple[str, ...], load: SteadyLoad) -> None:
        what = " or ".join(counted)
        self.say(f"{name}: waiting for a {role} pod with ≥ {at_least} sequences {what}")
        busy = wait_for(lambda: self._busy_pod(role, at_least, counted), 90,
                        f"a {role} pod with ≥ {at_least} sequences {what}")
        assert busy is not None  # wait_for returns a truthy value
        pod_name, ip, state = busy  # killed on the state it was chosen on (a second read may find fewer)
        restarts = self.stack.runtime.restarts(self.stack.namespace, pod_name) if self.stack.runtime else 0
        want = len(self._pods(role))  # ready before the kill, the killed one included
        f = Fault(name, time.time(), detail={"pod": pod_name, "worker": f"http://{ip}:{WORKER_PORT}",
                                            "running_at_kill": state.get("running"),
                                            "waiting_at_kill": state.get("waiting")})
        self.faults.append(f)
        assert self.stack.runtime is not None
        self.stack.runtime.kill_container(self.stack.namespace, pod_name)
        self.say(f"{name}: killed {pod_name} ({state.get('running')} running); waiting for its restart")
        self.stack.wait_for(
            lambda: (self.stack.runtime is not None
                     and self.stack.runtime.restarts(self.stack.namespace, pod_name) > restarts
                     and len(self._pods(role)) >= want and self._router_knows(role, want)), 90,
            f"the killed {role} pod to be back and known to the router")
        f.end = time.time()
        self._wait_load(load, f.end, self.s.between_results, f"after {name}")

    # ------------------------------------------------------------------ the faults
    def kill_prefill(self, load: SteadyLoad) -> None:
        self._kill("prefill", "kill-prefill", 1, ("running", "waiting"), load)

    def kill_decode(self, load: SteadyLoad) -> None:
        # streams in flight: running sequences (a waiting one has sent no token yet)
        self._kill("decode", "kill-decode", 3, ("running",), load)

    def kv_stall(self, load: SteadyLoad) -> None:
        # the stall must start from Disaggregated (an earlier, unexplained flip is in the mode history anyway)
        self.stack.wait_for(lambda: self.model.active_mode() == "Disaggregated", self.s.return_deadline_s,
                            "the model to be Disaggregated before the KV stall")
        f = Fault("kv-stall", time.time())
        self.faults.append(f)
        self.say(f"kv-stall: KV pulls stall {self.s.stall_ms:.0f} ms on every decode worker")
        self.model.set_decode_faults(kv_transfer_delay_ms=self.s.stall_ms)
        try:
            self.stack.wait_for(lambda: self.model.active_mode() == "Aggregated", self.s.flip_deadline_s,
                                "the operator to flip the model to Aggregated")
            f.detail["flipped"] = True
        except WaitTimeoutError:
            f.detail["flipped"] = False  # allowed: the breakers may keep the KV failure rate below the threshold
        self.model.set_decode_faults(kv_transfer_delay_ms=0)
        f.detail["healed"] = time.time()
        f.detail["stalled_s"] = round(f.detail["healed"] - f.start, 1)
        self.say(f"kv-stall: healed (flipped: {f.detail['flipped']}); traffic until the model is Disaggregated")
        self.stack.wait_for(lambda: self.model.active_mode() == "Disaggregated", self.s.return_deadline_s,
                            "the model to return to Disaggregated after the heal")
        f.end = time.time()
        f.detail["return_after_heal_s"] = round(f.end - f.detail["healed"], 1)
        self._wait_load(load, f.end, self.s.between_results, "after the KV stall")

    def _metrics_available(self) -> str | None:
        conds = {c.get("type"): c.get("status") for c in self.model.status().get("conditions") or []}
        return conds.get("MetricsAvailable")

    def _observed_time(self) -> float:
        t = (self.model.status().get("observed") or {}).get("time")
        return datetime.fromisoformat(str(t).replace("Z", "+00:00")).timestamp() if t else 0.0

    def prometheus_outage(self, load: SteadyLoad) -> None:
        f = Fault("prometheus-outage", time.time())
        self.faults.append(f)
        self.say(f"prometheus-outage: stopping Prometheus for two autoscaler intervals ({2 * self.interval_s:g} s)")
        self.stack.prometheus.pause()
        seen = {"unavailable": False}

        def outage_done() -> bool:
            seen["unavailable"] = seen["unavailable"] or self._metrics_available() == "False"
            return seen["unavailable"] and time.time() >= f.start + 2 * self.interval_s

        # the fault lasts two intervals, and at least until the operator has noticed it (MetricsAvailable False)
        self.stack.wait_for(outage_done, 4 * self.interval_s + 30, "the operator to notice the Prometheus outage")
        f.detail["down_s"] = round(time.time() - f.start, 1)
        self.stack.prometheus.resume()
        resumed = time.time()
        self.stack.wait_for(lambda: self._metrics_available() == "True" and self._observed_time() > resumed,
                            4 * self.interval_s + 30, "metrics to be available again after the outage")
        f.end = time.time()
        self._wait_load(load, f.end, self.s.between_results, "after the Prometheus outage")

    def _replicas(self) -> dict[str, dict[str, int]]:
        apps = client.AppsV1Api(self.stack.api)
        out = {}
        for pool in POOLS:
            dep = apps.read_namespaced_deployment(f"{self.model.name}-{pool}", self.stack.namespace)
            out[pool] = {"deployment": int(dep.spec.replicas or 0), "desired": self.model.desired(pool)}
        return out

    def operator_restart(self, load: SteadyLoad) -> tuple[dict[str, list[tuple[str, str]]], dict[str, dict[str, int]]]:
        f = Fault("operator-restart", time.time())
        self.faults.append(f)
        self.say("operator-restart: SIGKILL the operator, start a new one")
        self.stack.restart_operator(crash=True)
        restarted = time.time()
        # the new operator has run a whole autoscaler tick: a measurement newer than its start is in the status
        self.stack.wait_for(lambda: self._observed_time() > restarted, 6 * self.interval_s + 60,
                            "the restarted operator's first autoscaler tick")
        # and a second one, so that whatever the restart's first reconcile would have changed has happened
        first = self._observed_time()
        self.stack.wait_for(lambda: self._observed_time() > first, 4 * self.interval_s + 30,
                            "the restarted operator's second autoscaler tick")
        f.end = time.time()
        kids, replicas = self.stack.children(self.model.name), self._replicas()
        self._wait_load(load, f.end, self.s.between_results, "after the operator restart")
        return kids, replicas

    def router_restart(self, load: SteadyLoad) -> None:
        old = self._pods("router")
        assert len(old) == 1, old
        pod_name, ip = old[0]
        url = f"http://{ip}:{ROUTER_PORT}"
        f = Fault("router-restart", time.time(), detail={"pod": pod_name, "url": url})
        self.faults.append(f)
        self.say(f"router-restart: deleting {pod_name} (it drains); a new router pod replaces it")
        self.endpoint.drain(url)
        client.CoreV1Api(self.stack.api).delete_namespaced_pod(pod_name, self.stack.namespace)
        self.stack.wait_for(lambda: (u := self.endpoint()) is not None and u != url
                            and self._router_knows("prefill", 1) and self._router_knows("decode", 2), 90,
                            "a new router that knows the workers")
        f.end = time.time()
        new = self._pods("router")
        f.detail["new_pod"] = new[0][0] if new else None
        self.router_pods |= {name for name, _ in new}
        self._wait_load(load, f.end, self.s.between_results, "after the router restart")

    # ------------------------------------------------------------------ the run
    def router_log(self) -> dict[str, dict[str, Any]]:
        assert self.stack.runtime is not None
        runtime = self.stack.runtime
        return request_log_lines(runtime.log_path(self.stack.namespace, pod) for pod in sorted(self.router_pods))

    def keep_logs(self) -> None:
        """Copy every pod's container log into the stack's log directory (the runtime removes its own on stop)."""
        if self.stack.log_dir is None or self.stack.runtime is None:
            return
        dest = self.stack.log_dir / "pods"
        dest.mkdir(parents=True, exist_ok=True)
        for log in self.stack.runtime.root.glob("*/container.log"):
            shutil.copyfile(log, dest / f"{log.parent.name}.log")

    def run(self) -> SoakReport:
        started = time.time()
        rel_start = time.monotonic() - self.model.t0  # the timeline's clock
        self.endpoint.start()
        self.router_pods = {name for name, _ in self._pods("router")}
        children: dict[str, dict[str, list[tuple[str, str]]]] = {"start": self.stack.children(self.model.name)}
        # arrivals for longer than any soak takes; the load stops after the last fault
        requests = generate(SOAK, self.s.rate, 900, self.model.served_name, seed=self.s.seed)
        load = SteadyLoad(self.endpoint, requests, self.s)
        t_start_load = time.time()
        load.start()
        try:
            self.say(f"steady load: {self.s.rate:g} req/s of the soak mix")
            self._wait_load(load, t_start_load, self.s.warmup_results, "of warm-up")
            self.kill_prefill(load)
            self.kill_decode(load)
            self.kv_stall(load)
            self.prometheus_outage(load)
            children["after-operator-restart"], replicas = self.operator_restart(load)
            self.router_restart(load)
        finally:
            self.say("stopping the load; requests in flight finish")
            results = load.stop(timeout=self.s.request_timeout_s + 30)
            self.endpoint.stop()
        ended = time.time()
        children["end"] = self.stack.children(self.model.name)
        events = self.stack.events(self.model.name)
        mode_events = []
        scale_events = []
        for e in events:
            t = _event_time(e)
            if t < started - 1:
                continue
            if e.reason == "ModeChanged" and (m := _MODE.search(e.message or "")):
                mode_events.append((t, m.group(1), e.message or ""))
            elif e.reason == "Scaled" and (m := _SCALED.match(e.message or "")):
                scale_events.append((t, m.group(1), int(m.group(2)), int(m.group(3)), e.message or ""))
        samples = [s for s in self.model.timeline.samples if s["t"] >= rel_start]
        modes: list[str] = []
        for s in samples:
            if s["mode"] and (not modes or modes[-1] != s["mode"]):
                modes.append(s["mode"])
        last_scale = {p: sum(a.get(f"{p}_last_scale") != b.get(f"{p}_last_scale")
                             for a, b in itertools.pairwise(samples)) for p in POOLS}
        self.keep_logs()
        return SoakReport(
            settings={**asdict(self.s), "mix": SOAK.name, "overrides": SOAK_OVERRIDES}, started=started,
            ended=ended, faults=self.faults, results=results, router_log=self.router_log(), mode_events=mode_events,
            scale_events=scale_events, timeline_modes=modes, last_scale_changes=last_scale, children=children,
            replicas_after_operator_restart=replicas, limits=self.limits, interval_s=self.interval_s,
            scale_down_window_s=self.scale_down_window_s,
            max_tokens={r.id: r.max_tokens for r in requests})
