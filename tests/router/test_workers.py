"""`disagg router --workers N`: N processes on one port (SO_REUSEPORT), /metrics summed over them, SIGTERM stops
every worker; routing quality per worker (own load view) stays sane; the probe rate is split between workers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from disagg.api.contract import RouterConfig
from disagg.cli import build_parser
from disagg.local.procs import Processes
from disagg.poll import until
from disagg.router.core import RequestCore
from disagg.router.load import Worker, WorkerSet
from disagg.router.metrics import RouterMetrics
from disagg.router.policy import decide
from disagg.router.policy_types import LoadSnapshot, RequestFeatures, Tuning
from disagg.router.prefork import child_argv
from disagg.router.probe import ProbeLimiter

from .conftest import metric_value

LONG = "The quick brown fox jumps over the lazy dog. " * 400
DISAGG = str(Path(sys.executable).with_name("disagg"))


def _log_lines(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z"))


async def test_workers_share_the_port_sum_metrics_and_stop_on_sigterm(tmp_path, fake_workers):
    p, d = await fake_workers("prefill"), await fake_workers("decode", tokens=3, token_delay=0.01)
    with Processes(tmp_path / "procs") as procs:  # on a failure its exit stops the whole group, workers too
        # every request on p is a prefill leg (counted below): no whole requests on the prefill worker
        router = procs.router(prefill=[p.url], decode=[d.url],
                              extra=["--workers", "2", "--scrape-interval", "0.2", "--log-level", "INFO",
                                     "--elastic-idle-seconds", "0"])
        proc, url, log_path = router.proc, router.url, router.log_path

        def listening() -> set[int]:
            assert proc.poll() is None, log_path.read_text()  # exited: fail at once
            return {x["pid"] for x in _log_lines(log_path) if x.get("event") == "router_listening"}

        try:
            await until(lambda: len(listening()) >= 2, 30, "both workers listening")
            pids = listening()
            t_listening = time.monotonic()
            started = next(x for x in _log_lines(log_path) if x.get("event") == "router_workers_started")
            metrics_dir = Path(started["metrics_dir"])
            assert set(started["pids"]) == pids and metrics_dir.is_dir()

            # a fresh connection per request: the kernel spreads them over the workers
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
                async def decode_pool_scraped() -> bool:
                    async with s.get(url + "/metrics") as r:
                        return metric_value(await r.text(), "disagg_workers", pool="decode") == 1

                await until(decode_pool_scraped, 30, "every worker scraped its view of the pools")

                async def one(prompt: str) -> bytes:
                    async with s.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 200,
                                                                      "stream": True}) as r:
                        assert r.status == 200
                        return await r.read()

                bodies = await asyncio.gather(*(one(LONG if i % 2 else "hi") for i in range(30)))
                assert all(b.endswith(b"data: [DONE]\n\n") for b in bodies)

                # a request is accounted just after its last chunk is sent (requests_total last): wait for all 30
                async def all_accounted() -> bool:
                    async with s.get(url + "/metrics") as r:
                        return metric_value(await r.text(), "disagg_requests_total", outcome="ok") == 30

                await until(all_accounted, 10, "the 30 requests accounted")
                for _ in range(4):  # whichever worker answers, /metrics is the replica's total
                    async with s.get(url + "/metrics") as r:
                        text = await r.text()
                    assert metric_value(text, "disagg_requests_total", outcome="ok") == 30
                    assert metric_value(text, "disagg_routing_decisions_total") == 30
                    assert metric_value(text, "disagg_routing_decisions_total", reason="short_prompt") == 15
                    remote = metric_value(text, "disagg_routing_decisions_total", decision="remote")
                    # a burst of long prompts: the rest is held local by the prefill-queue estimate, or by the SLO
                    # placement where it predicts fewer misses there
                    assert remote + sum(metric_value(text, "disagg_routing_decisions_total", reason=r)
                                        for r in ("prefill_queue_overload", "slo_local")) == 15
                    assert metric_value(text, "disagg_first_token_emit_seconds_count") == 30
                    assert metric_value(text, "disagg_inflight_requests") == 0  # live sum
                    assert metric_value(text, "disagg_workers", pool="decode") == 1  # max, not the sum
                    assert "pid=" not in text
            assert len(p.requests) == remote
            assert all(_alive(pid) for pid in pids)

            # a worker that dies after its start window is restarted; the replica's counters stay monotonic
            from disagg.router.prefork import STARTUP_SECONDS

            while time.monotonic() - t_listening < STARTUP_SECONDS + 0.5:  # the documented window, not a sync
                await asyncio.sleep(0.1)
            victim = min(pids)
            os.kill(victim, signal.SIGKILL)
            restarted = await until(lambda: listening() - pids, 30, "the restarted worker listening")
            exited = [x for x in _log_lines(log_path) if x.get("event") == "router_worker_exited"]
            assert [(x["pid"], x["restart"]) for x in exited] == [(victim, True)]
            pids = (pids - {victim}) | restarted
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
                assert (await one_more(s, url)).endswith(b"data: [DONE]\n\n")

                async def counted_once_more() -> bool:  # monotonic across the restart: 30 before it, this one after
                    async with s.get(url + "/metrics") as r:
                        n = metric_value(await r.text(), "disagg_requests_total", outcome="ok")
                    assert n in (30, 31), n
                    return n == 31

                await until(counted_once_more, 10, "the 31st request accounted")
        finally:
            proc.send_signal(signal.SIGTERM)  # the parent alone (not its group): it stops its workers
            rc = proc.wait(timeout=40)  # still running after that: the harness's exit kills the group
        assert rc == 0, log_path.read_text()
        assert not any(_alive(pid) for pid in pids)  # checked before the harness's exit signals the group
        lines = _log_lines(log_path)
        assert sum(1 for x in lines if x.get("event") == "router_stopping") == 2
        assert sum(1 for x in lines if x.get("event") == "request") == 31
        assert not metrics_dir.exists()


async def one_more(s: aiohttp.ClientSession, url: str) -> bytes:
    async with s.post(url + "/v1/completions", json={"prompt": "hi", "stream": True}) as r:
        assert r.status == 200
        return await r.read()


def test_a_worker_that_cannot_start_stops_the_parent(tmp_path, free_port):
    """A bad config fails every worker at start: the parent stops the others and exits 1 (no restart loop)."""
    conf = tmp_path / "router.yaml"
    conf.write_text("mode: [not, a, mode")
    r = subprocess.run([DISAGG, "router", "--port", str(free_port()), "--decode", "http://127.0.0.1:9",
                        "--config", str(conf), "--workers", "2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "router_worker_exited" in r.stderr


def test_child_argv_round_trips_the_flags():
    parser = build_parser()
    argv = ["router", "--port", "9000", "--decode", "http://a:1", "http://b:2#h", "--prefill", "http://c:3",
            "--client-write-timeout", "5.5", "--workers", "3", "--log-level", "WARNING"]
    args = parser.parse_args(argv)
    child = child_argv(args.router_parser, args, 2)
    assert child[:4] == [sys.executable, "-m", "disagg.cli", "router"]
    again = parser.parse_args(child[3:])
    skip = {"func", "router_parser", "worker_index"}
    assert {k: v for k, v in vars(again).items() if k not in skip} == \
        {k: v for k, v in vars(args).items() if k not in skip}
    assert again.worker_index == 2 and args.worker_index is None


def test_probe_rate_is_split_between_workers():
    whole, half = ProbeLimiter(), ProbeLimiter(rate_scale=0.5)
    got = {id(whole): 0, id(half): 0}
    for t in range(0, 600):  # 10 minutes, one eligible request per second, 6 probes/min configured
        for lim in (whole, half):
            got[id(lim)] += lim.admit(6.0, 1.0, float(t))
    assert got[id(whole)] == 60
    assert got[id(half)] == 30  # two workers together keep to the configured rate


def test_prefill_queue_estimates_per_worker_stay_sane():
    """N workers, each with its own backlog clock on a shared prefill worker. Within one scrape interval each
    sees only its own legs, so a burst into an idle prefill worker gets at most one leg per router worker before
    the overload rule applies (N - 1 more than one process: bounded by N, not by the burst). Once a scrape shows
    the queue, every worker's estimate covers it and all decide as a single process would."""
    cfg = RouterConfig.model_validate({"routing": {"remotePrefill": {"minInputTokens": 100,
                                                                        "maxPrefillQueueWaitMs": 300},
                                                    "localPrefill": {"maxInputTokens": 50}}})
    tokens, spt, now = 4000, 0.0001, time.monotonic()  # each leg = 0.4 s of prefill > the 0.3 s bound

    def route(w: Worker) -> str:
        d = Worker("http://d", "decode")
        snap = LoadSnapshot(prefill=(w.load(),), decode=(d.load(),), aggregated=())
        f = RequestFeatures(request_id="r", endpoint="/v1/completions", input_tokens=tokens, max_tokens=500,
                            tenant=None, canary_fraction=0.0)
        dec = decide(cfg, f, snap, Tuning())
        if dec.decision == "remote":
            w.inflight += 1
            w.inflight_tokens += tokens
            w.prefill_started(tokens, now)
        return dec.reason

    def view() -> Worker:
        w = Worker("http://p", "prefill")
        w.observed_sec_per_token = spt
        return w

    for n in (1, 2, 4):
        views = [view() for _ in range(n)]
        burst = [route(views[i % n]) for i in range(4 * n)]
        assert burst.count("policy") == n  # one leg per worker process
        assert all(r == "prefill_queue_overload" for r in burst if r != "policy")
        # the prefill worker's own queue, as the next scrape shows it: n legs, n - 1 waiting
        for v in views:
            v.scraped = {"vllm:num_requests_waiting": float(n - 1), "vllm:num_requests_running": 1.0}
            v.avg_prompt_tokens = float(tokens)
            true_wait = (n - 1) * tokens * spt
            own = v.est_prefill_wait_s(now)
            assert own >= true_wait - 1e-9  # covers the queue the others built
            assert own <= n * tokens * spt + 1e-9  # and never more than all legs together
            assert route(v) == "prefill_queue_overload"


