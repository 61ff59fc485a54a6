"""`disagg router` as a process: flags, config reload without dropping requests, JSON log lines."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import yaml

from disagg.local.procs import Proc, Processes
from disagg.plan.reqlog import read_lines
from disagg.poll import until

LONG = "The quick brown fox jumps over the lazy dog. " * 400
DISAGG = str(Path(sys.executable).with_name("disagg"))


async def wait_health(session: aiohttp.ClientSession, router: Proc, timeout: float = 20) -> dict:
    async def health() -> dict | None:
        assert router.alive(), f"router exited with {router.proc.returncode}:\n{router.log_tail()}"  # fail at once
        async with session.get(router.url + "/health", timeout=aiohttp.ClientTimeout(total=1)) as r:
            return await r.json() if r.status == 200 else None

    return await until(health, timeout, f"{router.url}/health", retry_on=(aiohttp.ClientError,))


async def test_router_process_config_reload(tmp_path, fake_workers):
    p, d = await fake_workers("prefill"), await fake_workers("decode", tokens=3, token_delay=0.05)
    conf = tmp_path / "router.yaml"
    conf.write_text(yaml.safe_dump({"model": "", "mode": "Auto",
                                    "routing": {"remotePrefill": {"minInputTokens": 2048}}}))
    with Processes(tmp_path / "procs") as procs:
        router = procs.router(conf, prefill=[p.url + "#h1"], decode=[d.url + "#h1"],
                              extra=["--config-poll-seconds", "0.1", "--log-level", "INFO"])
        url = router.url
        async with aiohttp.ClientSession() as s:
            h = await wait_health(s, router)
            assert h["workers"] == {"prefill": 1, "decode": 1, "aggregated": 0}
            body = {"prompt": LONG, "max_tokens": 200, "stream": True}

            async def one() -> int:
                async with s.post(url + "/v1/completions", json=body) as r:
                    data = await r.read()
                    assert data.endswith(b"data: [DONE]\n\n")
                    return r.status

            # requests in flight while the config flips to Aggregated: none is dropped
            n0 = len(d.requests)
            first = asyncio.gather(*(one() for _ in range(4)))
            # in flight = all four are streaming from the decode worker (3 tokens, 50 ms apart)
            await until(lambda: len(d.requests) >= n0 + 4, 10, "the four streams at the decode worker")
            conf.write_text(yaml.safe_dump({"mode": "Aggregated"}))
            async def aggregated() -> bool:
                return (await wait_health(s, router))["mode"] == "Aggregated"

            await until(aggregated, 10, "the config reloaded to Aggregated")
            assert await first == [200] * 4
            n_prefill = len(p.requests)
            assert await one() == 200
            assert len(p.requests) == n_prefill  # aggregated: no remote prefill

            # a broken file keeps the last good config
            conf.write_text("mode: [not, a, mode")
            async def reload_failed() -> bool:
                async with s.get(url + "/metrics") as r:
                    return 'disagg_config_reloads_total{result="error"} 1.0' in await r.text()

            await until(reload_failed, 10, "the broken config counted as a reload error")
            assert (await wait_health(s, router))["mode"] == "Aggregated"
        procs.stop(router)  # SIGTERM: a clean shutdown (exit 0 below)
    log = router.log_path.read_text()
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    reqs = [x for x in lines if x.get("event") == "request"]
    assert len(reqs) == 5
    for x in reqs:
        assert {"request_id", "tenant", "decision", "reason", "prefill_worker", "decode_worker", "timings_ms",
                "outcome", "path"} <= x.keys()
        assert x["outcome"] == "ok"
    assert reqs[-1]["reason"] == "mode_aggregated"
    # the log is replay's input (log_schema 2): arrival, the client's max_tokens, and the prefix family once a
    # worker holds this prompt's prefix (the same LONG prompt five times)
    assert all(x["log_schema"] == 2 and x["max_tokens"] == 200 for x in reqs)
    by_arrival = sorted(reqs, key=lambda x: x["arrival_unix"])  # lines are written at the finish
    assert by_arrival[0]["arrival_unix"] > 1.7e9 and by_arrival[-1] is reqs[-1]
    assert by_arrival[0]["prefix_tokens"] == 0 and by_arrival[0]["prefix_hash"] is None
    assert reqs[-1]["prefix_tokens"] > 0 and len(reqs[-1]["prefix_hash"]) == 16
    parsed = read_lines(log.splitlines(), "router.log")
    assert [r.schema for r in parsed.requests] == [2] * 5 and parsed.requests[-1].max_tokens == 200
    assert parsed.requests[-1].prefix_hash == reqs[-1]["prefix_hash"]
    assert any(x["decision"] == "remote" and x["prefill_worker"] == p.url for x in reqs)
    assert any(x.get("event") == "config_reloaded" for x in lines)
    assert router.proc.returncode == 0, log[-3000:]


def test_router_needs_workers_or_namespace():
    env = {k: v for k, v in os.environ.items() if k != "POD_NAMESPACE"}
    r = subprocess.run([DISAGG, "router", "--port", "0"], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 2 and "--prefill" in r.stderr



def test_hedge_flags_refuse_negative_and_non_finite_values(capsys) -> None:
    """--hedge-factor / --hedge-min-ms: argparse refuses a bad value naming the flag; 0 turns hedging off."""
    import argparse

    import pytest

    from disagg.router.cli import add_parser

    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    for flag, bad in (("--hedge-factor", "-1"), ("--hedge-factor", "inf"), ("--hedge-min-ms", "nan"),
                      ("--hedge-min-ms", "soon")):
        with pytest.raises(SystemExit):
            p.parse_args(["router", flag, bad])
        assert f"argument {flag}:" in capsys.readouterr().err
    args = p.parse_args(["router", "--hedge-factor", "0", "--hedge-min-ms", "100"])
    assert (args.hedge_factor, args.hedge_min_ms) == (0.0, 100.0)
