"""Generates files/dashboard.json (the Grafana dashboard the chart ships). Edit this, then run:

    python charts/disagg-operator/dashboard/generate.py > charts/disagg-operator/files/dashboard.json

tests/chart/test_dashboard.py fails when the JSON and this generator drift, and checks every query.
"""

import json
SEL = 'namespace=~"$namespace", model=~"$model"'
RI = "$__rate_interval"
pid = [0]
def nid():
    pid[0] += 1
    return pid[0]
def q(quantile, metric, extra="", by=""):
    sel = SEL + (", " + extra if extra else "")
    b = f"{by}, le" if by else "le"
    return f'histogram_quantile({quantile}, sum by ({b}) (rate({metric}_bucket{{{sel}}}[{RI}])))'
def target(expr, legend, ref):
    return {"datasource": {"type": "prometheus", "uid": "${datasource}"}, "expr": expr, "legendFormat": legend, "refId": ref}
def ts(title, targets, unit, x, y, w=8, h=8, desc="", stack=False):
    return {"id": nid(), "type": "timeseries", "title": title, "description": desc,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"x": x, "y": y, "w": w, "h": h},
            "fieldConfig": {"defaults": {"unit": unit, "custom": {"drawStyle": "line", "fillOpacity": 10 if not stack else 40,
                            "stacking": {"mode": "normal" if stack else "none", "group": "A"}}}, "overrides": []},
            "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}},
            "targets": [target(e, l, chr(65 + i)) for i, (e, l) in enumerate(targets)]}
def stat(title, expr, unit, x, y, w=4, h=4, desc="", thresholds=None):
    return {"id": nid(), "type": "stat", "title": title, "description": desc,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"x": x, "y": y, "w": w, "h": h},
            "fieldConfig": {"defaults": {"unit": unit, "thresholds": thresholds or {"mode": "absolute", "steps": [{"color": "green", "value": None}]}}, "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "colorMode": "value", "graphMode": "area"},
            "targets": [target(expr, title, "A")]}
