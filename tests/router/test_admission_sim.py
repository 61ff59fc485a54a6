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
def stack(processes, tmp_path_factory):
    p = start_sim(processes, "prefill")
    d = start_sim(processes, "decode")
    conf = tmp_path_factory.mktemp("admission") / "router.yaml"
    conf.write_text(yaml.safe_dump({"model": MODEL, "mode": "Disaggregated", "transferTimeoutMs": 30000,
                                    "routing": {"tenants": TENANTS}, "slo": {"ttftP95Ms": 500}}))
    return start_router(processes, [p.url], [d.url], conf)


async def post(s: aiohttp.ClientSession, url: str, tenant: str, max_tokens: int) -> tuple[int, bytes, dict, str]:
    rid = uuid.uuid4().hex
    body = {"model": MODEL, "prompt": long_prompt(), "max_tokens": max_tokens}
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
