"""The router's Prometheus metrics (prefix ``disagg_``), in their own registry (one per router instance).

Phase histograms carry ``path`` (remote | local | fallback) and ``tenant`` (a configured tenant name or
``default``: bounded by the config). docs/observability.md says which phase comes from a per-request source (exact)
and which from the workers' recent vLLM metric averages (estimated; counted in ``disagg_phase_estimated_total``).
"""

from __future__ import annotations

import os

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess as prom_multiprocess

# Latency buckets from 1 ms to 120 s (phases span sub-millisecond relays to multi-second prefills).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0,
                   3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0, 120.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
                0.3, 0.5, 0.75, 1.0, 2.5)

# prompt lengths, 16 tokens to 128k (the demand histogram's _sum and _count are what the autoscaler reads)
PROMPT_TOKEN_BUCKETS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)

# observed ÷ predicted: 1 is exact; the tails say how far the placement's model drifts from the workers
RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0, 8.0)

PHASES = {
    "request_queue_wait": "Time a request waits in the router before its first upstream request is sent (exact).",
    "prefill_compute": "Remote path: the prefill worker's scheduled-to-first-token time from its per-request metrics "
                       "(exact, vLLM --enable-per-request-metrics), else the prefill leg round trip minus that "
                       "worker's vllm:request_queue_time_seconds average (estimated).",
    "kv_cache_pack": "Remote path: KV-transfer post/prepare time on the decode worker "
                     "(vllm:nixl_post_time_seconds average of that worker; estimated).",
    "kv_cache_transfer": "Remote path: KV-cache transfer time (vllm:nixl_xfer_time_seconds average of the decode "
                         "worker, capped at the decode leg's time to first byte; estimated).",
    "kv_cache_unpack": "Remote path: decode leg time to first byte not explained by decode queue, pack, transfer "
                       "and one decode step (derived from estimates; 0 when fully explained).",
    "decode_queue_wait": "Time the request waits on the decode worker before it is scheduled: its per-request "
                         "metrics on the local path (exact), else the vllm:request_queue_time_seconds average of "
                         "that worker, capped at time to first byte (estimated).",
    "first_token_emit": "Time to first token (TTFT) as the client sees it: request received to first token relayed "
                        "(exact).",
    "per_token_decode": "Time per output token (TPOT) after the first, as relayed to the client (exact).",
}