def row(title, y):
    return {"id": nid(), "type": "row", "title": title, "collapsed": False, "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}, "panels": []}

P = []
y = 0
P.append(row("Service level: what clients see (router)", y)); y += 1
P.append(stat("TTFT p95", q(0.95, "disagg_first_token_emit_seconds"), "s", 0, y, desc="Time to first token, p95, as the router relays it (disagg_first_token_emit_seconds)."))
P.append(stat("TPOT p95", q(0.95, "disagg_per_token_decode_seconds"), "s", 4, y, desc="Time per output token after the first, p95 (disagg_per_token_decode_seconds)."))
P.append(stat("Goodput", f'sum(rate(disagg_slo_met_requests_total{{{SEL}}}[{RI}])) / sum(rate(disagg_slo_requests_total{{{SEL}}}[{RI}]))', "percentunit", 8, y,
              desc="Share of requests meeting both the TTFT and TPOT SLOs (spec.slo).",
              thresholds={"mode": "absolute", "steps": [{"color": "red", "value": None}, {"color": "orange", "value": 0.8}, {"color": "green", "value": 0.9}]}))
P.append(stat("Request rate", f'sum(rate(disagg_requests_total{{{SEL}}}[{RI}]))', "reqps", 12, y))
P.append(stat("Error rate", f'sum(rate(disagg_requests_total{{{SEL}, outcome=~"upstream_error|rejected"}}[{RI}])) / sum(rate(disagg_requests_total{{{SEL}}}[{RI}]))', "percentunit", 16, y,
              thresholds={"mode": "absolute", "steps": [{"color": "green", "value": None}, {"color": "red", "value": 0.01}]}))
P.append(stat("Fallback rate", f'sum(rate(disagg_fallbacks_total{{{SEL}}}[{RI}])) / sum(rate(disagg_requests_total{{{SEL}}}[{RI}]))', "percentunit", 20, y,
              thresholds={"mode": "absolute", "steps": [{"color": "green", "value": None}, {"color": "orange", "value": 0.05}]}))
y += 4
pct = [(0.5, "p50"), (0.95, "p95"), (0.99, "p99")]
P.append(ts("TTFT percentiles", [(q(v, "disagg_first_token_emit_seconds"), l) for v, l in pct], "s", 0, y,
            desc="Time to first token (router view: request received → first token relayed)."))
P.append(ts("TPOT percentiles", [(q(v, "disagg_per_token_decode_seconds"), l) for v, l in pct], "s", 8, y,
            desc="Time per output token (router view). p99 far above p50 means streaming stutters."))
P.append(ts("E2E latency percentiles (decode/aggregated workers)",
            [(q(v, "vllm:e2e_request_latency_seconds", 'role=~"decode|aggregated"'), l) for v, l in pct], "s", 16, y,
            desc="vLLM's end-to-end request latency on the worker that decodes (on the remote path it starts when the decode leg arrives)."))
y += 8
P.append(ts("TTFT / TPOT p95 by path", [(q(0.95, "disagg_first_token_emit_seconds", by="path"), "TTFT {{path}}"),
                                         (q(0.95, "disagg_per_token_decode_seconds", by="path"), "TPOT {{path}}")], "s", 0, y, w=12,
            desc="remote = prefill pool + KV transfer; local = the decode worker prefills; fallback = left its chosen path."))
P.append(ts("Goodput by tenant", [(f'sum by (tenant) (rate(disagg_slo_met_requests_total{{{SEL}}}[{RI}])) / sum by (tenant) (rate(disagg_slo_requests_total{{{SEL}}}[{RI}]))', "{{tenant}}")],
            "percentunit", 12, y, w=12))
y += 8
P.append(row("Phase breakdown (remote path)", y)); y += 1
phases = ["request_queue_wait", "prefill_compute", "kv_cache_pack", "kv_cache_transfer", "kv_cache_unpack", "decode_queue_wait"]
P.append(ts("Mean time per phase (stacked) — where TTFT goes",
            [(f'sum(rate(disagg_{p}_seconds_sum{{{SEL}, path="remote"}}[{RI}])) / sum(rate(disagg_{p}_seconds_count{{{SEL}, path="remote"}}[{RI}]))', p) for p in phases],
            "s", 0, y, w=12, stack=True,
            desc="The seed's phases on the remote path: queue wait → prefill compute → KV pack → transfer → unpack → decode queue. Prefill compute, pack, transfer and decode queue are derived from the workers' vLLM metrics (docs/observability.md)."))
P.append(ts("p95 per phase", [(q(0.95, f"disagg_{p}_seconds", 'path="remote"'), p) for p in phases] +
            [(q(0.95, "disagg_first_token_emit_seconds", 'path="remote"'), "first_token_emit (TTFT)")], "s", 12, y, w=12))
y += 8
P.append(row("Queues", y)); y += 1
P.append(ts("Queue wait p95", [(q(0.95, "disagg_request_queue_wait_seconds"), "router queue"),
                               (q(0.95, "vllm:request_queue_time_seconds", 'role="prefill"'), "prefill workers"),
                               (q(0.95, "disagg_decode_queue_wait_seconds"), "decode (router view)"),
                               (q(0.95, "vllm:request_queue_time_seconds", 'role=~"decode|aggregated"'), "decode/aggregated workers")], "s", 0, y,
            desc="Prefill queue delay is the seed's capacity signal for the prefill pool."))
P.append(ts("Waiting requests per pool", [(f'sum by (role) (vllm:num_requests_waiting{{{SEL}}})', "{{role}}")], "short", 8, y))
P.append(ts("Active sequences per pool", [(f'sum by (role) (vllm:num_requests_running{{{SEL}}})', "{{role}}")], "short", 16, y,
            desc="Decode active sequences: rising with TPOT means add decode workers or limit long outputs."))
y += 8
P.append(row("KV-cache transfer and caches", y)); y += 1
P.append(ts("KV transfer time", [(q(v, "disagg_kv_cache_transfer_seconds", 'path="remote"'), f"router {l}") for v, l in pct] +
            [(q(0.95, "vllm:nixl_xfer_time_seconds"), "NIXL xfer p95 (vLLM)"), (q(0.95, "vllm:nixl_post_time_seconds"), "NIXL post p95 (vLLM)")], "s", 0, y))
P.append(ts("KV transfer throughput and failures", [(f'sum(rate(vllm:nixl_bytes_transferred_sum{{{SEL}}}[{RI}]))', "bytes/s"),
                                                      (f'sum(rate(vllm:nixl_num_failed_transfers_total{{{SEL}}}[{RI}]))', "failed transfers/s"),
                                                      (f'sum(rate(vllm:nixl_num_failed_notifications_total{{{SEL}}}[{RI}]))', "failed notifications/s")], "short", 8, y))
P.append(ts("Prefix-cache hit rate and KV-cache usage", [(f'sum by (role) (rate(vllm:prefix_cache_hits_total{{{SEL}}}[{RI}])) / sum by (role) (rate(vllm:prefix_cache_queries_total{{{SEL}}}[{RI}]))', "hit rate {{role}}"),
                                                          (f'avg by (role) (vllm:kv_cache_usage_perc{{{SEL}}})', "KV usage {{role}}")], "percentunit", 16, y))
y += 8
P.append(row("Routing, errors and fallbacks", y)); y += 1
P.append(ts("Routing decisions", [(f'sum by (decision, reason) (rate(disagg_routing_decisions_total{{{SEL}}}[{RI}]))', "{{decision}}: {{reason}}")], "reqps", 0, y, stack=True,
            desc="reason=mode_aggregated on every request: the model serves aggregated (spec.mode or the operator's flip)."))
P.append(ts("Fallbacks by cause", [(f'sum by (cause) (rate(disagg_fallbacks_total{{{SEL}}}[{RI}]))', "{{cause}}")], "reqps", 8, y, stack=True))
P.append(ts("Requests by outcome and path", [(f'sum by (outcome, path) (rate(disagg_requests_total{{{SEL}}}[{RI}]))', "{{outcome}} {{path}}")], "reqps", 16, y, stack=True))
y += 8
P.append(row("Admission under overload (tenants' overload: Queue | Shed)", y)); y += 1
P.append(ts("Admission by tenant and outcome", [(f'sum by (tenant, outcome, reason) (rate(disagg_admission_total{{{SEL}}}[{RI}]))', "{{tenant}} {{outcome}}: {{reason}}")], "reqps", 0, y, stack=True,
            desc="Only when a tenant's overload is not Admit. shed: refused with 429 (over_slo, queue_full, queue_timeout); admitted: within_slo, over_slo (Admit), released (after a wait). An Interactive tenant shed fires DisaggInteractiveTenantShed."))
P.append(ts("Admission queue length by tenant", [(f'sum by (tenant) (disagg_admission_queue_length{{{SEL}}})', "{{tenant}}")], "short", 8, y))
P.append(ts("Admission wait p95 by tenant", [(q(0.95, "disagg_admission_wait_seconds", by="tenant"), "{{tenant}}")], "s", 16, y,
            desc="Time in the router's admission queue (counted in the TTFT)."))
y += 8
P.append(row("Pools", y)); y += 1
P.append(ts("Replicas per pool", [(f'max by (pool) (disagg_workers{{{SEL}}})', "ready ({{pool}}, router view)"),
                                  (f'count by (role) (count by (role, pod) (vllm:num_requests_running{{{SEL}}}))', "pods scraped ({{role}})")], "short", 0, y,
            desc="Ready workers the router routes to, and worker pods Prometheus scrapes, per pool."))
P.append(ts("In-flight requests per pool (router)", [(f'sum by (pool) (disagg_inflight_requests{{{SEL}}})', "{{pool}}")], "short", 8, y))
P.append(ts("Preemptions (decode interference)", [(f'sum by (role) (rate(vllm:num_preemptions_total{{{SEL}}}[{RI}]))', "{{role}}")], "short", 16, y))

dash = {
    "uid": "disagg-overview", "title": "disagg: prefill/decode disaggregation",
    "description": "TTFT/TPOT/E2E percentiles, the phase breakdown, queue waits, KV transfer, errors and fallbacks, and replicas per pool on one dashboard (docs/observability.md).",
    "tags": ["disagg", "vllm", "llm"], "timezone": "browser", "schemaVersion": 39, "version": 1, "editable": True,
    "refresh": "30s", "time": {"from": "now-3h", "to": "now"}, "graphTooltip": 1,
    "templating": {"list": [
        {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source", "current": {}, "hide": 0},
        {"name": "namespace", "type": "query", "label": "Namespace", "datasource": {"type": "prometheus", "uid": "${datasource}"},
         "query": {"query": "label_values(disagg_requests_total, namespace)", "refId": "namespace"},
         "definition": "label_values(disagg_requests_total, namespace)", "refresh": 2, "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "hide": 0, "sort": 1},
        {"name": "model", "type": "query", "label": "Model", "datasource": {"type": "prometheus", "uid": "${datasource}"},
         "query": {"query": 'label_values(disagg_requests_total{namespace=~"$namespace"}, model)', "refId": "model"},
         "definition": 'label_values(disagg_requests_total{namespace=~"$namespace"}, model)', "refresh": 2, "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "hide": 0, "sort": 1},
    ]},
    "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
                              "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"}]},
    "panels": P,
}


def main() -> None:
    print(json.dumps(dash, indent=2))


if __name__ == "__main__":
    main()
