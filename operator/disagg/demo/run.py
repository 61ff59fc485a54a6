"""``run_demo``: start the local stack, deploy the demo model, run the acts, write the report, stop everything.

Traces (the process demo): the stack runs Jaeger, the model traces every request (``samplingRatio`` 1, see
:data:`SAMPLING_RATIO`) to it, and the report shows the slowest traced request, its trace's waterfall and a link to
it. The real-node demo (``--node real``) runs without traces: its pods are containers on the node's bridge, and
Jaeger would have to be exposed there as Prometheus is (:class:`disagg.local.cluster_stack.ClusterStack`).
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

from ..local.controlplane import REPO_ROOT
from ..local.harness import ModelHarness
from ..local.jaeger import parent_id, spans_by_name, waterfall
from ..local.stack import LocalStack
from ..poll import WaitTimeoutError, wait_for
from ..tracing import DECODE_LEG_SPAN, LLM_REQUEST_SPAN, PREFILL_LEG_SPAN, ROUTER_SPAN
from .acts import run_loop, say
from .report import TraceSection, slowest_traced, slowest_traced_request, write_report

# Every request traced. The demo sends a few hundred requests at 1-4 req/s, a few spans each (router span, two
# legs, the workers' llm_request spans, the KV pull): trivial next to the sims' own work, and Jaeger keeps them in
# memory. At a ratio below 1 the report's "slowest request" would be the slowest *sampled* one, which is not the
# slowest request of the run (act 3's stalled KV transfers) unless that one happened to be sampled.
SAMPLING_RATIO = 1.0


def run_demo(keep: bool = False, results_dir: Path | None = None, quick: bool = False, node: str = "process") -> int:
    """``node``: ``process`` (the local pod runtime: pods are processes, seconds to start) or ``real`` (the real
    node: kubelet + containerd on this machine, the chart installed by Helm, pods are containers; needs root)."""
    started = time.monotonic()
    results_dir = results_dir or (REPO_ROOT / "results" / time.strftime("demo-%Y%m%d-%H%M%S"))
    results_dir.mkdir(parents=True, exist_ok=True)
    stack: LocalStack
    if node == "real":
        from ..local.cluster_stack import ClusterStack

        stack = ClusterStack(log_dir=results_dir / "logs")
    else:
        stack = LocalStack(log_dir=results_dir / "logs", sim_env={"DISAGG_SIM_TIME_SCALE": "1.0"}, tracing=True)
    model: ModelHarness | None = None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        stack.start(say=say)
        say(f"control plane at {stack.cp.server}; Prometheus at {stack.prometheus.url} "
            f"({time.monotonic() - started:.0f}s)")
        overrides: dict[str, Any] = {}
        if stack.jaeger is not None:
            say(f"Jaeger (traces) at {stack.jaeger.url} — its query API (JSON: /api/services, "
                "/api/traces/<trace id>); a Jaeger built from its Go module has no web UI")
            overrides["observability"] = stack.tracing_spec(SAMPLING_RATIO)
        model = ModelHarness(stack)
        say("applying DisaggregatedModel 'demo' (docs/examples/local-demo.yaml"
            f"{', every request traced' if overrides else ''}); waiting for both pools")
        url = model.deploy(overrides)
        say(f"router ready at {url}; prefill and decode pools ready ({time.monotonic() - started:.0f}s)")
        outcome = run_loop(model, quick=quick)
        model.stop()
        router_log = stack.pod_logs(model.name, "router")
        report = write_report(results_dir, model.phases, model.timeline, model.slo, outcome.load_steps(),
                              router_metrics=model.router_metrics(), traces=trace_section(stack, model, router_log),
                              router_log=router_log)
        shot = screenshot_report(results_dir / "report.html")
        if shot is not None:
            say(f"screenshot of the report: {shot}")
        print(report.terminal)
        say(f"plots and report: {results_dir}/report.html ({time.monotonic() - started:.0f}s)")
        if keep:
            say(f"kept running; export KUBECONFIG={stack.cp.kubeconfig}  (Ctrl-C to stop)")
            while True:
                time.sleep(3600)
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        if model:
            model.stop()
        stack.stop()
        say(f"stopped everything ({time.monotonic() - started:.0f}s)")


def screenshot_report(page: Path) -> Path | None:
    """The report as a reader sees it (headless Chromium, 1400 px wide), saved next to it as report.png; None
    (and a line saying why) when no Chromium is installed or it fails: the report itself is already written."""
    from ..local.browser import chromium_binary, inspect_page

    if chromium_binary() is None:
        say("no Chromium installed: no screenshot of the report (bash hack/ensure-chromium.sh installs it)")
        return None
    shot = page.with_suffix(".png")
    try:
        view = inspect_page(page, screenshot=shot)
    except (OSError, RuntimeError, WaitTimeoutError) as e:
        say(f"no screenshot of the report: {e}")
        return None
    if view.scroll_width > view.width:
        say(f"the report scrolls sideways at {view.width} px: {', '.join(view.wide)}")
    return shot


def trace_section(stack: LocalStack, model: ModelHarness, router_log: str, timeout: float = 30
                  ) -> TraceSection | None:
    """The report's traces: the slowest request the router traced (its request log lines carry the trace id), and
    that trace read back from Jaeger once it holds the router's span (exporters batch: the spans of a request
    that ended last arrive a few seconds later). None when the stack runs no Jaeger."""
    jaeger = stack.jaeger
    if jaeger is None:
        return None
    section = TraceSection(jaeger.url)
    found = slowest_traced(model.phases, router_log)
    if found is None:
        section.missing = "no request line of the router carries a trace id"
        return section
    trace_id = found[1]
    section.slowest = slowest_traced_request(model.phases, router_log, jaeger.trace_url)
    section.trace_url = jaeger.trace_url(trace_id)

    def whole() -> dict[str, Any] | None:
        """The trace once it holds the router's span and, under each of its legs, the engine's span: each process
        exports on its own schedule, and the engine that served the last leg ends its span with the router's."""
        t = jaeger.trace(trace_id)
        if t is None:
            return None
        spans = spans_by_name(t)
        if ROUTER_SPAN not in spans:
            return None
        legs = {s["spanID"] for name in (PREFILL_LEG_SPAN, DECODE_LEG_SPAN) for s in spans.get(name, [])}
        served = {parent_id(s) for s in spans.get(LLM_REQUEST_SPAN, [])}
        return t if legs <= served else None

    try:
        section.trace = wait_for(whole, timeout, f"trace {trace_id} in Jaeger", interval=0.5)
    except WaitTimeoutError:  # a leg whose engine never answered (a fault): the trace as it is
        section.trace = jaeger.trace(trace_id)
        if section.trace is None or ROUTER_SPAN not in spans_by_name(section.trace):
            section.missing = f"Jaeger has no {ROUTER_SPAN} span of trace {trace_id} after {timeout:g}s"
    if section.trace is not None:
        section.waterfall = waterfall(section.trace)
    return section