def multiprocess_dir() -> str | None:
    """The prometheus_client multiprocess directory when this process is one of ``--workers N`` (prefork.py)."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class RouterMetrics:
    """The router's metric families. Under ``--workers N`` (prometheus_client multiprocess mode) each gauge says how
    the workers' values combine on /metrics: in-flight requests and open connections are summed over live workers,
    ready workers and breaker states take the largest (any worker seeing a breaker open shows it open), the prefill
    wait estimate the smallest; counters and histograms are summed."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._exposition: CollectorRegistry | None = None
        if multiprocess_dir() is not None:
            self._exposition = CollectorRegistry()
            prom_multiprocess.MultiProcessCollector(self._exposition)
        r = self.registry
        self.phase: dict[str, Histogram] = {}
        for name, doc in PHASES.items():
            self.phase[name] = Histogram(
                f"disagg_{name}_seconds", doc, ["path", "tenant"], registry=r,
                buckets=TPOT_BUCKETS if name == "per_token_decode" else LATENCY_BUCKETS)
        self.decisions = Counter("disagg_routing_decisions", "Routing decisions by decision and reason.",
                                 ["decision", "reason"], registry=r)
        self.fallbacks = Counter("disagg_fallbacks", "Requests that left their chosen path, by cause.",
                                 ["cause"], registry=r)
        self.deflections = Counter(
            "disagg_prefill_deflections", "Prefill demand the prefill pool did not take in time, served elsewhere: "
            "requests the rule ladder meant for the pool but prefilled on a decode worker because the queue was past "
            "maxPrefillQueueWaitMs (onPrefillQueueOverload: LocalPrefill), and requests the SLO placement served "
            "whole on a decode or prefill worker because the remote path was at risk on the TTFT SLO (a predicted "
            "chance to miss it of at least 0.1, the floor of any overrule), mostly in its prefill leg (the "
            "autoscaler grows the prefill pool on it).",
            registry=r)
        self.routed_prompt_tokens = Histogram(
            "disagg_routed_prompt_tokens", "Prompt tokens of the requests routed, by the pool whose prefill capacity "
            "they demand (pool=prefill: sent for remote prefill, or meant for the prefill pool by the rules and "
            "prefilled elsewhere or refused because no remote pair could take it (starting, none ready, breakers "
            "open, queue past maxPrefillQueueWaitMs) or deflected by the SLO placement: the pool's demand whether "
            "or not it took it; pool=decode: prefilled where they decode by the rules' choice). Counted at the "
            "routing decision: the autoscaler's arrival rate and token mix per role (docs/autoscaling.md), free of "
            "the prefill queue's lag and of the ladder's spill.",
            ["pool"], registry=r, buckets=PROMPT_TOKEN_BUCKETS)
        self.hedges = Counter("disagg_hedges", "Remote streams whose KV hand-off was slow, raced by a local prefill, "
                              "by the path that answered (remote | local) or none (both failed).", ["winner"],
                              registry=r)
        self.prediction_ratio = Histogram(
            "disagg_placement_prediction_ratio", "SLO placement: observed ÷ predicted, per phase (ttft, tpot, "
            "prefill: the remote prefill leg) and the pool of the worker it was predicted for. 1 is exact; the "
            "router corrects each worker's predictions by its recent ratios (docs/router.md).", ["phase", "pool"],
            registry=r, buckets=RATIO_BUCKETS)
        self.requests = Counter("disagg_requests", "Requests by outcome (ok, client_error, upstream_error, "
                                "rejected, shed (refused by admission under overload), cancelled).",
                                ["outcome", "path"], registry=r)
        self.slo_requests = Counter("disagg_slo_requests", "Successful requests evaluated against the SLOs.",
                                    ["tenant"], registry=r)
        self.slo_met = Counter("disagg_slo_met_requests", "Requests that met both the TTFT and TPOT SLOs (goodput).",
                               ["tenant"], registry=r)
        self.inflight = Gauge("disagg_inflight_requests", "Requests in flight from this router, per pool.",
                              ["pool"], registry=r, multiprocess_mode="livesum")
        self.workers = Gauge("disagg_workers", "Ready workers known to the router, per pool.", ["pool"], registry=r,
                             multiprocess_mode="livemax")
        self.prompt_token_scale = Gauge(
            "disagg_prompt_token_scale", "Engine-counted ÷ estimated prompt tokens, measured from the engines' "
            "usage.prompt_tokens (text prompts without --tokenizer; 1 until an answer reports usage); applied to "
            "the router's text estimates.",
            # each worker process measures its share of the traffic: the replica shows the latest one, no pid label
            registry=r, multiprocess_mode="livemostrecent")
        self.prompt_token_scale.set(1.0)
        self.prefill_wait_estimate = Gauge(
            "disagg_prefill_queue_wait_estimate_seconds", "The router's current lowest estimated prefill-queue wait.",
            registry=r, multiprocess_mode="livemin")
        self.config_reloads = Counter("disagg_config_reloads", "Router config reloads by result.", ["result"],
                                      registry=r)
        self.circuit_state = Gauge(
            "disagg_circuit_state", "Circuit breaker state per target: 0 closed, 1 open, 2 half-open. pool=decode: "
            "worker is the decode URL; pool=pair: worker is '<prefill URL>-><decode URL>'.", ["pool", "worker"],
            registry=r, multiprocess_mode="livemax")
        self.mode_probes = Counter(
            "disagg_mode_probes", "Remote-path probes sent while the operator holds the model Aggregated, by outcome "
            "(ok: served by the remote path; failed: fell back or failed).", ["outcome"], registry=r)
        self.open_connections = Gauge("disagg_open_connections", "Client connections open on the router.",
                                      registry=r, multiprocess_mode="livesum")
        self.connections_closed = Counter(
            "disagg_connections_closed", "Client connections the router closed for hygiene, by reason "
            "(header_timeout, limit).", ["reason"], registry=r)
        self.phase_estimated = Counter(
            "disagg_phase_estimated", "Phase observations that came from the worker's recent metric averages instead "
            "of a per-request source (docs/observability.md has the phase → source table).", ["phase"], registry=r)
        self.tracing_errors = Counter(
            "disagg_tracing_errors", "Tracing problems, by reason (export_failed: a span batch the OTLP endpoint did "
            "not take; invalid_sample_ratio, invalid_endpoint: bad configuration). Requests are never affected.",
            ["reason"], registry=r)
        # admission under overload (router/admission.py, core.py RequestCore.admit); only when a tenant's overload
        # policy is not Admit
        self.admission = Counter(
            "disagg_admission", "Admission decisions under overload, per tenant and its priority class, by outcome "
            "(admitted, shed, cancelled) and reason (admitted: within_slo, over_slo (overload: Admit), released "
            "(after a queue wait), nothing_in_flight; shed: over_slo (overload: Shed), queue_full, queue_timeout; "
            "cancelled: client_gone).", ["tenant", "priority", "outcome", "reason"], registry=r)
        self.admission_queue = Gauge(
            "disagg_admission_queue_length", "Requests waiting in the router's admission queue, per tenant.",
            ["tenant"], registry=r, multiprocess_mode="livesum")
        self.admission_wait = Histogram(
            "disagg_admission_wait_seconds", "Time a request waited in the router's admission queue (released, "
            "timed out or cancelled); it counts in the request's TTFT.", ["tenant"], registry=r,
            buckets=LATENCY_BUCKETS)
        # the exact prefix index from the engines' KV cache events (issue 30: kvindex.py, kvsub.py)
        self.kv_index_blocks = Gauge(
            "disagg_kv_index_blocks", "Blocks in the router's prefix index per worker, from the worker's own KV cache "
            "events.", ["worker"], registry=r, multiprocess_mode="livemax")
        self.kv_events = Counter(
            "disagg_kv_events", "KV cache events applied to the prefix index, by type (stored, removed, cleared, "
            "orphan: a stored block whose parent the index lacked, skipped: unknown type).", ["type"], registry=r)
        self.kv_event_lag = Histogram(
            "disagg_kv_event_lag_seconds", "Time from an engine step's KV event batch (its timestamp) to the index "
            "applying it.", registry=r, buckets=LATENCY_BUCKETS)
        self.kv_event_gaps = Counter(
            "disagg_kv_event_gaps", "Sequence gaps in a worker's KV event stream, by outcome (recovered: replayed; "
            "reset: not replayable, the worker's entries dropped; restart: the publisher counted from 0 again).",
            ["outcome"], registry=r)
        self.prefix_cached_tokens = Counter(
            "disagg_prefix_expected_cached_tokens", "Prompt tokens the router expected cached on the worker it chose, "
            "by source (events: the exact index; estimate: the router's own record of what it sent).", ["source"],
            registry=r)
        for t in ("stored", "removed", "cleared", "orphan", "skipped"):
            self.kv_events.labels(t)
        for outcome in ("recovered", "reset", "restart"):
            self.kv_event_gaps.labels(outcome)
        for reason in ("export_failed", "invalid_sample_ratio", "invalid_endpoint"):
            self.tracing_errors.labels(reason)
        for outcome in ("ok", "failed"):
            self.mode_probes.labels(outcome)
        for reason in ("header_timeout", "limit"):
            self.connections_closed.labels(reason)
        for pool in ("prefill", "decode", "aggregated"):
            self.inflight.labels(pool)
            self.workers.labels(pool)

    def exposition(self) -> tuple[bytes, str]:
        """The /metrics body and content type: this router's registry, or the sum over all workers."""
        return generate_latest(self._exposition or self.registry), CONTENT_TYPE_LATEST
