"""Faults on the KV path against real processes: `disagg sim` workers with kv_load_failure_policy "fail" (vLLM's
default) and `disagg router` processes, one router per test (its breakers and probe bucket start fresh).

* a failed KV pull shows up *inside* a 200 stream (vLLM 0.33.0: role chunk, then ``data: {"error": ...}``): before
  the first token that is a failure of the remote leg → fallback ``kv_load_failed``, the client sees a clean stream;
* circuit breakers: after K stalled KV hand-offs per decode worker the router stops trying the remote path and
  serves locally at once (reason ``circuit_open``), then half-opens after the cooldown and closes on success;
* mode probes while the operator holds the model Aggregated.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import aiohttp
import pytest
import yaml

from disagg.local.procs import Proc
from disagg.poll import until

from .conftest import start_router, start_sim
from .test_e2e_sim import MODEL, long_prompt


@pytest.fixture(scope="module")
def sims(processes):
    p = start_sim(processes, "prefill")
    d1 = start_sim(processes, "decode", kv_load_failure_policy="fail")
    d2 = start_sim(processes, "decode", kv_load_failure_policy="fail")
    return {"prefill": p, "decode": [d1, d2], "processes": processes}


class Router:
    def __init__(self, proc: Proc, session: aiohttp.ClientSession) -> None:
        self.proc = proc
        self.url = proc.url
        self.s = session

    async def complete(self, body: dict[str, Any], path: str = "/v1/completions") -> tuple[int, bytes, dict, str]:
        rid = uuid.uuid4().hex
        async with self.s.post(self.url + path, json={"model": MODEL, **body}, headers={"X-Request-Id": rid}) as r:
            return r.status, await r.read(), dict(r.headers), rid

    async def metrics(self) -> str:
        async with self.s.get(self.url + "/metrics") as r:
            return await r.text()

    def log_lines(self, event: str) -> list[dict[str, Any]]:
        out = []
        for line in self.proc.log_path.read_text(errors="replace").splitlines():  # the whole log, not its tail
            if f'"{event}"' in line:
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if obj.get("event") == event:
                    out.append(obj)
        return out

    async def request_log(self, rid: str) -> dict[str, Any]:
        """The router's JSON log line for one request (written as the request finishes: poll with a deadline)."""
        found = await until(lambda: [x for x in self.log_lines("request") if x.get("request_id") == rid], 10,
                            f"the log line for request {rid}")
        return found[0]


