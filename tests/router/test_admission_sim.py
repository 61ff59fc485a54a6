"""Admission under overload against real processes (issue 29): a `disagg router` over a prefill and a decode
`disagg sim`; a flood of long prompts from a Batch tenant with ``overload: Shed`` beside an Interactive tenant that
Admits. The router refuses batch requests predicted past the SLO with 429, ``Retry-After`` and an OpenAI error body,
counts them in ``disagg_admission_total`` and logs them; every chat request is served."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import aiohttp
import pytest
import yaml

from disagg.poll import until

from .conftest import metric_value, start_router, start_sim
from .test_e2e_sim import MODEL, long_prompt
from .test_faults_sim import Router

TENANTS: list[dict[str, Any]] = [
    {"name": "chat", "match": {"values": ["chat"]}, "priority": "Interactive"},
    {"name": "batch", "match": {"values": ["batch"]}, "priority": "Batch", "overload": "Shed"},
]


@pytest.fixture(scope="module")
def sims(processes):
    return processes, start_sim(processes, "prefill"), start_sim(processes, "decode")


def router_with(sims, tmp_path_factory, tenants: list[dict[str, Any]]) -> Any:
    processes, p, d = sims
    conf = tmp_path_factory.mktemp("admission") / "router.yaml"
    conf.write_text(yaml.safe_dump({"model": MODEL, "mode": "Disaggregated", "transferTimeoutMs": 30000,
                                    "routing": {"tenants": tenants}, "slo": {"ttftP95Ms": 500}}))
    return start_router(processes, [p.url], [d.url], conf)


@pytest.fixture(scope="module")
def stack(sims, tmp_path_factory):
    return router_with(sims, tmp_path_factory, TENANTS)


async def post(s: aiohttp.ClientSession, url: str, tenant: str, max_tokens: int,
               stream: bool = False) -> tuple[int, bytes, dict, str]:
    rid = uuid.uuid4().hex
    body = {"model": MODEL, "prompt": long_prompt(), "max_tokens": max_tokens, "stream": stream}
    async with s.post(url + "/v1/completions", json=body, headers={"X-Request-Id": rid, "x-tenant-id": tenant}) as r:
        return r.status, await r.read(), dict(r.headers), rid


async def test_a_shed_tenant_gets_429_with_retry_after_while_the_interactive_one_is_served(stack) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        router = Router(stack, s)
        shed: list[tuple[bytes, dict, str]] = []
        chat: list[int] = []

        async def flood() -> bool:
            """A wave of batch requests with chat ones among them; True once some batch request was shed."""
            got = await asyncio.gather(*(post(s, router.url, "chat" if i % 8 == 0 else "batch", 64)
                                         for i in range(40)))
            for i, (status, body, headers, rid) in enumerate(got):
                if i % 8 == 0:
                    chat.append(status)
                elif status == 429:
                    shed.append((body, headers, rid))
                else:
                    assert status == 200, body
            return bool(shed)

        await until(flood, 60, "a batch request shed under the flood", interval=0.0)
        assert chat and set(chat) == {200}  # the Interactive tenant (Admit) is served throughout

        body, headers, rid = shed[0]
        assert int(headers["Retry-After"]) >= 1
        err = json.loads(body)["error"]
        assert err["type"] == "server_overloaded" and err["code"] == "overload_shed" and err["message"]
        line = await router.request_log(rid)
        assert line["tenant"] == "batch" and line["status"] == 429 and line["decision"] == "reject"
        assert line["admission"] == "shed" and line["admission_reason"] == "over_slo"

        text = await router.metrics()
        assert metric_value(text, "disagg_admission_total", tenant="batch", priority="Batch", outcome="shed",
                            reason="over_slo") == len(shed)
        assert metric_value(text, "disagg_routing_decisions_total", decision="reject",
                            reason="overload_shed") == len(shed)
        # chat's requests went through admission too, and none was refused
        admitted = sum(metric_value(text, "disagg_admission_total", tenant="chat", priority="Interactive",
                                    outcome="admitted", reason=r) for r in ("within_slo", "over_slo",
                                                                            "nothing_in_flight"))
        assert admitted == len(chat)


async def test_a_queued_request_waits_in_the_router_and_its_wait_is_in_its_ttft(sims, tmp_path_factory) -> None:
    """The batch tenant on Queue (bounded wait): under the same flood its requests wait in the router's admission
    queue and are released as requests complete, or refused with 429 at maxQueueTimeMs; a released request's
    admission wait is inside its request_queue and TTFT timings (the clock starts at its arrival)."""
    queue = [TENANTS[0], {**TENANTS[1], "overload": "Queue", "maxQueueTimeMs": 3000}]
    proc = router_with(sims, tmp_path_factory, queue)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        router = Router(proc, s)

        async def released() -> list[dict[str, Any]]:
            got = await asyncio.gather(*(post(s, router.url, "batch", 64, stream=True) for _ in range(30)))
            for status, body, headers, _ in got:
                if status == 429:  # only ever the queue's own refusals
                    err = json.loads(body)["error"]
                    assert err["code"] in ("admission_queue_timeout", "admission_queue_full"), err
                    assert int(headers["Retry-After"]) >= 1
                else:
                    assert status == 200, body
            lines = [await router.request_log(rid) for *_, rid in got]
            return [x for x in lines if x["admission_reason"] == "released"]

        lines = await until(released, 60, "a batch request released from the admission queue", interval=0.0)
        for line in lines:
            t = line["timings_ms"]
            assert line["admission"] == "admitted" and line["status"] == 200
            assert t["admission_wait"] > 0
            assert t["request_queue"] >= t["admission_wait"] and t["ttft"] >= t["admission_wait"]
        text = await router.metrics()
        assert metric_value(text, "disagg_admission_total", tenant="batch", outcome="admitted",
                            reason="released") >= len(lines)
        assert metric_value(text, "disagg_admission_wait_seconds_count", tenant="batch") >= len(lines)
        assert metric_value(text, "disagg_admission_queue_length", tenant="batch") == 0  # all left the queue


async def test_the_openai_client_reads_a_shed_answer_as_a_rate_limit(stack) -> None:
    """The 429 is in OpenAI's error shape as OpenAI's own client parses it: ``RateLimitError`` with the code, the
    type and the message, and the ``Retry-After`` header (the client would back off on it; retries off here)."""
    import openai

    client = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0,
                                default_headers={"x-tenant-id": "batch"})
    caught: list[openai.RateLimitError] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:

        async def through_the_client() -> None:
            try:
                await client.completions.create(model=MODEL, prompt=long_prompt(), max_tokens=64)
            except openai.RateLimitError as e:
                caught.append(e)

        async def wave() -> bool:
            """Batch requests flooding the router, some through the openai client; True once one of those was
            shed."""
            await asyncio.gather(*(through_the_client() if i % 4 == 0 else post(s, stack.url, "batch", 64)
                                   for i in range(32)))
            return bool(caught)

        await until(wave, 60, "a request through the openai client shed under the flood", interval=0.0)
    await client.close()
    e = caught[0]
    assert e.status_code == 429 and e.code == "overload_shed" and e.type == "server_overloaded"
    assert e.message and int(e.response.headers["retry-after"]) >= 1
