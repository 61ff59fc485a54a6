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
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from kubernetes import client

from ..api.contract import ROUTER_PORT
from ..load import loadgen
from ..load.workload import SOAK, Request, generate
from ..poll import WaitTimeoutError, wait_for
from .harness import POOLS, ModelHarness, router_workers_at
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


@dataclass
class Fault:
    name: str
    start: float  # wall clock (time.time())
    end: float = 0.0  # recovered (the component serves again)
    detail: dict[str, Any] = field(default_factory=dict)


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


@dataclass
class SoakReport:
    settings: dict[str, Any]
    started: float
    ended: float
    faults: list[Fault]
    results: list[loadgen.Result]
    router_log: dict[str, dict[str, Any]]  # request id → the router's request log line
    mode_events: list[tuple[float, str, str]]  # (wall time, mode, message) of ModeChanged Events in the soak
    scale_events: list[tuple[float, str, int, int, str]]  # (wall time, pool, from, to, message) of Scaled Events
    timeline_modes: list[str]
    last_scale_changes: dict[str, int]  # distinct lastScale records seen per pool during the soak
    children: dict[str, dict[str, list[tuple[str, str]]]]  # "start" | "after-operator-restart" | "end" → children
    replicas_after_operator_restart: dict[str, dict[str, int]]  # pool → {deployment, desired}
    limits: dict[str, dict[str, int]]  # pool → {min, max}
    interval_s: float
    scale_down_window_s: float  # spec.autoscaling.scaleDownStabilizationSeconds
    max_tokens: dict[str, int]  # request id → max_tokens asked for

    def fault(self, name: str) -> Fault:
        return next(f for f in self.faults if f.name == name)

    # ------------------------------------------------------------------ derived figures
    def failed_before_stream(self) -> list[loadgen.Result]:
        """Failed requests whose client had not received a token: each should have got a fallback or a retry."""
        return [r for r in self.results if not r.ok and not r.streamed]

    def mid_stream_losses(self) -> list[loadgen.Result]:
        return [r for r in self.results if not r.ok and r.streamed]

    def unexplained_mid_stream(self) -> list[dict[str, Any]]:
        """Mid-stream losses not explained by the decode kill: the stream must have been in flight when the decode
        pod was killed, and its decode leg (per the router's log line) on that pod."""
        kill = self.fault("kill-decode")
        worker = kill.detail["worker"]
        out = []
        for r in self.mid_stream_losses():
            line = self.router_log.get(r.id, {})
            if not (r.sent_at <= kill.start <= r.done_at and line.get("decode_worker") == worker):
                out.append({"id": r.id, "class": r.cls, "error": r.error, "sent_at": r.sent_at,
                            "done_at": r.done_at, "router_line": line})
        return out

    def flips(self) -> list[tuple[float, str]]:
        return [(t, mode) for t, mode, _ in self.mode_events]

    def explained_flips(self) -> list[tuple[float, str, str, str | None]]:
        """Each mode change with what explains it (None: nothing). The KV stall explains one flip to Aggregated
        while KV pulls stalled (Event timestamps have 1 s resolution); a flip to Disaggregated is explained as the
        return from an explained flip to Aggregated. Nothing else explains a flip: a prefill pod restarting within
        the mode window is not a fault of disaggregation (autoscaling/mode.py)."""
        stall = self.fault("kv-stall")
        healed = float(stall.detail["healed"])
        out: list[tuple[float, str, str, str | None]] = []
        stall_used = False
        for t, mode, msg in self.mode_events:
            why: str | None = None
            prev = out[-1] if out else None
            if mode == "Aggregated":
                if not stall_used and stall.start - 1 <= t <= healed + 1:
                    why, stall_used = "kv-stall", True
            elif prev is not None and prev[1] == "Aggregated" and prev[3] is not None:
                why = f"return after {prev[3]}"
            out.append((t, mode, msg, why))
        return out

    def unexplained_flips(self) -> list[tuple[float, str, str]]:
        return [(t, m, msg) for t, m, msg, why in self.explained_flips() if why is None]

    def short_answers(self) -> list[tuple[str, int, int]]:
        """Successful answers with fewer tokens than asked for (every request sets ignore_eos): (id, got, asked)."""
        return [(r.id, r.output_tokens, self.max_tokens[r.id]) for r in self.results
                if r.ok and r.output_tokens < self.max_tokens.get(r.id, 0)]

    def scale_events_in(self, start: float, end: float) -> list[tuple[float, str, int, int, str]]:
        return [e for e in self.scale_events if start - 1 <= e[0] <= end + 1]

    def direction_changes(self, pool: str) -> int:
        dirs = [1 if to > frm else -1 for _, p, frm, to, _ in self.scale_events if p == pool]
        return sum(a != b for a, b in itertools.pairwise(dirs))

    def duplicates(self) -> dict[str, dict[str, int]]:
        return {when: {k: len(v) for k, v in kids.items() if len(v) != 1} for when, kids in self.children.items()}

    def figures(self) -> dict[str, Any]:
        res = self.results
        streamed = [r for r in res if r.cls in ("rag", "chat", "stream")]
        ok = [r for r in res if r.ok]
        by_class: dict[str, dict[str, int]] = {}
        for r in res:
            c = by_class.setdefault(r.cls, {"requests": 0, "ok": 0})
            c["requests"] += 1
            c["ok"] += r.ok
        paths: dict[str, int] = {}
        for r in res:
            paths[r.path or "none"] = paths.get(r.path or "none", 0) + 1
        reasons: dict[str, int] = {}
        for r in res:
            if r.decision == "local" or r.path == "fallback":
                key = f"{r.decision}/{r.reason}" + ("/fallback" if r.path == "fallback" else "")
                reasons[key] = reasons.get(key, 0) + 1
        fallback_causes: dict[str, int] = {}
        for line in self.router_log.values():
            if line.get("fallback"):
                fallback_causes[str(line["fallback"])] = fallback_causes.get(str(line["fallback"]), 0) + 1
        per_fault = {}
        for f in self.faults:
            during = [r for r in res if r.sent_at <= f.end and r.done_at >= f.start]
            per_fault[f.name] = {
                "start_s": round(f.start - self.started, 1), "duration_s": round(f.end - f.start, 1),
                # a failure is the fault's when it ended while the fault lasted (a long stream overlaps several)
                "requests_overlapping": len(during),
                "failed": sum(not r.ok and f.start <= r.done_at <= f.end for r in during),
                "fallbacks": sum(r.path == "fallback" for r in during), "retried": sum(r.retries > 0 for r in during),
                **{k: v for k, v in f.detail.items() if k != "healed"},
            }
        scale: dict[str, Any] = {}
        for pool in POOLS:
            evs = [e for e in self.scale_events if e[1] == pool]
            scale[pool] = {"events": [f"{e[0] - self.started:.0f}s {e[2]}→{e[3]}: {e[4]}" for e in evs],
                           "count": len(evs), "direction_changes": self.direction_changes(pool),
                           "last_scale_changes": self.last_scale_changes.get(pool, 0), **self.limits[pool]}
        outage = self.fault("prometheus-outage")
        return {
            "duration_s": round(self.ended - self.started, 1),
            "requests": len(res), "ok": len(ok), "streamed_requests": len(streamed),
            "non_streamed_requests": len(res) - len(streamed),
            "failed_before_first_token": len(self.failed_before_stream()),
            "short_answers": len(self.short_answers()),
            "mid_stream_losses": len(self.mid_stream_losses()),
            "mid_stream_losses_unexplained": len(self.unexplained_mid_stream()),
            "mid_stream_loss_errors": _count(r.error[:60] for r in self.mid_stream_losses()),
            "connect_retries": sum(r.retries for r in res), "requests_retried": sum(r.retries > 0 for r in res),
            "paths": paths, "local_and_fallback_reasons": reasons, "fallback_causes": fallback_causes,
            "by_class": by_class,
            "ttft_p50_ms": _ms(loadgen.percentile([r.ttft_s for r in ok], 0.5)),
            "ttft_p95_ms": _ms(loadgen.percentile([r.ttft_s for r in ok], 0.95)),
            "faults": per_fault,
            "mode_history": [f"{t - self.started:.0f}s {msg} [{why or 'UNEXPLAINED'}]"
                             for t, _, msg, why in self.explained_flips()],
            "mode_flips_unexplained": len(self.unexplained_flips()),
            "timeline_modes": self.timeline_modes,
            "scale": scale,
            "scale_events_during_prometheus_outage": len(self.scale_events_in(outage.start,
                                                                              outage.end + self.interval_s)),
            "duplicate_children": self.duplicates(),
            "children_recreated_by_operator_restart": sorted(
                set(map(tuple, _flat(self.children["start"]))) ^ set(map(tuple, _flat(
                    self.children["after-operator-restart"])))),
            "replicas_after_operator_restart": self.replicas_after_operator_restart,
        }

    def to_json(self) -> dict[str, Any]:
        return {"settings": self.settings, "figures": self.figures(),
                "faults": [asdict(f) for f in self.faults],
                "mid_stream_losses": [{"id": r.id, "class": r.cls, "error": r.error,
                                       "decode_worker": self.router_log.get(r.id, {}).get("decode_worker")}
                                      for r in self.mid_stream_losses()],
                "failed_before_first_token": [asdict(r) for r in self.failed_before_stream()]}


def _flat(kids: dict[str, list[tuple[str, str]]]) -> list[tuple[str, str, str]]:
    return [(k, name, uid) for k, v in kids.items() for name, uid in v]


def _count(keys: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in keys:
        out[k] = out.get(k, 0) + 1
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


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
        out: dict[str, dict[str, Any]] = {}
        assert self.stack.runtime is not None
        for pod in sorted(self.router_pods):
            path: Path = self.stack.runtime.log_path(self.stack.namespace, pod)
            if not path.exists():
                continue
            for raw in path.read_bytes().splitlines():
                if not raw.startswith(b"{"):
                    continue
                try:
                    line = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(line, dict) and line.get("event") == "request" and line.get("request_id"):
                    out[str(line["request_id"])] = line
        return out

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
