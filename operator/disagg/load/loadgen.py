"""An open-loop load generator for OpenAI-compatible endpoints, measuring TTFT, TPOT and goodput per request.

Requests are sent at their scheduled times whatever the server does (open loop: queueing shows up as latency,
not as a lower offered load). With a time-scaled simulator, ``time_scale`` maps simulated seconds to wall seconds:
arrivals are scheduled at ``at × time_scale`` and measured latencies are divided by it, so every figure is in
simulated (GPU) time and compares directly with the SLOs.

For runs across router restarts (the soak, e2e/test_soak.py) the base URL may be a callable that returns the
current router's URL (None while there is none), and ``connect_retry_s`` retries a request whose connection could
not be opened — the request never reached a router, as a Service would send it to another endpoint — with the
same ``X-Request-Id``; :attr:`Result.retries` counts those retries. Every result also records when it was sent,
when it ended and whether any token reached the client before it ended (:attr:`Result.streamed`), so a failure
can be classed as before or after the stream started.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from ..poll import WaitTimeoutError, until
from .workload import Request


@dataclass
class Result:
    id: str
    cls: str
    tenant: str
    input_tokens: int
    status: int = 0
    error: str = ""
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0
    decision: str = ""  # the router's X-Disagg-Decision header, when present
    reason: str = ""  # X-Disagg-Reason
    path: str = ""  # X-Disagg-Path: remote | local | fallback
    sent_at: float = 0.0  # wall clock (time.time()) when first sent
    done_at: float = 0.0  # wall clock when it ended (answer complete, or the error)
    streamed: bool = False  # at least one token reached the client (a failure after that is mid-stream)
    retries: int = 0  # connect failures retried (the request never reached a router)
    router: str = ""  # the base URL that served (or last failed) it

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error

    def meets(self, ttft_slo_s: float, tpot_slo_s: float) -> bool:
        return (self.ok and self.ttft_s is not None and self.ttft_s <= ttft_slo_s
                and (self.tpot_s is None or self.tpot_s <= tpot_slo_s))


BaseURL = str | Callable[[], str | None]

# the pause between connect retries (a client's retry backoff, not synchronisation: the retry re-reads the URL)
_RETRY_BACKOFF_S = 0.2


async def _one(session: aiohttp.ClientSession, base_url: BaseURL, req: Request, time_scale: float,
               timeout_s: float, connect_retry_s: float = 0.0) -> Result:
    res = Result(req.id, req.cls, req.tenant, req.input_tokens)
    res.sent_at = time.time()
    start = time.perf_counter()
    deadline = start + connect_retry_s
    while True:
        url = base_url() if callable(base_url) else base_url
        if url is None:  # no router right now (one is restarting): wait for one, within the retry budget
            if time.perf_counter() >= deadline:
                res.error = "no router to send to"
                break
            res.retries += 1
            await asyncio.sleep(_RETRY_BACKOFF_S)
            continue
        res.router = url
        try:
            await _attempt(session, url, req, res, start, time_scale, timeout_s)
        except aiohttp.ClientConnectorError as e:  # the connection never opened: nothing reached a router
            if time.perf_counter() < deadline:
                res.retries += 1
                await asyncio.sleep(_RETRY_BACKOFF_S)
                continue
            res.error = f"{type(e).__name__}: {e}"[:300]
        break
    res.done_at = time.time()
    return res


async def _attempt(session: aiohttp.ClientSession, base_url: str, req: Request, res: Result, start: float,
                   time_scale: float, timeout_s: float) -> None:
    headers = {"X-Request-Id": req.id, "x-tenant-id": req.tenant, "Content-Type": "application/json"}
    first = last = None
    tokens = 0
    try:
        async with session.post(base_url + req.path, data=orjson.dumps(req.body), headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            res.status = resp.status
            res.decision = resp.headers.get("x-disagg-decision", "")
            res.reason = resp.headers.get("x-disagg-reason", "")
            res.path = resp.headers.get("x-disagg-path", "")
            if resp.status != 200:
                res.error = (await resp.text())[:300]
                return
            if req.stream:
                buf = b""
                done = False
                async for chunk in resp.content.iter_any():
                    buf += chunk
                    while b"\n\n" in buf:
                        event, buf = buf.split(b"\n\n", 1)
                        if event == b"data: [DONE]":
                            done = True
                            continue
                        if not event.startswith(b"data: "):
                            continue
                        data = orjson.loads(event[6:])
                        if "error" in data:
                            res.error = str(data["error"])[:300]
                            continue
                        n = _delta_tokens(data)
                        if n:
                            now = time.perf_counter()
                            first = first or now
                            res.streamed = True
                            last = now
                            tokens += n
                        usage = data.get("usage")
                        if usage and usage.get("completion_tokens"):
                            tokens = usage["completion_tokens"]
                if not done and not res.error:
                    # an OpenAI stream ends with `data: [DONE]`: without it the answer was cut short, even when
                    # the HTTP response itself ended cleanly
                    res.error = "stream ended before [DONE]"
            else:
                data = orjson.loads(await resp.read())
                first = last = time.perf_counter()
                tokens = (data.get("usage") or {}).get("completion_tokens", 1)
    except aiohttp.ClientConnectorError:
        raise
    except (TimeoutError, aiohttp.ClientError) as e:
        res.error = f"{type(e).__name__}: {e}"[:300]
        return
    end = time.perf_counter()
    res.output_tokens = tokens
    res.e2e_s = (end - start) / time_scale
    if first is not None:
        res.ttft_s = (first - start) / time_scale
        if tokens > 1 and last is not None and req.stream:
            res.tpot_s = (last - first) / time_scale / (tokens - 1)
    elif not res.error:
        res.error = "no token received"


def _delta_tokens(data: dict[str, Any]) -> int:
    n = 0
    for choice in data.get("choices") or ():
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if text:
            n += 1
    return n


async def run(base_url: BaseURL, requests: list[Request], *, time_scale: float = 1.0, timeout_s: float = 300.0,
              concurrency_limit: int = 512, on_done: Callable[[Result], None] | None = None,
              stop: Callable[[], bool] | None = None, connect_retry_s: float = 0.0,
              keep_alive: bool = True) -> list[Result]:
    """Send each request at its scheduled time; the results in the order of ``requests``. With ``stop``: once it
    returns True (it is polled), requests not yet sent are dropped from the run and from the results; those in
    flight complete. ``base_url`` may be a callable (the current router, None while there is none);
    ``connect_retry_s`` > 0 retries requests whose connection could not be opened for that long; ``keep_alive``
    False opens a connection per request (so a router that restarts never gets a request on a stale idle
    connection, which a client cannot tell from a request the router dropped)."""
    connector = aiohttp.TCPConnector(limit=concurrency_limit, force_close=not keep_alive)
    stopped = asyncio.Event()
    async with aiohttp.ClientSession(connector=connector) as session:
        t0 = time.perf_counter()

        async def scheduled(req: Request) -> Result | None:
            delay = req.at * time_scale - (time.perf_counter() - t0)
            if delay > 0 and stop is None:
                await asyncio.sleep(delay)
            elif delay > 0:
                with contextlib.suppress(TimeoutError):  # its time came before the stop (the usual case)
                    await asyncio.wait_for(stopped.wait(), delay)
            if stopped.is_set():
                return None
            r = await _one(session, base_url, req, time_scale, timeout_s, connect_retry_s)
            if on_done:
                on_done(r)
            return r

        async def watch(pred: Callable[[], bool]) -> None:
            last = max((r.at * time_scale for r in requests), default=0.0)
            with contextlib.suppress(WaitTimeoutError):  # every request was sent before stop said so
                await until(pred, last + 1.0, "the load's stop condition", interval=0.1)
                stopped.set()

        watcher = asyncio.create_task(watch(stop)) if stop is not None else None
        try:
            results = await asyncio.gather(*(scheduled(r) for r in requests))
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        return [r for r in results if r is not None]


def percentile(values: Sequence[float | None], q: float) -> float | None:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    k = max(0, min(len(vals) - 1, math.ceil(q * len(vals)) - 1))
    return vals[k]


@dataclass
class Summary:
    requests: int
    errors: int
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    tpot_p50_ms: float | None
    tpot_p95_ms: float | None
    goodput: float  # share of all requests meeting both SLOs
    decisions: dict[str, int] = field(default_factory=dict)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def summarise(results: list[Result], ttft_slo_ms: float, tpot_slo_ms: float) -> Summary:
    ok = [r for r in results if r.ok]
    decisions: dict[str, int] = {}
    for r in results:
        decisions[r.decision or "n/a"] = decisions.get(r.decision or "n/a", 0) + 1
    met = sum(r.meets(ttft_slo_ms / 1000, tpot_slo_ms / 1000) for r in results)
    return Summary(
        requests=len(results), errors=len(results) - len(ok),
        ttft_p50_ms=_ms(percentile([r.ttft_s for r in ok], 0.5)),
        ttft_p95_ms=_ms(percentile([r.ttft_s for r in ok], 0.95)),
        tpot_p50_ms=_ms(percentile([r.tpot_s for r in ok], 0.5)),
        tpot_p95_ms=_ms(percentile([r.tpot_s for r in ok], 0.95)),
        goodput=round(met / len(results), 4) if results else 0.0, decisions=decisions,
    )