def test_a_workers_load_fills_every_field_of_the_policys_view() -> None:
    """Worker.load builds its WorkerLoad positionally (the hot path): each field is the one its name says, checked
    against the keyword form on a worker whose every figure differs."""
    from disagg.perf.costs import EngineCost
    from disagg.router.load import WAITING_FOR_CAPACITY, Worker
    from disagg.router.policy_types import WorkerLoad

    cost = EngineCost.from_profile(None)
    w = Worker(url="http://p7", role="prefill", compat="c9", inflight=3, inflight_tokens=1234, cost=cost,
               avg_prompt_tokens=321.0, f_prefill=1.25, f_decode=0.75)
    w.update_scrape({"vllm:num_requests_running": 5.0, "vllm:num_requests_waiting": 6.0,
                     "vllm:kv_cache_usage_perc": 0.42, WAITING_FOR_CAPACITY: 2.0})
    w.prefill_started(900, now=10.0)
    w.prefill_started(300, now=10.5)  # sizes 900 then 300: mean 720, mean square 594 000 (α 0.3)
    w.remote_prefill_at = 8.5
    for k in range(30):  # streams ended there: their TPOT's centre and spread
        w.observe_stream(0.030 + 0.001 * (k % 7))
    centre, spread = w.stream_tpot
    got = w.load(77, now=11.0)
    want = WorkerLoad(url="http://p7", compat="c9", inflight=3, est_wait_ms=w.est_prefill_wait_s(11.0) * 1000.0,
                      running=5.0, waiting=6.0, kv_usage=0.42, prefix_tokens=77, role="prefill", queued=2.0,
                      ahead_tokens=1234, prefill_rate=w.prefill_rate(11.0), cost=cost, f_prefill=1.25,
                      f_decode=0.75, avg_prompt_tokens=321.0, remote_idle_s=2.5, stream_tpot_s=centre,
                      stream_spread=spread, prefill_residual_tokens=594_000 / 1440, prefill_size_tokens=720.0)
    assert got._asdict() == want._asdict()
    assert len(set(map(repr, got))) == len(got)  # every figure differs: a swapped pair cannot pass unseen


