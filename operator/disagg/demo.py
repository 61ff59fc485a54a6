"""`disagg demo`: prefill/decode disaggregation routing, falling back and scaling, on this machine.

No GPU, no cluster, no Docker. A real control plane (etcd + kube-apiserver + kube-controller-manager built from
Go sources), the operator, a local pod runtime that runs the operator's pods as processes (`vllm serve` →
`disagg sim`, the digital twin), Prometheus (Debian) scraping them, and a mixed workload through the router:

1. mixed traffic — long RAG prompts, short chats, long streams, three tenants: per-request decisions;
2. a load step of long outputs, then of long prompts → the autoscaler grows decode, then prefill, independently;
3. KV-transfer failures injected into the decode workers → per-request fallbacks (no client errors) → the
   operator flips the model to Aggregated → faults healed → it flips back after the hold.

Results: a summary in the terminal, PNG plots and report.html in the results directory. Everything started is
stopped at the end, on Ctrl-C, or on error.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .bench import loadgen
from .bench.workload import MIXES, Mix, RequestClass, generate
from .local.controlplane import REPO_ROOT
from .local.stack import LocalStack

DEMO_MODEL = REPO_ROOT / "docs" / "examples" / "local-demo.yaml"
POOLS = ("prefill", "decode")


def _say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


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


class Demo:
    def __init__(self, stack: LocalStack, name: str = "demo", slo_ttft_ms: int = 3000, slo_tpot_ms: int = 60):
        self.stack = stack
        self.name = name
        self.slo = (slo_ttft_ms, slo_tpot_ms)
        self.timeline = Timeline()
        self.t0 = time.monotonic()
        self.phases: list[PhaseResult] = []
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    # ------------------------------------------------------------------ set-up
    def deploy(self, overrides: dict[str, Any] | None = None, timeout: float = 120) -> str:
        doc = yaml.safe_load(DEMO_MODEL.read_text())
        doc["metadata"]["name"] = self.name
        doc["spec"]["autoscaling"]["prometheus"]["url"] = self.stack.prometheus.url
        for key, value in (overrides or {}).items():
            doc["spec"][key] = {**doc["spec"].get(key, {}), **value} if isinstance(value, dict) else value
        self.slo = (doc["spec"]["slo"]["ttftP95Ms"], doc["spec"]["slo"]["tpotP95Ms"])
        self.stack.apply(doc)
        self._sampler = threading.Thread(target=self._sample, daemon=True, name="timeline")
        self._sampler.start()
        return self.stack.wait_for(
            "the model's router, prefill and decode pods to be ready",
            lambda: self.stack.condition(self.name, "Ready") == "True" and self._router_ready(), timeout)

    def _router_ready(self) -> str | None:
        url = self.stack.router_url(self.name)
        if not url:
            return None
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2) as r:
                return url if r.status == 200 else None
        except OSError:
            return None

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
    def drive(self, name: str, mix: Mix, rate: float, seconds: float, seed: int = 0,
              progress: bool = True) -> PhaseResult:
        url = self.stack.router_url(self.name)
        if url is None:
            raise RuntimeError("no ready router")
        model = yaml.safe_load(DEMO_MODEL.read_text())["spec"]["model"]["servedName"]
        requests = generate(mix, rate, seconds, model, seed=seed)
        done: list[loadgen.Result] = []

        def on_done(r: loadgen.Result) -> None:
            done.append(r)
            if progress:
                _progress(name, len(done), len(requests), done)

        self.timeline.mark(self.t0, name)
        results = asyncio.run(loadgen.run(url, requests, on_done=on_done, timeout_s=120))
        if progress and sys.stderr.isatty():
            print(file=sys.stderr)
        phase = PhaseResult(name, results, loadgen.summarise(results, *self.slo))
        self.phases.append(phase)
        return phase

    # ------------------------------------------------------------------ faults
    def set_decode_faults(self, **faults: float) -> None:
        for ip in self.stack.ready_pod_ips(self.name, "decode"):
            req = urllib.request.Request(f"http://{ip}:8000/sim/faults", data=json.dumps(faults).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
            with urllib.request.urlopen(req, timeout=5) as r:
                r.read()

    def wait_for_mode(self, mode: str, timeout: float, label: str) -> None:
        self.stack.wait_for(f"the operator to set the model's mode to {mode}", lambda: self.active_mode() == mode,
                            timeout)
        self.sample_once()
        self.timeline.mark(self.t0, label)

    def active_mode(self) -> str | None:
        return (self.stack.model(self.name).get("status") or {}).get("activeMode")

    def last_scale(self) -> dict[str, Any]:
        pools = (self.stack.model(self.name).get("status") or {}).get("pools") or {}
        return {p: (pools.get(p) or {}).get("lastScale") for p in POOLS}

    def desired(self, pool: str) -> int:
        return ((self.stack.model(self.name).get("status") or {}).get("pools") or {}).get(pool, {}).get(
            "desiredReplicas", 0)


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


LONG_PROMPTS = Mix("long-prompts", "long RAG prompts, short answers", (
    RequestClass("rag", 1.0, (6000, 10000), (64, 128), tenant="rag", shared_prefix_tokens=0),))
LONG_OUTPUTS = Mix("long-outputs", "short prompts, long streams", (
    RequestClass("stream", 1.0, (128, 512), (600, 1000), tenant="stream"),))


@dataclass
class LoadStep:
    """What a load step did to the pools: desired replicas before/after, and when each pool first grew."""

    before: dict[str, int]
    after: dict[str, int]
    first_growth_s: dict[str, float | None]
    last_scale: dict[str, Any]

    def line(self) -> str:
        return ", ".join(f"{p} {self.before[p]} → {self.after[p]} (first growth "
                         f"{'—' if self.first_growth_s[p] is None else f'{self.first_growth_s[p]:.0f} s'})"
                         for p in POOLS)



def load_step(demo: Demo, name: str, mix: Mix, *, rate: float, seconds: float, seed: int) -> LoadStep:
    t = time.monotonic() - demo.t0
    before = {p: demo.desired(p) for p in POOLS}
    demo.drive(name, mix, rate=rate, seconds=seconds, seed=seed)
    demo.sample_once()
    return LoadStep(before, {p: demo.desired(p) for p in POOLS},
                    {p: demo.timeline.first_growth(p, t) for p in POOLS}, demo.last_scale())


def run_loop(demo: Demo, *, quick: bool = False) -> dict[str, Any]:
    """The three acts. Returns what happened (for the report and the e2e assertions)."""
    s = 0.5 if quick else 1.0
    out: dict[str, Any] = {}

    _say("act 1: mixed traffic (long RAG prompts, short chats, long streams; tenants rag/chat/stream)")
    out["mixed"] = demo.drive("mixed traffic", MIXES["mixed"], rate=1.5, seconds=30 * s, seed=1)

    _say("act 2: a load step of long outputs → the decode pool grows first")
    out["long_outputs"] = load_step(demo, "long-output load step", LONG_OUTPUTS, rate=4.0, seconds=35 * s, seed=5)
    _say("        then a load step of long prompts → the prefill pool grows first")
    out["long_prompts"] = load_step(demo, "long-prompt load step", LONG_PROMPTS, rate=2.5, seconds=35 * s, seed=4)

    _say("act 3: KV transfers stall on the decode workers (12 s > transferTimeoutMs 8 s)")
    demo.set_decode_faults(kv_transfer_delay_ms=12000)
    out["faulty"] = demo.drive("KV transfers failing", MIXES["long-rag"], rate=1.0, seconds=25 * s, seed=2)
    demo.wait_for_mode("Aggregated", 60, "flipped to Aggregated")
    _say("        the operator flipped the model to Aggregated; healing the KV path")
    demo.set_decode_faults(kv_transfer_delay_ms=0)
    out["healed"] = demo.drive("aggregated, healing", MIXES["mixed"], rate=1.0, seconds=20 * s, seed=3)
    demo.wait_for_mode("Disaggregated", 90, "back to Disaggregated")
    _say("        back to Disaggregated after the healthy hold")
    return out


def run_demo(keep: bool = False, results_dir: Path | None = None, quick: bool = False) -> int:
    from .bench.report import write_report

    started = time.monotonic()
    results_dir = results_dir or (REPO_ROOT / "results" / time.strftime("demo-%Y%m%d-%H%M%S"))
    results_dir.mkdir(parents=True, exist_ok=True)
    stack = LocalStack(log_dir=results_dir / "logs", sim_env={"DISAGG_SIM_TIME_SCALE": "1.0"})
    demo: Demo | None = None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        stack.start(say=_say)
        _say(f"control plane at {stack.cp.server}; Prometheus at {stack.prometheus.url} "
             f"({time.monotonic() - started:.0f}s)")
        demo = Demo(stack)
        _say("applying DisaggregatedModel 'demo' (docs/examples/local-demo.yaml)")
        url = demo.deploy()
        _say(f"router ready at {url}")
        outcome = run_loop(demo, quick=quick)
        demo.stop()
        report = write_report(results_dir, demo, outcome)
        print(report.terminal)
        _say(f"plots and report: {results_dir}/report.html ({time.monotonic() - started:.0f}s)")
        if keep:
            _say(f"kept running; export KUBECONFIG={stack.cp.kubeconfig}  (Ctrl-C to stop)")
            while True:
                time.sleep(3600)
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        if demo:
            demo.stop()
        stack.stop()
        _say(f"stopped everything ({time.monotonic() - started:.0f}s)")
