"""`disagg plan --from-prometheus`: the traffic section from a real Prometheus scraping the router's and the
workers' metric families (the names router/metrics.py and vLLM export)."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from tests.exporter import text_exporter

from disagg.local.prometheus import LocalPrometheus, Target
from disagg.plan.prom import (
    PromSourceError,
    buckets_to_histogram,
    connect,
    parse_duration,
    traffic_from_prometheus,
)
from disagg.plan.sources import Overrides, assemble
from disagg.poll import wait_for
from disagg.router.metrics import RouterMetrics

# vLLM's request token buckets are 1-2-5 steps (vllm/v1/metrics/loggers.py build_1_2_5_buckets)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


def test_buckets_to_histogram() -> None:
    rows = [{"metric": {"le": le}, "value": [0, str(c)]} for le, c in
            (("100", 0), ("200", 30), ("500", 90), ("1000", 100), ("+Inf", 100))]
    assert buckets_to_histogram(rows) == [{"tokens": 150, "share": 0.3}, {"tokens": 350, "share": 0.6},
                                          {"tokens": 750, "share": 0.1}]
    assert parse_duration("1h") == 3600 and parse_duration("90s") == 90
    with pytest.raises(PromSourceError, match="--range 'soon': write a duration like"):
        parse_duration("soon")


def test_traffic_from_a_real_prometheus() -> None:
    reg = CollectorRegistry()
    router = RouterMetrics(reg)
    prompt = Histogram("vllm:request_prompt_tokens", "prompt tokens", registry=reg, buckets=TOKEN_BUCKETS)
    gen = Histogram("vllm:request_generation_tokens", "generation tokens", registry=reg, buckets=TOKEN_BUCKETS)
    hits = Counter("vllm:prefix_cache_hits", "hits", registry=reg)
    queries = Counter("vllm:prefix_cache_queries", "queries", registry=reg)
    server = text_exporter(reg)
    with LocalPrometheus() as prom:
        prom.set_targets([Target(f"127.0.0.1:{server.server_address[1]}")])
        query, query_range = connect(prom.url)

        def scraped() -> bool:
            return bool(query("disagg_requests_total")) or None  # type: ignore[return-value]

        router.requests.labels("ok", "remote").inc(0)
        for t in ("chat", "batch"):  # a series must exist before it counts up: increase() needs two samples
            router.slo_requests.labels(t).inc(0)
        wait_for(scraped, 30, "first scrape of the exporter")
        for i in range(300):  # 3:1 tenants, prompts ~150 / ~700 tokens, answers ~75 tokens, 40 % prefix hits
            tenant = "chat" if i % 4 else "batch"
            router.requests.labels("ok", "remote").inc()
            router.slo_requests.labels(tenant).inc()
            n_in = 150 if i % 2 else 700
            prompt.observe(n_in)
            gen.observe(75)
            queries.inc(n_in)
            hits.inc(0.4 * n_in)

        def counted() -> float | None:
            rows = query("sum(increase(disagg_requests_total[1m]))")
            v = float(rows[0]["value"][1]) if rows else 0.0
            return v if v >= 250 else None

        wait_for(counted, 30, "the requests in Prometheus")
        traffic, notes = traffic_from_prometheus(query, query_range, time.time(), 60.0, window_s=10.0)
        with pytest.raises(PromSourceError, match="no vllm:request_prompt_tokens / vllm:request_generation_tokens"):
            traffic_from_prometheus(query, query_range, time.time(), 60.0, selector='{job="nope"}')
    server.shutdown()
    assert traffic["inputTokens"]["histogram"] == [{"tokens": 150, "share": 0.5}, {"tokens": 750, "share": 0.5}]
    assert traffic["outputTokens"]["histogram"] == [{"tokens": 75, "share": 1.0}]
    assert traffic["prefixCacheHitShare"] == pytest.approx(0.4, abs=0.01)
    shares = {t["name"]: t["share"] for t in traffic["tenants"]}
    assert shares == pytest.approx({"batch": 0.25, "chat": 0.75}, abs=0.01)
    assert traffic["rate"]["peakRps"] >= traffic["rate"]["meanRps"] > 0
    prof = assemble(traffic, {}, Overrides(model="Llama-3.1-8B", ttft_ms=800, tpot_ms=40, gpus=("H100-SXM=4",)),
                    "Prometheus")
    assert prof.traffic.rate.peak == traffic["rate"]["peakRps"] and any("tenants" in n for n in notes)


def test_cli_names_an_unreachable_prometheus_and_a_bad_range(capsys: pytest.CaptureFixture[str]) -> None:
    from disagg.cli import main
    from disagg.local.procs import free_ports

    (port,) = free_ports(1)
    assert main(["plan", "--from-prometheus", f"http://127.0.0.1:{port}", "--range", "1h"]) == 2
    assert f"--from-prometheus http://127.0.0.1:{port}: cannot query it" in capsys.readouterr().err
    assert main(["plan", "--from-prometheus", f"http://127.0.0.1:{port}", "--range", "soon"]) == 2
    assert "--range 'soon': write a duration like 90s, 30m, 1h, 7d" in capsys.readouterr().err
    assert main(["plan"]) == 2
    assert "give one profile source: PROFILE.yaml, --from-log ROUTER.jsonl or --from-prometheus URL" in \
        capsys.readouterr().err
