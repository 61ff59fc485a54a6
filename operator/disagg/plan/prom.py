"""``disagg plan --from-prometheus URL --range 1h``: the traffic section from what Prometheus holds.

The router's families (router/metrics.py; prometheus_client adds ``_total`` to counters) give the arrival rate
and the tenants; the workers' vLLM families give the token distributions and the prefix-cache share (the names
vLLM 0.33.0 exports, which the simulated worker exports too: sim/metrics.py ``vllm:request_prompt_tokens``,
``vllm:request_generation_tokens``, ``vllm:prefix_cache_queries``, ``vllm:prefix_cache_hits``):

==========================  ========================================================================================
rate (mean)                 ``sum(increase(disagg_requests_total[RANGE])) / RANGE``
rate (peak)                 max over the range of ``sum(rate(disagg_requests_total[WINDOW]))`` (step WINDOW)
tenants                     ``sum by (tenant) (increase(disagg_slo_requests_total[RANGE]))``
input tokens                ``sum by (le) (increase(vllm:request_prompt_tokens_bucket{SEL}[RANGE]))``
output tokens               ``sum by (le) (increase(vllm:request_generation_tokens_bucket{SEL}[RANGE]))``
prefix-cache share          hits ÷ queries (``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``)
==========================  ========================================================================================

``SEL`` (``--worker-selector``, e.g. ``{pod=~"chat-8b-decode-.*"}``) should pick the pool that sees every
request once — the decode pool (it serves the remote and the local path); without it, a remote request's prompt
is counted on its prefill worker too and the prefill legs' one-token generations are in the output histogram.
Token histograms are bucketed (vLLM's buckets are 1-2-5 steps), so the distributions are coarser than a log's;
per-tenant token distributions are not in any metric (every tenant gets the overall ones).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

Query = Callable[[str], list[dict[str, Any]]]
RangeQuery = Callable[[str, float, float, float], list[dict[str, Any]]]


class PromSourceError(ValueError):
    pass


def parse_duration(text: str, flag: str = "--range") -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*", text)
    if not m:
        raise PromSourceError(f"{flag} {text!r}: write a duration like 90s, 30m, 1h, 7d")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]


def _prom_duration(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


def _scalar(rows: list[dict[str, Any]]) -> float:
    if not rows:
        return math.nan
    try:
        return float(rows[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return math.nan


def buckets_to_histogram(rows: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Cumulative ``le`` buckets (one row per ``le``) → ``[{tokens, share}]``: each non-empty bucket (lo, hi] at its
    midpoint (the first at hi / 2, +Inf at 1.5 × the last finite bound)."""
    pts: list[tuple[float, float]] = []
    for r in rows:
        le = r.get("metric", {}).get("le")
        try:
            bound = math.inf if le in ("+Inf", "Inf", "inf") else float(le)
            pts.append((bound, float(r["value"][1])))
        except (TypeError, ValueError, KeyError, IndexError):
            continue
    pts.sort()
    out: list[dict[str, float]] = []
    prev_le, prev_c = 0.0, 0.0
    total = pts[-1][1] if pts else 0.0
    for le, c in pts:
        n = c - prev_c
        if n > 0 and total > 0:
            tok = prev_le * 1.5 if math.isinf(le) else (prev_le + le) / 2 if prev_le > 0 else le / 2
            out.append({"tokens": max(1, round(tok)), "share": round(n / total, 6)})
        prev_le = prev_le if math.isinf(le) else le
        prev_c = max(prev_c, c)
    merged: dict[int, float] = {}
    for b in out:
        merged[int(b["tokens"])] = merged.get(int(b["tokens"]), 0.0) + b["share"]
    return [{"tokens": t, "share": s} for t, s in sorted(merged.items())]


