"""Named PromQL queries (the autoscaler's and mode controller's only inputs) and their collection.

Every series is selected by the labels the scrape configuration attaches to a model's pods (the chart's
PodMonitor/ServiceMonitor relabelings; the local demo's file_sd labels):

    namespace="<ns>", model="<DisaggregatedModel name>", role="prefill|decode|aggregated|router"

docs/autoscaling.md lists each query with its meaning. Queries run through prometheus-api-client (sync, with
retries), off the event loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..api.models import DisaggregatedModelSpec
from . import access
from .observe import INCREASES

# name -> (PromQL template, description). {sel} is the model selector; {w} the window.
QUERIES: dict[str, tuple[str, str]] = {
    "prefill_queue_wait_p95": (
        "histogram_quantile(0.95, sum by (le) ("
        'rate(vllm:request_queue_time_seconds_bucket{{{sel},role="prefill"}}[{w}])))',
        "p95 time requests wait in the prefill workers' queues (vLLM's own histogram), seconds",
    ),
    "ttft_p95": (
        "histogram_quantile(0.95, sum by (le) (rate(disagg_first_token_emit_seconds_bucket{{{sel}}}[{w}])))",
        "p95 time to first token as clients see it (router), seconds",
    ),
    "remote_ttft_p95": (
        "histogram_quantile(0.95, sum by (le) ("
        'rate(disagg_first_token_emit_seconds_bucket{{{sel},path="remote"}}[{w}])))',
        "p95 time to first token of remote-prefill requests (router), seconds: the prefill pool's share of TTFT",
    ),
    "prefill_waiting_per_replica": (
        'avg(vllm:num_requests_waiting{{{sel},role="prefill"}})',
        "requests waiting per prefill worker",
    ),
    "prefill_deflected_share": (
        "sum(rate(disagg_prefill_deflections_total{{{sel}}}[{w}])) / "
        'sum(rate(disagg_routed_prompt_tokens_count{{{sel},pool="prefill"}}[{w}]))',
        "share of the prefill pool's demand it did not take: requests prefilled on a decode worker because the "
        "prefill queue was past maxPrefillQueueWaitMs, and requests the rule ladder sent remote that the SLO "
        "placement served elsewhere because the remote path was at risk on the TTFT SLO, mostly in its "
        "prefill leg (router), 0..1",
    ),
    "tpot_p95": (
        "histogram_quantile(0.95, sum by (le) (rate(disagg_per_token_decode_seconds_bucket{{{sel}}}[{w}])))",
        "p95 time per output token as clients see it (router), seconds",
    ),
    "decode_running_per_replica": (
        'avg(vllm:num_requests_running{{{sel},role="decode"}})',
        "sequences running per decode worker",
    ),
    "decode_kv_cache_usage": (
        'avg(vllm:kv_cache_usage_perc{{{sel},role="decode"}})',
        "KV-cache usage of the decode workers, 0..1",
    ),
    "decode_active_sequences": (
        'sum(vllm:num_requests_running{{{sel},role="decode"}})',
        "sequences running on the decode pool",
    ),
    "kv_transfer_p95": (
        "histogram_quantile(0.95, sum by (le) ("
        'rate(disagg_kv_cache_transfer_seconds_bucket{{{sel},path="remote"}}[{w}])))',
        "p95 KV-cache transfer time on the remote path (router, from the decode workers' NIXL metrics), seconds",
    ),
    # A failed KV load is counted where it is seen once: the decode engines' own failed-transfer counter, which
    # counts it under either kv_load_failure_policy — under "recompute" (the operator's default) the decode
    # recomputes the prompt and answers 200, so the router never sees the fault (found on a real 0.32.0 engine,
    # e2e/test_real_vllm.py) — and the router's transfer timeouts (kv_transfer_*), which no engine counts. The
    # router's kv_load_failed (the same failed load, under "fail") is left out: it would count twice. vLLM
    # counts failed NIXL handshakes in its stats but exports no metric for them (nixl/stats.py, 0.32.0 and 0.33.0),
    # so a handshake failure under "recompute" stays invisible here.
    "kv_failure_rate": (
        '((sum(rate(disagg_fallbacks_total{{{sel},cause=~"kv_transfer_.*"}}[{w}])) or vector(0)) + '
        '(sum(rate(vllm:nixl_num_failed_transfers_total{{{sel},role="decode"}}[{w}])) or vector(0))) / '
        'sum(rate(disagg_routing_decisions_total{{{sel},decision="remote"}}[{w}]))',
        "share of remote-prefill attempts whose KV transport failed: failed NIXL transfers on the decode pool "
        "(vLLM's counter: recomputed or failed loads alike) plus the router's transfer timeouts (kv_transfer_*); "
        "prefill queueing/capacity causes (prefill_*) do not count",
    ),
    "mode_probes_ok": (
        'sum(increase(disagg_mode_probes_total{{{sel},outcome="ok"}}[{w}]))',
        "remote-path probes that succeeded in the window (sent while the operator holds the model Aggregated)",
    ),
    "mode_probes_failed": (
        'sum(increase(disagg_mode_probes_total{{{sel},outcome="failed"}}[{w}]))',
        "remote-path probes that failed (and fell back) in the window",
    ),
    "goodput": (
        "sum(increase(disagg_slo_met_requests_total{{{sel}}}[{w}])) / "
        "sum(increase(disagg_slo_requests_total{{{sel}}}[{w}]))",
        "share of requests meeting both the TTFT and TPOT SLOs",
    ),
    "prefix_cache_hit_rate": (
        'sum(rate(vllm:prefix_cache_hits_total{{{sel},role="decode"}}[{w}])) / '
        'sum(rate(vllm:prefix_cache_queries_total{{{sel},role="decode"}}[{w}]))',
        "prefix-cache hit rate of the decode pool (tokens)",
    ),
    "targets_up": (
        "sum(up{{{sel}}})",
        "scrape targets of this model that answered their last scrape",
    ),
}


# Requests each pod of a pool holds now: the engines' own gauges (running + waiting), per pod label. Engines, not a
# router: with several router replicas no router sees a worker's whole load. {role}: prefill, decode or aggregated.
POD_LOAD = ('sum by (pod) (vllm:num_requests_running{{{sel},role="{role}"}}) + '
            'sum by (pod) (vllm:num_requests_waiting{{{sel},role="{role}"}})')


def pod_load(query: QueryFn, namespace: str, model: str, role: str) -> dict[str, float]:
    """{pod name: requests running or waiting on it} for one pool; a pod Prometheus has not scraped is absent.
    Raises what the query function raises (Prometheus unreachable)."""
    out: dict[str, float] = {}
    for series in query(POD_LOAD.format(sel=selector(namespace, model), role=role)):
        pod = (series.get("metric") or {}).get("pod")
        value = _scalar([series])
        if pod and value is not None:
            out[pod] = value
    return out


def selector(namespace: str, model: str) -> str:
    return f'namespace="{namespace}",model="{model}"'


def render(name: str, namespace: str, model: str, window_seconds: int) -> str:
    template, _ = QUERIES[name]
    return _promql(template, selector(namespace, model), window_seconds)


def _promql(template: str, sel: str, window_seconds: int) -> str:
    return template.format(sel=sel, w=f"{max(window_seconds, 2)}s")


# Sample.reason when there is an error: Prometheus did not answer, or answered without any target of the model.
PROMETHEUS_UNAVAILABLE = "PrometheusUnavailable"
NO_SCRAPE_TARGETS = "NoScrapeTargets"
NOT_CONFIGURED = "PrometheusNotConfigured"


@dataclass(frozen=True)
class Sample:
    values: dict[str, float | None]
    error: str | None = None
    reason: str | None = None  # why there is an error (one of the constants above); None when the sample is good

    def get(self, name: str) -> float | None:
        return self.values.get(name)


QueryFn = access.QueryFn


def connect(url: str, timeout_seconds: int = 5, token: str | None = None) -> QueryFn:
    """A query function bound to one Prometheus by URL (and a bearer token): :func:`disagg.autoscaling.access.connect`,
    which also takes basic auth, headers and a CA bundle."""
    return access.connect(access.PrometheusAccess(url, timeout_seconds, token=token))


def collect(query: QueryFn, namespace: str, model: str, spec: DisaggregatedModelSpec) -> Sample:
    """Run every named query once (and, for the predictive policy, every increment over
    spec.autoscaling.intervalSeconds: autoscaling/observe.py). A transport error makes the whole sample an error
    (the caller holds)."""
    sel = selector(namespace, model)
    values: dict[str, float | None] = {}

    def run(templates: dict[str, str], window_seconds: int, prefix: str = "") -> Sample | None:
        for name, template in templates.items():
            try:
                result = query(_promql(template, sel, window_seconds))
            except Exception as e:  # noqa: BLE001 - any failure to reach Prometheus means "hold"
                return Sample(values, error=f"Prometheus query {name} failed: {type(e).__name__}: {e}"[:300],
                              reason=PROMETHEUS_UNAVAILABLE)
            values[prefix + name] = _scalar(result)
        return None

    failed = run({name: template for name, (template, _) in QUERIES.items()}, spec.mode_policy.window_seconds)
    if failed is not None:
        return failed
    if not values.get("targets_up"):
        return Sample(values, error="no scrape target of this model is up in Prometheus", reason=NO_SCRAPE_TARGETS)
    if spec.autoscaling.enabled and spec.autoscaling.policy == "Predictive":
        failed = run(INCREASES, spec.autoscaling.interval_seconds, LOAD_PREFIX)
    return failed or Sample(values)


LOAD_PREFIX = "increase:"  # Sample.values keys of the predictive policy's increments (observe.INCREASES' names)


def _scalar(result: list[dict[str, Any]]) -> float | None:
    if not result:
        return None
    try:
        v = float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return None if math.isnan(v) or math.isinf(v) else v
