"""The twin against the real thing on the fault paths: one request core, so the same faults give the same story.

Each scenario sends the same requests through real `disagg sim` processes and a real `disagg router` (loopback,
disagg.local.procs) and through the twin, with the same fault injected (the sim's fault table: a flag or
``POST /sim/faults`` on the real side, ``extra_args`` or ``TwinCluster.set_faults`` in the twin). Requests are spaced
so that each ends before the next starts: what a request meets then depends on the faults and the router's state
(breakers, passive health, the last scrape), not on races. Asserted per request id: the decision and its reason,
the path, the (first) fallback cause and the status — the real router's from its JSON request log, the twin's from
its records. Scenarios: a stalled KV transfer (kv_transfer_timeout until the circuit breakers open), a failed KV
pull under ``kv_load_failure_policy: fail`` (kv_load_failed), a prefill worker that crashes (prefill_error, then it
is down), and a decode worker that answers 500 (decode_error; the one local retry elsewhere).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg.load import loadgen
from disagg.load.workload import Request
from disagg.local.harness import router_workers_at
from disagg.local.procs import SIM_MODEL, Processes
from disagg.poll import wait_for
from disagg.twin import ClusterSpec, PoolSpec, arrivals_from_requests, simulate
from disagg.twin.cluster import TwinCluster

TIME_SCALE = 1.0
SCRAPE_S = 0.25
GAP_S = 1.5  # between arrivals: every request (≤ 1.2 s, a KV stall included) ends before the next one starts
ROUTING: dict[str, Any] = {
    "remotePrefill": {"minInputTokens": 2048, "maxPrefillQueueWaitMs": 5000, "minExpectedOutputTokens": 16,
                      "requireDecodePoolPressure": False},
    "localPrefill": {"maxInputTokens": 1024, "preferWhenPrefixCacheHit": False},
    # no half-open trial inside a scenario: the breaker's story does not hang on a cooldown boundary
    "circuitBreaker": {"failureThreshold": 3, "cooldownSeconds": 600, "halfOpenProbes": 1},
}


def requests(n: int, long_every: int = 1) -> list[Request]:
    """``n`` spaced requests; every ``long_every``-th has a long prompt (remote), the others a short one (local).
    Prompts differ, so no prefix is shared."""
    out = []
    for i in range(n):
        long = i % long_every == 0
        words = 2600 if long else 200
        text = " ".join(f"w{i}x{j}" for j in range(words))
        body = {"model": SIM_MODEL, "max_tokens": 24, "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True}, "messages": [{"role": "user", "content": text}]}
        out.append(Request(f"fault-{i:03d}", 0.2 + i * GAP_S, "long" if long else "short", "default",
                           words, 24, True, body, "/v1/chat/completions"))
    return out


@dataclass
class Scenario:
    name: str
    requests: list[Request]
    prefill_extra: tuple[str, ...] = ()
    decode_extra: tuple[str, ...] = ()
    kv_load_failure_policy: str = "recompute"
    first_decode_faults: dict[str, Any] = field(default_factory=dict)  # on the decode worker that sorts first
    transfer_timeout_ms: int = 30_000
    expect: set[str] = field(default_factory=set)  # fallback causes the scenario must exercise


SCENARIOS = [
    Scenario("kv-stall", requests(7), decode_extra=("--fault-kv-transfer-delay-ms", "1200"),
             transfer_timeout_ms=700, expect={"kv_transfer_timeout"}),
    Scenario("kv-load-failed", requests(4), decode_extra=("--fault-kv-transfer-fail-rate", "1"),
             kv_load_failure_policy="fail", expect={"kv_load_failed"}),
    Scenario("prefill-crash", requests(5), prefill_extra=("--fault-crash-after-requests", "2"),
             expect={"prefill_error"}),
    Scenario("decode-error", requests(6, long_every=2), first_decode_faults={"error_rate": 1.0},
             expect={"decode_error"}),
]


def router_lines(log: Path) -> dict[str, tuple[Any, ...]]:
    out = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("event") == "request":
            out[rec["request_id"]] = (f"{rec['decision']}:{rec['reason']}", rec["path"], rec["fallback"],
                                      rec["status"])
    return out


def run_real(sc: Scenario, cfg: dict[str, Any], tmp: Path) -> dict[str, tuple[Any, ...]]:
    with Processes(tmp / "logs") as procs:
        p = procs.sim("prefill", time_scale=TIME_SCALE, extra=sc.prefill_extra,
                      kv_load_failure_policy=sc.kv_load_failure_policy)
        ds = [procs.sim("decode", time_scale=TIME_SCALE, extra=sc.decode_extra,
                        kv_load_failure_policy=sc.kv_load_failure_policy) for _ in range(2)]
        for w in (p, *ds):
            procs.wait_ready(w)
        if sc.first_decode_faults:
            import urllib.request

            first = min(ds, key=lambda d: d.url)  # the router breaks load ties by URL, the twin by name
            req = urllib.request.Request(first.url + "/sim/faults", data=json.dumps(sc.first_decode_faults).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.status == 200
        conf = tmp / "router.yaml"
        conf.write_text(yaml.safe_dump(cfg))
        router = procs.router(conf, extra=["--scrape-interval", str(SCRAPE_S), "--log-level", "INFO"], prefill=[p.url],
                              decode=[d.url for d in ds])
        procs.wait_ready(router)
        wait_for(lambda: router_workers_at(router.url).get("decode") == 2
                 and router_workers_at(router.url).get("prefill") == 1, 30, "the router to scrape its workers",
                 interval=0.05)
        asyncio.run(loadgen.run(router.url, sc.requests, time_scale=TIME_SCALE, timeout_s=120))
        log = router.log_path

        def complete() -> dict[str, tuple[Any, ...]] | None:
            lines = router_lines(log)
            return lines if len(lines) == len(sc.requests) else None

        return wait_for(complete, 30, "the router's request log lines")


def run_twin(sc: Scenario, cfg: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    controller: Callable[[TwinCluster], Coroutine[Any, Any, None]] | None = None
    if sc.first_decode_faults:
        async def controller(cluster: TwinCluster) -> None:
            cluster.set_faults(min(w.url for w in cluster.pool("decode")), sc.first_decode_faults)

    twin = simulate(ClusterSpec(prefill=PoolSpec(1, extra_args=sc.prefill_extra),
                                decode=PoolSpec(2, extra_args=sc.decode_extra), router=cfg,
                                scrape_interval_s=SCRAPE_S / TIME_SCALE,
                                kv_load_failure_policy=sc.kv_load_failure_policy),
                    arrivals_from_requests(sc.requests), seed=3, controller=controller)
    return {r.request_id: (f"{r.decision}:{r.reason}", r.path, r.fallback, r.status) for r in twin.records}


@pytest.mark.parametrize("sc", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_twin_and_router_tell_the_same_story_under_faults(sc: Scenario, tmp_path: Path) -> None:
    cfg = {"model": SIM_MODEL, "mode": "Disaggregated", "transferTimeoutMs": sc.transfer_timeout_ms,
           "routing": ROUTING}
    real = run_real(sc, cfg, tmp_path)
    twin = run_twin(sc, cfg)
    table = "\n".join(f"{rid}: real {real.get(rid)} twin {twin.get(rid)}" for rid in sorted(real.keys() | twin.keys()))
    print(table)
    assert real == twin, table
    causes = {v[2] for v in twin.values()}
    assert sc.expect <= causes, table
