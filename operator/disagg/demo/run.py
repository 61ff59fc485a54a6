"""``run_demo``: start the local stack, deploy the demo model, run the acts, write the report, stop everything."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from ..local.controlplane import REPO_ROOT
from ..local.harness import ModelHarness
from ..local.stack import LocalStack
from .acts import run_loop, say
from .report import write_report


def run_demo(keep: bool = False, results_dir: Path | None = None, quick: bool = False, node: str = "process") -> int:
    """``node``: ``process`` (the local pod runtime: pods are processes, seconds to start) or ``real`` (the real
    node: kubelet + containerd on this machine, the chart installed by Helm, pods are containers; needs root)."""
    started = time.monotonic()
    results_dir = results_dir or (REPO_ROOT / "results" / time.strftime("demo-%Y%m%d-%H%M%S"))
    results_dir.mkdir(parents=True, exist_ok=True)
    stack: LocalStack
    if node == "real":
        from ..local.cluster import ClusterStack

        stack = ClusterStack(log_dir=results_dir / "logs")
    else:
        stack = LocalStack(log_dir=results_dir / "logs", sim_env={"DISAGG_SIM_TIME_SCALE": "1.0"})
    model: ModelHarness | None = None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        stack.start(say=say)
        say(f"control plane at {stack.cp.server}; Prometheus at {stack.prometheus.url} "
            f"({time.monotonic() - started:.0f}s)")
        model = ModelHarness(stack)
        say("applying DisaggregatedModel 'demo' (docs/examples/local-demo.yaml); waiting for both pools")
        url = model.deploy()
        say(f"router ready at {url}; prefill and decode pools ready ({time.monotonic() - started:.0f}s)")
        outcome = run_loop(model, quick=quick)
        model.stop()
        report = write_report(results_dir, model.phases, model.timeline, model.slo, outcome.load_steps(),
                              router_metrics=model.router_metrics())
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