@pytest.fixture
async def router(sims, tmp_path):
    """make(config) → a fresh `disagg router` on the module's sims; faults are cleared afterwards."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:

        async def make(**cfg: Any) -> Router:
            conf = tmp_path / f"router-{uuid.uuid4().hex[:6]}.yaml"
            conf.write_text(yaml.safe_dump({"model": MODEL, "mode": "Auto", **cfg}))
            proc = start_router(sims["processes"], [sims["prefill"].url], [d.url for d in sims["decode"]], conf)
            return Router(proc, s)

        async def faults(sim: Any, **f: Any) -> None:
            async with s.post(sim.url + "/sim/faults", json=f) as r:
                assert r.status == 200, await r.text()

        make.faults = faults  # type: ignore[attr-defined]
        yield make
        for sim in [sims["prefill"], *sims["decode"]]:
            await faults(sim, kv_transfer_fail_rate=0.0, kv_transfer_delay_ms=0.0)


async def computed(sim: Any, s: aiohttp.ClientSession) -> float:
    async with s.get(sim.url + "/sim/state") as r:
        return float((await r.json(content_type=None))["computed_prompt_tokens"])


def events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e]


@pytest.mark.parametrize("path,stream", [("/v1/chat/completions", True), ("/v1/completions", True),
                                         ("/v1/chat/completions", False)])
async def test_kv_load_failure_falls_back_before_the_first_token(router, sims, metric, path, stream):
    r = await router(transferTimeoutMs=10000, routing={"circuitBreaker": {"failureThreshold": 100}})
    for d in sims["decode"]:
        await router.faults(d, kv_transfer_fail_rate=1.0)
    chat = path.endswith("chat/completions")
    prompt = long_prompt(words=2500)
    body: dict[str, Any] = {"max_tokens": 128, "stream": stream}
    body |= {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
    status, raw, headers, rid = await r.complete(body, path)
    assert status == 200, raw
    assert (headers["X-Disagg-Decision"], headers["X-Disagg-Path"]) == ("remote", "fallback"), headers
    line = await r.request_log(rid)
    assert (line["path"], line["fallback"], line["outcome"]) == ("fallback", "kv_load_failed", "ok")
    assert b'"error"' not in raw  # nothing of the failed leg reached the client
    if stream:
        evs = events(raw)
        assert evs[-1] == b"data: [DONE]"
        if chat:
            assert raw.count(b'"role":"assistant"') == 1  # the failed leg's held role chunk was never relayed
        text = "".join((c["choices"][0].get("delta", {}).get("content") or c["choices"][0].get("text") or "")
                       for c in (json.loads(e[6:]) for e in evs[:-1]) if c["choices"])
        assert text
    else:
        assert json.loads(raw)["usage"]["completion_tokens"] == 128
    m = await r.metrics()
    assert metric(m, "disagg_fallbacks_total", cause="kv_load_failed") == 1
    assert metric(m, "disagg_requests_total", outcome="ok", path="fallback") == 1


async def test_breaker_opens_after_k_stalls_then_requests_go_local_at_once_and_it_recloses(router, sims, metric):
    timeout_ms, k, cooldown = 1000, 2, 10.0
    r = await router(transferTimeoutMs=timeout_ms,
                     routing={"circuitBreaker": {"failureThreshold": k, "cooldownSeconds": cooldown}})
    for d in sims["decode"]:
        await router.faults(d, kv_transfer_delay_ms=60_000)  # 3 wall s at time-scale 0.05 > transferTimeoutMs
    body = {"prompt": long_prompt(words=2500), "max_tokens": 128, "stream": True}

    # K stalled hand-offs per decode worker (2 workers), each waiting the transfer timeout, then no more
    timeouts = 0
    for _ in range(2 * k + 1):
        status, raw, headers, rid = await r.complete({**body, "prompt": long_prompt(words=2500)})
        assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
        if headers["X-Disagg-Reason"] == "circuit_open":
            break
        assert (await r.request_log(rid))["fallback"] == "kv_transfer_timeout"
        timeouts += 1
    assert timeouts == 2 * k
    m = await r.metrics()
    for d in sims["decode"]:
        assert metric(m, "disagg_circuit_state", pool="decode", worker=d.url) == 1
        assert metric(m, "disagg_circuit_state", pool="pair", worker=f"{sims['prefill'].url}->{d.url}") == 1
    opened = [x for x in r.log_lines("circuit") if x["to"] == "open"]
    assert {x["pool"] for x in opened} == {"decode", "pair"} and len(opened) == 4
    assert all(x["from"] == "closed" and x["cause"] == "kv_transfer_timeout" for x in opened)

    # while open: local prefill at once — never a prefill leg, never a wait for the KV hand-off
    p0 = await computed(sims["prefill"], r.s)
    for _ in range(3):
        status, raw, headers, rid = await r.complete({**body, "prompt": long_prompt(words=2500)})
        assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
        assert (headers["X-Disagg-Decision"], headers["X-Disagg-Reason"]) == ("local", "circuit_open")
        line = await r.request_log(rid)
        assert line["path"] == "local" and line["fallback"] is None and line["prefill_worker"] is None
        assert "prefill_leg" not in line["timings_ms"]
        assert line["timings_ms"]["e2e"] < timeout_ms  # served, not timed out
    assert await computed(sims["prefill"], r.s) == p0
    assert metric(await r.metrics(), "disagg_fallbacks_total", cause="kv_transfer_timeout") == 2 * k

    # heal; after the cooldown a half-open trial goes remote, succeeds, and closes the breaker
    for d in sims["decode"]:
        await router.faults(d, kv_transfer_delay_ms=0.0)
    async def half_open_trial() -> str | None:
        """The request id of a request served remote (the half-open trial); None while the breaker is open."""
        status, _, headers, rid = await r.complete({**body, "prompt": long_prompt(words=2500)})
        assert status == 200
        if headers["X-Disagg-Decision"] == "remote":
            return rid
        assert headers["X-Disagg-Reason"] == "circuit_open"
        return None

    rid = await until(half_open_trial, cooldown + 20, "the breaker half-opened", interval=0.2)
    line = await r.request_log(rid)
    assert (line["path"], line["fallback"], line["outcome"]) == ("remote", None, "ok")
    moves = {(x["pool"], x["target"], x["from"], x["to"]) for x in r.log_lines("circuit")}
    d = line["decode_worker"]
    assert ("decode", d, "open", "half-open") in moves and ("decode", d, "half-open", "closed") in moves
    assert metric(await r.metrics(), "disagg_circuit_state", pool="decode", worker=d) == 0


async def test_mode_probes_while_held_aggregated(router, sims, metric):
    held = {"activeMode": "Aggregated", "probe": {"ratePerMinute": 1, "maxShare": 1.0}}
    body = {"max_tokens": 128}
    # a healthy path: the first eligible request is a probe, served remote; the bucket then keeps the next local
    r = await router(**held)
    p0 = await computed(sims["prefill"], r.s)
    status, _, headers, rid = await r.complete({**body, "prompt": long_prompt(words=2500)})
    assert status == 200 and (headers["X-Disagg-Decision"], headers["X-Disagg-Reason"]) == ("remote", "mode_probe")
    assert (await r.request_log(rid))["probe"] is True
    assert await computed(sims["prefill"], r.s) > p0 + 2500
    p1 = await computed(sims["prefill"], r.s)
    status, _, headers, _ = await r.complete({**body, "prompt": long_prompt(words=2500)})
    assert status == 200 and headers["X-Disagg-Reason"] == "mode_aggregated"
    status, _, headers, _ = await r.complete({**body, "prompt": "Say hi."})  # never eligible
    assert headers["X-Disagg-Reason"] == "mode_aggregated"
    assert await computed(sims["prefill"], r.s) == p1
    m = await r.metrics()
    assert metric(m, "disagg_mode_probes_total", outcome="ok") == 1
    assert metric(m, "disagg_mode_probes_total", outcome="failed") == 0

    # a still-broken path costs the probe one fallback, and counts as failed
    for d in sims["decode"]:
        await router.faults(d, kv_transfer_fail_rate=1.0)
    r2 = await router(**held)
    status, _, headers, rid = await r2.complete({**body, "prompt": long_prompt(words=2500), "stream": True})
    assert status == 200 and headers["X-Disagg-Reason"] == "mode_probe"
    assert (await r2.request_log(rid))["fallback"] == "kv_load_failed"
    m = await r2.metrics()
    assert metric(m, "disagg_mode_probes_total", outcome="failed") == 1
    assert metric(m, "disagg_mode_probes_total", outcome="ok") == 0

    # pinned spec.mode Aggregated never probes
    r3 = await router(mode="Aggregated", probe={"ratePerMinute": 6000, "maxShare": 1.0})
    status, _, headers, _ = await r3.complete({**body, "prompt": long_prompt(words=2500)})
    assert status == 200 and headers["X-Disagg-Reason"] == "mode_aggregated"
    assert metric(await r3.metrics(), "disagg_mode_probes_total") == 0
