"""The one list of metric names the chart's alerts and dashboard may query.

- Router metrics (``disagg_*``): read from the router's own code (``disagg.router.metrics.RouterMetrics``), so a
  renamed router metric fails the chart tests instead of silently emptying a panel or muting an alert.
- vLLM worker metrics (``vllm:*``): vLLM 0.11.2 (the default engine image, ``vllm/vllm-openai:v0.11.2``), read from
  its source: ``vllm/v1/metrics/loggers.py`` (PrometheusStatLogger, labels ``model_name, engine``) and
  ``vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py`` (NixlPromMetrics). Deprecated/hidden
  names (``vllm:gpu_cache_usage_perc``, ``vllm:gpu_prefix_cache_*``, ``vllm:time_per_output_token_seconds``)
  are left out on purpose.
- Target labels added by Prometheus / the chart's PodMonitor relabelings (docs/observability.md):
  ``namespace, pod, container, endpoint, job, instance, service, model, role, compat_hash``.

Names are *family* names with a type; ``exposed()`` expands them to the sample names Prometheus stores
(``_total`` for counters, ``_bucket/_sum/_count`` for histograms).
"""

from __future__ import annotations

from dataclasses import dataclass

TARGET_LABELS = frozenset(
    {"namespace", "pod", "container", "endpoint", "job", "instance", "service", "model", "role", "compat_hash"}
)


@dataclass(frozen=True)
class Metric:
    name: str  # family name (no _total / _bucket suffix)
    type: str  # counter | gauge | histogram
    labels: frozenset[str]
    source: str  # router | vllm | operator

    def samples(self) -> tuple[str, ...]:
        if self.type == "counter":
            return (f"{self.name}_total",)
        if self.type == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


_V = frozenset({"model_name", "engine"})
# vLLM 0.11.2: (family name, type, extra labels beyond model_name/engine)
VLLM_0_11_2: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("vllm:num_requests_running", "gauge", ()),
    ("vllm:num_requests_waiting", "gauge", ()),
    ("vllm:engine_sleep_state", "gauge", ("sleep_state",)),
    ("vllm:kv_cache_usage_perc", "gauge", ()),
    ("vllm:corrupted_requests", "counter", ()),
    ("vllm:prefix_cache_queries", "counter", ()),
    ("vllm:prefix_cache_hits", "counter", ()),
    ("vllm:external_prefix_cache_queries", "counter", ()),
    ("vllm:external_prefix_cache_hits", "counter", ()),
    ("vllm:mm_cache_queries", "counter", ()),
    ("vllm:mm_cache_hits", "counter", ()),
    ("vllm:num_preemptions", "counter", ()),
    ("vllm:prompt_tokens", "counter", ()),
    ("vllm:generation_tokens", "counter", ()),
    ("vllm:request_success", "counter", ("finished_reason",)),
    ("vllm:request_prompt_tokens", "histogram", ()),
    ("vllm:request_generation_tokens", "histogram", ()),
    ("vllm:iteration_tokens_total", "histogram", ()),
    ("vllm:request_max_num_generation_tokens", "histogram", ()),
    ("vllm:request_params_n", "histogram", ()),
    ("vllm:request_params_max_tokens", "histogram", ()),
    ("vllm:time_to_first_token_seconds", "histogram", ()),
    ("vllm:inter_token_latency_seconds", "histogram", ()),
    ("vllm:request_time_per_output_token_seconds", "histogram", ()),
    ("vllm:e2e_request_latency_seconds", "histogram", ()),
    ("vllm:request_queue_time_seconds", "histogram", ()),
    ("vllm:request_inference_time_seconds", "histogram", ()),
    ("vllm:request_prefill_time_seconds", "histogram", ()),
    ("vllm:request_decode_time_seconds", "histogram", ()),
    # NixlConnector (KV transfer), on workers that run it
    ("vllm:nixl_xfer_time_seconds", "histogram", ()),
    ("vllm:nixl_post_time_seconds", "histogram", ()),
    ("vllm:nixl_bytes_transferred", "histogram", ()),
    ("vllm:nixl_num_descriptors", "histogram", ()),
    ("vllm:nixl_num_failed_transfers", "counter", ()),
    ("vllm:nixl_num_failed_notifications", "counter", ()),
)


def vllm_metrics() -> list[Metric]:
    return [Metric(n, t, _V | frozenset(extra), "vllm") for n, t, extra in VLLM_0_11_2]


def router_metrics() -> list[Metric]:
    """The router's metric families, from its registry (imported, not copied)."""
    from prometheus_client.metrics import MetricWrapperBase

    from disagg.router.metrics import RouterMetrics

    rm = RouterMetrics()
    out: list[Metric] = []
    seen: set[int] = set()
    for value in vars(rm).values():
        wrappers = value.values() if isinstance(value, dict) else [value]
        for w in wrappers:
            if isinstance(w, MetricWrapperBase) and id(w) not in seen:
                seen.add(id(w))
                out.append(Metric(w._name, str(w._type), frozenset(w._labelnames), "router"))
    return out


def catalog() -> dict[str, Metric]:
    """Sample name → Metric, for every metric the chart may query."""
    out: dict[str, Metric] = {}
    for m in [*router_metrics(), *vllm_metrics()]:
        for s in m.samples():
            out[s] = m
    return out
