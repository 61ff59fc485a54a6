"""vLLM's Prometheus metrics, same names, types, labels and buckets as the emulated release (vLLM 0.33.0 by
default: vllm/v1/metrics/loggers.py and vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py).

Families that came or went between 0.11.2 and 0.33.0 follow the version table (disagg.vllm_versions.METRICS): an
emulated release without a family does not export it (e.g. 0.11.2 has ``vllm:time_per_output_token_seconds``
and none of ``vllm:prompt_tokens_by_source``, ``vllm:num_requests_waiting_by_reason``,
``vllm:nixl_num_kv_expired_reqs``).

All durations are *simulated* seconds (see docs/simulator.md, "Time").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar, cast

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..vllm_versions import DEFAULT, VllmProfile

CONTENT_TYPE = CONTENT_TYPE_LATEST

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_TOKENS_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
NIXL_TIME_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0]
NIXL_BYTES_BUCKETS = [2 ** (10 + i) for i in range(1, 25, 2)]
NIXL_DESC_BUCKETS = [10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000]
FINISH_REASONS = ("stop", "length", "abort", "error")


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's vllm.v1.metrics.loggers.build_1_2_5_buckets."""
    out: list[int] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exponent
            if v > max_value:
                return out
            out.append(v)
        exponent += 1


M = TypeVar("M", Counter, Gauge, Histogram)