def traffic_from_prometheus(query: Query, query_range: RangeQuery, end: float, range_s: float,
                            window_s: float = 60.0, selector: str = "") -> tuple[dict[str, Any], list[str]]:
    """The ``traffic`` section from Prometheus over [end − range, end]; raises PromSourceError naming the metric
    that is missing."""
    rng = _prom_duration(range_s)
    total = _scalar(query(f"sum(increase(disagg_requests_total[{rng}]))"))
    if not total or math.isnan(total) or total <= 0:
        raise PromSourceError(f"no requests in disagg_requests_total over the last {rng}: is Prometheus scraping "
                              "the router (its /metrics), and did it serve traffic in that range? Try a longer "
                              "--range")
    mean = total / range_s
    w = min(window_s, range_s / 4)
    series = query_range(f"sum(rate(disagg_requests_total[{_prom_duration(w)}]))", end - range_s, end, w)
    vals = [float(v[1]) for s in series for v in s.get("values", []) if v[1] not in ("NaN", "+Inf")]
    peak = max([mean, *vals])
    sel = selector or ""
    hin = buckets_to_histogram(query(f"sum by (le) (increase(vllm:request_prompt_tokens_bucket{sel}[{rng}]))"))
    hout = buckets_to_histogram(query(
        f"sum by (le) (increase(vllm:request_generation_tokens_bucket{sel}[{rng}]))"))
    missing = [n for n, h in (("vllm:request_prompt_tokens", hin), ("vllm:request_generation_tokens", hout))
               if not h]
    if missing:
        raise PromSourceError(f"no {' / '.join(missing)} histogram samples{' for ' + sel if sel else ''} over the "
                              f"last {rng}: is Prometheus scraping the workers' /metrics (check --worker-selector)?")
    traffic: dict[str, Any] = {"inputTokens": {"histogram": hin[:64]}, "outputTokens": {"histogram": hout[:64]},
                               "rate": {"meanRps": round(mean, 4), "peakRps": round(peak, 4)}}
    notes = [f"{total:.0f} requests over {rng}: rate mean {mean:.3g} req/s, peak {peak:.3g} req/s "
             f"({_prom_duration(w)} windows)"]
    if w == 60.0:
        traffic["burstiness"] = {"peakRps60s": round(peak, 4)}
    notes.append("burstiness: " + ("peakRps60s from the 1m rate; " if w == 60.0 else "")
                 + "the inter-arrival cv and the 1-s/10-s peaks are finer than Prometheus's samples: cv 1 (Poisson) "
                 "is assumed; measure them with --from-log, or write traffic.burstiness by hand")
    hits = _scalar(query(f"sum(increase(vllm:prefix_cache_hits_total{sel}[{rng}]))"))
    queries = _scalar(query(f"sum(increase(vllm:prefix_cache_queries_total{sel}[{rng}]))"))
    if queries and not math.isnan(queries) and queries > 0 and not math.isnan(hits):
        traffic["prefixCacheHitShare"] = round(min(0.99, hits / queries), 4)
        notes.append(f"prefix-cache share {hits / queries:.1%} (vllm:prefix_cache_hits / queries)")
    tenants = [(r.get("metric", {}).get("tenant", "default"), float(r["value"][1]))
               for r in query(f"sum by (tenant) (increase(disagg_slo_requests_total[{rng}]))")]
    tenants = [(n, c) for n, c in tenants if c > 0]
    if len(tenants) > 1:
        from .reqlog import tenant_name

        s = sum(c for _, c in tenants)
        traffic["tenants"] = [{"name": tenant_name(n), "share": round(c / s, 6)} for n, c in sorted(tenants)][:16]
        notes.append("tenants: " + ", ".join(f"{n} {c / s:.0%}" for n, c in sorted(tenants)) +
                     " (shares only: per-tenant token distributions are not in the metrics)")
    return traffic, notes


def connect(url: str) -> tuple[Query, RangeQuery]:
    """prometheus-api-client's PrometheusConnect as the two query functions."""
    from datetime import UTC, datetime

    from prometheus_api_client import PrometheusConnect

    pc = PrometheusConnect(url=url, disable_ssl=True)

    def query(q: str) -> list[dict[str, Any]]:
        return list(pc.custom_query(query=q))

    def query_range(q: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        return list(pc.custom_query_range(query=q, start_time=datetime.fromtimestamp(start, tz=UTC),
                                          end_time=datetime.fromtimestamp(end, tz=UTC),
                                          step=_prom_duration(step)))

    return query, query_range
