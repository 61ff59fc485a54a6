"""``LocalStack(tracing=True)``, as ``disagg demo`` runs it: the stack starts and stops a real Jaeger, the demo model
traces to it through ``spec.observability.tracing`` (rendered by the operator into the router's and the workers'
flags), and the demo's trace section finds the slowest request in the router's log and its trace in Jaeger."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from disagg import tracing
from disagg.demo.run import trace_section
from disagg.load.workload import MIXES
from disagg.local.harness import REAL_TIME, serving, started_stack
from disagg.local.jaeger import spans_by_name

pytestmark = pytest.mark.apiserver

NS = "tracing"


def test_the_demo_model_traces_to_the_stacks_jaeger(tmp_path: Path) -> None:
    with (started_stack(NS, tmp_path / "logs", sim_env=REAL_TIME, tracing=True) as stack,
          serving(stack, {"observability": stack.tracing_spec(1.0)}) as model):
        assert stack.jaeger is not None
        # long RAG prompts: the remote path, so one trace spans the router and both pools
        phase = model.drive("traced", MIXES["long-rag"], rate=1.0, seconds=4, seed=1, progress=False)
        assert phase.results and all(r.ok for r in phase.results), [r.error for r in phase.results]
        section = trace_section(stack, model, stack.pod_logs(model.name, "router"))
        assert section is not None and section.missing is None, section
        slowest = max((r for r in phase.results if r.ttft_s is not None), key=lambda r: r.ttft_s or 0.0)
        assert section.slowest is not None and section.slowest.startswith(f"slowest request {slowest.id}: TTFT")
        assert section.trace is not None and section.trace_url is not None
        assert section.trace_url == stack.jaeger.trace_url(section.trace["traceID"])
        spans = spans_by_name(section.trace)
        root = spans[tracing.ROUTER_SPAN][0]
        assert root["tag"]["disagg.path"] == slowest.path
        if slowest.path == "remote":
            assert {s["service"] for s in spans[tracing.LLM_REQUEST_SPAN]} == {"demo-prefill", "demo-decode"}
        assert f" {tracing.ROUTER_SPAN} [disagg-router]" in section.waterfall[0]
        assert len(section.waterfall) == len(section.trace["spans"])
        url = stack.jaeger.url
    with pytest.raises(OSError):  # stopped with the stack
        urllib.request.urlopen(url + "/api/services", timeout=2)