class Registry:
    """One per process: the families, shared by the engines (data-parallel ranks) of the process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._families: dict[str, Any] = {}

    def family(self, cls: type[M], name: str, doc: str, labelnames: list[str], exported: bool = True,
               **kw: Any) -> M:
        """The family ``name``; one the emulated release lacks (``exported`` False) is kept off /metrics."""
        f = self._families.get(name)
        if f is None:
            registry = self.registry if exported else CollectorRegistry(auto_describe=True)
            f = self._families[name] = cls(name, doc, labelnames, registry=registry, **kw)
        if not isinstance(f, cls):
            raise TypeError(f"metric family {name} is a {type(f).__name__}, not a {cls.__name__}")
        return f

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Off:
    """A metric that records nothing (``Metrics(enabled=False)``): the same calls, no cost."""

    def labels(self, *_a: Any, **_kw: Any) -> _Off:
        return self

    def inc(self, *_a: Any) -> None:
        pass

    def dec(self, *_a: Any) -> None:
        pass

    def set(self, *_a: Any) -> None:
        pass

    def observe(self, *_a: Any) -> None:
        pass


_OFF = _Off()

# Families the engine writes per token or per step: a recording view (``Metrics(record=...)``) leaves them out, so
# that the twin's decode fast-forward, which skips those calls, changes nothing it records. (The TTFT histogram is
# per request: a fast-forward starts only once every request in it has its first token, sim/fastforward.py.)
PER_STEP = frozenset({"vllm:generation_tokens", "vllm:prompt_tokens",
                      "vllm:prompt_tokens_by_source", "vllm:prompt_tokens_cached", "vllm:inter_token_latency_seconds",
                      "vllm:time_per_output_token_seconds", "vllm:iteration_tokens_total",
                      "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions"})


class _Recorded:
    """One series of a recording view: what a scrape of it would read after summing over labels — a gauge's or
    counter's value, a histogram's ``_sum`` and ``_count`` (no buckets)."""

    __slots__ = ("children", "count", "hist", "value")

    def __init__(self, hist: bool) -> None:
        self.hist = hist
        self.value = 0.0
        self.count = 0.0
        self.children: dict[str, _Recorded] = {}  # a family's series by their labels beyond model_name/engine

    def labels(self, *_a: Any, **kw: Any) -> _Recorded:
        extra = sorted((k, v) for k, v in kw.items() if k not in ("model_name", "engine"))
        if not extra:
            return self
        key = ",".join(f'{k}="{v}"' for k, v in extra)
        child = self.children.get(key)
        if child is None:
            child = self.children[key] = _Recorded(self.hist)
        return child

    def inc(self, v: float = 1.0) -> None:
        self.value += v

    def dec(self, v: float = 1.0) -> None:
        self.value -= v

    def set(self, v: float) -> None:
        self.value = v

    def observe(self, v: float) -> None:
        self.value += v
        self.count += 1.0


class Metrics:
    """The series of one engine (label ``engine`` = its data-parallel rank): where the engine reports its stats.

    By default Prometheus series (``disagg sim``'s /metrics). ``record``: a recording view instead, for the twin —
    only the families named there record (in process, no Prometheus: :meth:`scraped` is what a scrape would read),
    every other series is a no-op; a per-token or per-step family (``PER_STEP``) cannot be recorded, so the decode
    fast-forward stays exact. ``enabled`` False: every series is a no-op."""

    def __init__(self, model_name: str, max_model_len: int, engine: str = "0", nixl: bool = False,
                 shared: Registry | None = None, release: VllmProfile = DEFAULT, enabled: bool = True,
                 record: frozenset[str] | None = None) -> None:
        self.shared = shared or Registry()
        self.registry = self.shared.registry
        if record is not None and record & PER_STEP:
            raise ValueError(f"record: per-step families cannot be recorded: {sorted(record & PER_STEP)}")
        self.recording = record is not None
        # every series is exact for every step and token (what the decode fast-forward would skip)
        self.per_step = enabled and record is None
        self._recorded: dict[str, _Recorded] = {}

        def fam(cls: type[M], name: str, doc: str, labelnames: list[str], **kw: Any) -> M:
            if not enabled:
                return cast(M, _OFF)
            if record is not None:
                if name not in record or not release.has_metric(name):
                    return cast(M, _OFF)
                return cast(M, self._recorded.setdefault(name, _Recorded(cls is Histogram)))
            return self.shared.family(cls, name, doc, labelnames, exported=release.has_metric(name), **kw)
        ln = ["model_name", "engine"]
        lv = {"model_name": model_name, "engine": engine}

        def g(name: str, doc: str) -> Gauge:
            return fam(Gauge, name, doc, ln).labels(**lv)

        def c(name: str, doc: str) -> Counter:
            return fam(Counter, name, doc, ln).labels(**lv)

        def h(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return fam(Histogram, name, doc, ln, buckets=buckets).labels(**lv)

        self.running = g("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = g("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        by_reason = fam(Gauge, "vllm:num_requests_waiting_by_reason",
                        "Number of requests waiting, by reason (capacity: no room; deferred: waiting for remote KV).",
                        [*ln, "reason"])
        self.waiting_capacity = by_reason.labels(**lv, reason="capacity")
        self.waiting_deferred = by_reason.labels(**lv, reason="deferred")
        self.kv_usage = g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = c("vllm:prefix_cache_queries",
                                "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = c("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.preemptions = c("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = c("vllm:prompt_tokens", "Number of prefill tokens processed.")
        by_source = fam(Counter, "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", [*ln, "source"])
        self.prompt_local_compute = by_source.labels(**lv, source="local_compute")
        self.prompt_local_cache_hit = by_source.labels(**lv, source="local_cache_hit")
        self.prompt_external = by_source.labels(**lv, source="external_kv_transfer")
        self.prompt_cached = c("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).")
        self.generation_tokens = c("vllm:generation_tokens", "Number of generation tokens processed.")
        success = fam(Counter, "vllm:request_success", "Count of successfully processed requests.",
                      [*ln, "finished_reason"])
        self.success = {reason: success.labels(**lv, finished_reason=reason) for reason in FINISH_REASONS}
        self.req_prompt_tokens = h("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                   build_1_2_5_buckets(max_model_len))
        self.req_generation_tokens = h("vllm:request_generation_tokens", "Number of generation tokens processed.",
                                       build_1_2_5_buckets(max_model_len))
        self.req_max_tokens = h("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
                                build_1_2_5_buckets(max_model_len))
        self.iteration_tokens = h("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                  ITERATION_TOKENS_BUCKETS)
        self.ttft = h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                      TTFT_BUCKETS)
        self.tpot = h("vllm:time_per_output_token_seconds",
                      "Histogram of time per output token in seconds."
                      "DEPRECATED: Use vllm:inter_token_latency_seconds instead.", ITL_BUCKETS)
        self.itl = h("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.req_tpot = h("vllm:request_time_per_output_token_seconds",
                          "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        self.e2e = h("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                     REQUEST_LATENCY_BUCKETS)
        self.queue_time = h("vllm:request_queue_time_seconds",
                            "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.inference_time = h("vllm:request_inference_time_seconds",
                                "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.prefill_time = h("vllm:request_prefill_time_seconds",
                              "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS)
        self.decode_time = h("vllm:request_decode_time_seconds",
                             "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS)
        self.cache_config = fam(Gauge, "vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                ["block_size", "num_gpu_blocks", "gpu_memory_utilization", "enable_prefix_caching",
                                 "cache_dtype", "engine"])
        self.nixl = nixl
        if nixl:
            self.nixl_xfer_time = h("vllm:nixl_xfer_time_seconds",
                                    "Histogram of transfer duration for NIXL KV Cache transfers.", NIXL_TIME_BUCKETS)
            self.nixl_post_time = h("vllm:nixl_post_time_seconds",
                                    "Histogram of transfer post time for NIXL KV Cache transfers.",
                                    [0.001, *NIXL_TIME_BUCKETS])
            self.nixl_bytes = h("vllm:nixl_bytes_transferred",
                                "Histogram of bytes transferred per NIXL KV Cache transfers.", NIXL_BYTES_BUCKETS)
            self.nixl_descs = h("vllm:nixl_num_descriptors",
                                "Histogram of number of descriptors per NIXL KV Cache transfers.", NIXL_DESC_BUCKETS)
            self.nixl_failed = c("vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers.")
            self.nixl_failed_notifs = c("vllm:nixl_num_failed_notifications",
                                        "Number of failed NIXL KV Cache notifications.")
            self.nixl_expired = c("vllm:nixl_num_kv_expired_reqs",
                                  "Number of requests that had their KV expire. "
                                  "NOTE: This metric is tracked on the P instance.")
            self.nixl_after_expiry = c("vllm:nixl_num_notifications_after_expiry",
                                       "Number of completion notifications for requests that were no longer "
                                       "tracked, usually because their KV lease expired. The KV blocks may have "
                                       "been reused before the transfer finished. Counted per notification (one "
                                       "per remote rank), not per request.")

    def render(self) -> bytes:
        return self.shared.render()

    def scraped(self) -> dict[str, float]:
        """A recording view's values as the router's scrape parses them (router/load.py ``parse_prometheus``:
        summed over labels; histograms as ``<name>_sum`` and ``<name>_count``)."""
        out: dict[str, float] = {}
        for name, r in self._recorded.items():
            if r.hist:
                out[name + "_sum"] = r.value + sum(c.value for c in r.children.values())
                out[name + "_count"] = r.count + sum(c.count for c in r.children.values())
                continue
            out[name] = r.value + sum(c.value for c in r.children.values())
            for key, c in r.children.items():  # as the router reads a family per label value (load.BY_LABEL)
                out[f"{name}{{{key}}}"] = c.value
        return out