def test_a_new_workers_prefill_rate_is_read_over_the_time_it_was_watched():
    """A steady 10,000 prompt tokens/s sent to a worker that joined 2.5 s ago reads as that rate (an average started
    at zero would read 39 % of it), one prefill at the moment of joining is read over one second, a worker watched
    for a minute reads the plain average, and the WorkerSet starts the watch on its own clock."""
    import math

    from disagg.router.load import PREFILL_RATE_WINDOW_S, WorkerSet

    def fed(since: float) -> Worker:
        w = Worker(url="http://d0", role="decode", since=since)
        for k in range(25):  # 1,000 tokens every 0.1 s from t = 100
            w.prefill_started(1000, now=100.0 + 0.1 * k)
        return w

    assert fed(100.0).prefill_rate(102.5) == pytest.approx(10_000, rel=0.03)
    unwatched = fed(-math.inf).prefill_rate(102.5)  # no start known: the plain average
    assert unwatched == pytest.approx(10_000 * (1 - math.exp(-2.5 / PREFILL_RATE_WINDOW_S)), rel=0.03)
    one = Worker(url="http://d1", role="decode", since=0.0)
    one.prefill_started(500, now=0.0)
    assert one.prefill_rate(0.0) == pytest.approx(500 / PREFILL_RATE_WINDOW_S / -math.expm1(-1 / PREFILL_RATE_WINDOW_S))
    old = fed(40.0)
    assert old.prefill_rate(102.5) == pytest.approx(unwatched)
    ws = WorkerSet(clock=lambda: 42.0)
    ws.set_pool("decode", [("http://d2", "c")])
    assert ws.pools["decode"]["http://d2"].since == 42.0


def test_a_worker_that_leaves_every_pool_takes_its_prefix_estimate_with_it() -> None:
    ws = WorkerSet(clock=lambda: 0.0)
    ws.set_pool("prefill", [("p0", "h"), ("p1", "h")])
    ws.set_pool("decode", [("d0", "h")])
    core: RequestCore[None] = RequestCore(ws, RouterMetrics(), Tuning(), clock=lambda: 0.0)
    hashes = (1, 2, 3)
    for url in ("p0", "p1", "d0"):
        core.prefix.insert(url, hashes)
    ws.set_pool("prefill", [("p0", "h")])  # p1's pod went away
    assert core.prefix.match_tokens("p1", hashes) == 0  # a later pod at its address starts with an empty cache
    assert core.prefix.match_tokens("p0", hashes) == 3 * core.prefix.block_tokens
    ws.set_pool("prefill", [("p0", "h"), ("p1", "h")])
    assert core.prefix.match_tokens("p1", hashes) == 0
