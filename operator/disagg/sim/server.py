"""HTTP front of the simulated worker: vLLM's OpenAI-compatible API plus a small admin API.

vLLM endpoints: POST /v1/completions, POST /v1/chat/completions (stream and not), GET /v1/models,
GET /health, GET /ping, GET /version, GET /metrics. Sim admin: GET/POST /sim/faults, GET /sim/state,
POST /sim/crash. Response shapes follow vllm/entrypoints/openai/protocol.py (v0.11.2).

Traces (disagg.tracing has the vLLM 0.33.0 citations): with an OTLP endpoint (``--otlp-traces-endpoint``,
or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, the variable vLLM itself exports the
flag into) every finished request emits vLLM's ``llm_request`` span — parent from the request's ``traceparent``,
start at arrival, end at the finish, the same ``gen_ai.*`` attributes — exported over OTLP/HTTP; the decode side's
KV pull lies inside its ``time_in_queue`` as in vLLM, and the twin adds one child span for it,
``disagg.sim.kv_pull`` (no vLLM span exists for it). Times are wall seconds (simulated seconds × --time-scale) so
that the spans nest in the caller's. ``--enable-per-request-metrics`` adds vLLM's per-request
``metrics`` object to responses.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
import zlib
from typing import Any

from aiohttp import web

from .. import logs
from . import kvevents, tokenizer
from .config import SimConfig
from .engine import Engine, ReqCtx, make_request
from .metrics import CONTENT_TYPE
from .protocol import (
    GENERATION_ERROR,
    ApiError,
    check_lengths,
    check_model,
    error_response,
    generation_error_event,
    int_param,
    json_response,
    kv_params,
    output_plan,
    prompt_ids,
    prompt_tokens_details,
    read_body,
    request_priority,
    sse_event,
)
from .scheduler import Request
from .telemetry import RequestTelemetry

log = logs.get("disagg.sim.server")

ENGINE_KEY = web.AppKey("engine", Engine)
CFG_KEY = web.AppKey("cfg", SimConfig)



class Api:
    def __init__(self, cfg: SimConfig, engines: list[Engine]) -> None:
        self.cfg, self.engines = cfg, engines
        self.engine = engines[0]  # the shared clock and the fault RNG
        self.telemetry = RequestTelemetry(cfg, self.engine)
        self.per_request_metrics = cfg.enable_per_request_metrics
        # vLLM --enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens (the prefix cache's reuse)
        self.prompt_tokens_details = bool(getattr(cfg, "enable_prompt_tokens_details", False))
        self.release = cfg.release

    async def reset_prefix_cache(self, _: web.Request) -> web.Response:
        """vLLM's ``POST /reset_prefix_cache``: 200 when every engine dropped its cached blocks (an
        ``AllBlocksCleared`` event), 400 while blocks are in use."""
        ok = all([e.pool.reset() for e in self.engines])  # every engine, not up to the first refusal
        for e in self.engines:
            e.wake()  # an idle engine's loop runs once: its AllBlocksCleared goes out now
        return web.Response(status=200 if ok else 400)

    def pick(self) -> Engine:
        """Like vLLM's DP coordinator: the data-parallel rank with the fewest requests (then the emptiest KV)."""
        if len(self.engines) == 1:
            return self.engine
        return min(self.engines, key=lambda e: (len(e.sched.running) + len(e.sched.waiting), e.pool.usage,
                                                e.dp_rank))

    def _faults_on_request(self, needs_local_prefill: bool) -> None:
        fault = self.engine.request_fault(needs_local_prefill)
        if fault is None:
            return
        message, crash = fault
        if crash:
            log.error("injected_crash", after_requests=self.engine.requests_seen)
            asyncio.get_running_loop().call_later(0.05, os._exit, 1)
        raise ApiError(message, 500, "InternalServerError")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        base = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        request_id = ("chatcmpl-" if chat else "cmpl-") + base
        try:
            body = await read_body(request)
            model = check_model(self.cfg, body)
            vocab = self.cfg.model_preset.vocab
            if chat:
                messages = body.get("messages")
                if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
                    raise ApiError("messages must be a non-empty list of message objects", param="messages")
                prompts = [tokenizer.encode_chat(messages, vocab)]
                max_tokens = int_param(body, "max_completion_tokens", 1)
                if max_tokens is None:
                    max_tokens = int_param(body, "max_tokens", 1)
            else:
                prompts = prompt_ids(body, vocab)
                max_tokens = int_param(body, "max_tokens", 1)
            n = int_param(body, "n", 1)
            if n not in (None, 1):
                raise ApiError("n > 1 is not supported by the simulator", param="n")
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise ApiError("stream must be a boolean", param="stream")
            opts = body.get("stream_options") or {}
            if not isinstance(opts, dict):
                raise ApiError("stream_options must be an object", param="stream_options")
            include_usage = bool(opts.get("include_usage")) and stream
            if stream and len(prompts) > 1:
                raise ApiError("streaming with several prompts is not supported by the simulator", param="prompt")
            kvp = kv_params(body)
            priority = request_priority(request.headers, body)
            for p in prompts:
                check_lengths(self.cfg, len(p), max_tokens)
            remote_prefill = bool(kvp and kvp.get("do_remote_prefill") and self.cfg.kv_transfer)
            self._faults_on_request(needs_local_prefill=not remote_prefill)
        except ApiError as e:
            return error_response(e, base)

        # the API server's share of TTFT (HTTP, tokenising, the hand-off to the engine core) before the request
        # reaches the scheduler: eff.request_overhead_s, the figure sim/bench.py prices and, for the CPU engine,
        # fitted on a real one (disagg bench real-engine: without it the sim's TTFT was half the real engine's)
        received = self.engine.clock.now()
        overhead = self.engine.perf.eff.request_overhead_s
        if overhead > 0:
            await self.engine.clock.sleep(overhead)
        now = self.engine.clock.now()
        reqs = []
        for i, ids in enumerate(prompts):
            count, reason = output_plan(self.cfg, len(ids), max_tokens)
            rid = request_id if chat else f"{request_id}-{i}"
            req = make_request(rid, ids, count, now, limit_reason=reason, kv_params=kvp,
                               seed=zlib.crc32(rid.encode()) & 0xFFFF, priority=priority, received=received)
            req.ctx = ReqCtx(max_tokens_param=max_tokens)
            reqs.append(req)
        for req in reqs:
            engine = self.pick()
            req.ctx.engine = engine
            engine.submit(req)
        created = int(time.time())
        if stream:
            return await self._stream(request, reqs[0], request_id, base, model, created, chat, include_usage)
        return await self._full(reqs, request_id, base, model, created, chat, request.headers)

    async def _full(self, reqs: list[Request], request_id: str, base: str, model: str, created: int,
                    chat: bool, headers: Any = None) -> web.Response:
        choices = []
        completion_tokens = 0
        kv_out = None
        try:
            for i, req in enumerate(reqs):
                ctx: ReqCtx = req.ctx
                pieces = []
                reason = None
                while True:
                    kind, val, _ = await ctx.queue.get()
                    if kind == "token":
                        pieces.append(tokenizer.synthetic_piece(req.seed, val - 1))
                    else:
                        reason = val
                        break
                self.telemetry.finished(req, headers or {}, ctx.max_tokens_param)
                if ctx.error or reason == "error":
                    log.error("generation_error", request_id=req.request_id, error=ctx.error)
                    raise ApiError(GENERATION_ERROR, 500, "InternalServerError")
                completion_tokens += len(pieces)
                text = "".join(pieces)
                kv_out = kv_out or ctx.kv_params_out
                # the keys a real engine's answer has (a real 0.32.0 CPU engine, e2e/test_real_vllm.py, and
                # vllm/entrypoints/openai/{chat_completion,completion}/protocol.py of 0.32.0 and 0.33.0): nulls
                # included; a chat message without tool_calls (an empty list is left out)
                if chat:
                    message: dict[str, Any] = {
                        "role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
                        "function_call": None, "reasoning": None}
                    choice: dict[str, Any] = {"index": i, "message": message, "logprobs": None,
                                              "finish_reason": reason, "stop_reason": None, "token_ids": None,
                                              "routed_experts": None}
                    if self.release.chat_weight_versions:
                        choice["weight_versions"] = None
                    choices.append(choice)
                else:
                    choices.append({"index": i, "text": text, "logprobs": None, "finish_reason": reason,
                                    "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
                                    "prompt_token_ids": None, "routed_experts": None})
        except ApiError as e:
            for req in reqs:  # vLLM: the exception closes the other prompts' generators, which aborts them
                req.ctx.engine.abort(req)
            return error_response(e, base)
        except asyncio.CancelledError:
            for req in reqs:
                req.ctx.engine.abort(req)
            raise
        prompt_tokens = sum(r.prompt_len for r in reqs)
        body = {
            "id": request_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
                      "completion_tokens": completion_tokens,
                      "prompt_tokens_details": prompt_tokens_details(sum(r.num_cached for r in reqs))
                      if self.prompt_tokens_details else None,
                      "completion_tokens_details": None},
        }
        if chat:
            body.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
        body["kv_transfer_params"] = kv_out
        body["ec_transfer_params"] = None
        one = reqs[0] if self.per_request_metrics and len(reqs) == 1 else None
        body["metrics"] = self.telemetry.request_metrics(one) if one is not None else None
        return json_response(body, headers={"X-Request-Id": base})

    async def _stream(self, request: web.Request, req: Request, request_id: str, base: str, model: str,
                      created: int, chat: bool, include_usage: bool) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                        "Cache-Control": "no-cache", "X-Request-Id": base})
        obj = "chat.completion.chunk" if chat else "text_completion"
        ctx: ReqCtx = req.ctx

        first = [True]

        def chunk(choice: dict[str, Any]) -> bytes:
            # as a real engine streams them (a real 0.32.0 CPU engine, e2e/test_real_vllm.py): chat chunks with
            # exclude_unset — the role chunk carries prompt_token_ids/prompt_text, later ones token_ids — and
            # completion chunks with every choice field (nulls included) and no usage key
            if chat:
                out: dict[str, Any] = {"id": request_id, "object": obj, "created": created, "model": model,
                                       "choices": [choice]}
                if first[0]:
                    out.update(prompt_token_ids=None, prompt_text=None)
                else:
                    choice["token_ids"] = None
                first[0] = False
                return sse_event(out)
            choice.setdefault("stop_reason", None)
            choice.update(prompt_token_ids=None, token_ids=None)
            return sse_event({"id": request_id, "object": obj, "created": created, "model": model, "choices": [choice]})

        try:
            await resp.prepare(request)
            # vLLM sends the chat role chunk with the engine's first output (after prefill, or after the KV pull
            # on a decode worker), not before: a router timing the KV hand-off relies on that.
            pending: list[bytes] = []
            if chat:
                pending.append(chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                      "finish_reason": None}))
            while True:
                kind, val, _ = await ctx.queue.get()
                if kind == "token":
                    piece = tokenizer.synthetic_piece(req.seed, val - 1)
                    done = req.finished and val == req.num_output and ctx.queue.qsize() > 0
                    finish = None
                    if done:  # the finish event is already queued: put the reason on the last token's chunk
                        nxt = ctx.queue.get_nowait()
                        finish = nxt[1]
                    if chat:
                        c = {"index": 0, "delta": {"content": piece}, "logprobs": None, "finish_reason": finish}
                    else:
                        c = {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish, "stop_reason": None}
                    if finish is not None:
                        c["stop_reason"] = None
                        self.telemetry.finished(req, request.headers, ctx.max_tokens_param)
                    pending.append(chunk(c))
                    if ctx.queue.qsize() == 0 or finish is not None:
                        await resp.write(b"".join(pending))
                        pending.clear()
                    if finish is not None:
                        break
                else:
                    self.telemetry.finished(req, request.headers, ctx.max_tokens_param)
                    if ctx.error or val == "error":  # vLLM's in-stream GenerationError: see GENERATION_ERROR
                        log.error("generation_error", request_id=req.request_id, error=ctx.error)
                        await resp.write(b"".join(pending) + generation_error_event(chat) + b"data: [DONE]\n\n")
                        await resp.write_eof()
                        return resp
                    if chat:
                        c = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": val}
                    else:
                        c = {"index": 0, "text": "", "logprobs": None, "finish_reason": val, "stop_reason": None}
                    await resp.write(b"".join(pending) + chunk(c))
                    break
            if include_usage:
                usage: dict[str, Any] = {"prompt_tokens": req.prompt_len,
                                         "total_tokens": req.prompt_len + req.num_output,
                                         "completion_tokens": req.num_output}
                if self.prompt_tokens_details:
                    usage["prompt_tokens_details"] = prompt_tokens_details(req.num_cached)
                last: dict[str, Any] = {"id": request_id, "object": obj, "created": created, "model": model,
                                        "choices": [], "usage": usage}
                if self.per_request_metrics:  # vLLM: on the final usage chunk (chat_completion/serving.py:883-911)
                    last["metrics"] = self.telemetry.request_metrics(req)
                await resp.write(sse_event(last))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
            ctx.engine.abort(req)
            raise
        return resp

    # -------------------------------------------------------------------------------------- misc
    async def models(self, _request: web.Request) -> web.Response:
        now = int(time.time())
        data: list[dict[str, Any]] = [
            {"id": name, "object": "model", "created": now, "owned_by": "vllm", "root": self.cfg.model,
             "parent": None, "max_model_len": self.cfg.max_model_len, "permission": []}
            for name in self.cfg.served_model_names]
        return json_response({"object": "list", "data": data})

    async def health(self, _request: web.Request) -> web.Response:
        if self.cfg.faults.health_fail:
            return web.Response(status=503)
        return web.Response(status=200)

    async def version(self, _request: web.Request) -> web.Response:
        return json_response({"version": self.cfg.vllm_version})

    async def metrics(self, _request: web.Request) -> web.Response:
        for e in self.engines:
            e.update_gauges()
        return web.Response(body=self.engine.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def get_faults(self, _request: web.Request) -> web.Response:
        return json_response(self.cfg.faults.as_dict())

    async def set_faults(self, request: web.Request) -> web.Response:
        try:
            body = await read_body(request)
            self.cfg.faults.update(body)
        except ApiError as e:
            return error_response(e)
        except ValueError as e:
            return error_response(ApiError(str(e)))
        log.warning("faults_updated", **self.cfg.faults.as_dict())
        return json_response(self.cfg.faults.as_dict())

    async def state(self, _request: web.Request) -> web.Response:
        return json_response(aggregate_state([e.state() for e in self.engines]))

    async def crash(self, _request: web.Request) -> web.Response:
        log.error("injected_crash", via="POST /sim/crash")
        asyncio.get_running_loop().call_later(0.05, os._exit, 1)
        return json_response({"crashing": True})


_SUMMED = ("num_gpu_blocks", "kv_cache_tokens", "free_blocks", "running", "waiting", "waiting_deferred", "held_blocks",
           "steps", "computed_prompt_tokens")


def aggregate_state(states: list[dict[str, Any]]) -> dict[str, Any]:
    """/sim/state: the first engine's view with counts summed over data-parallel ranks, plus ``engines``."""
    out = dict(states[0])
    out.pop("dp_rank", None)
    for k in _SUMMED:
        out[k] = sum(s[k] for s in states)
    out["held_requests"] = sorted(r for s in states for r in s["held_requests"])
    out["kv_cache_usage"] = 1.0 - out["free_blocks"] / out["num_gpu_blocks"]
    if out.get("kv_transfer"):
        kv = dict(out["kv_transfer"])
        for k in ("transfers_ok", "transfers_failed", "recomputed"):
            kv[k] = sum(s["kv_transfer"][k] for s in states)
        kv["engine_ids"] = [s["kv_transfer"]["engine_id"] for s in states]
        out["kv_transfer"] = kv
    out["data_parallel_size"] = len(states)
    out["engines"] = states
    return out


def build_app(cfg: SimConfig, engines: list[Engine] | Engine) -> web.Application:
    engines = engines if isinstance(engines, list) else [engines]
    engine = engines[0]
    app = web.Application(client_max_size=64 * 1024 * 1024)
    api = Api(cfg, engines)
    app[ENGINE_KEY] = engine
    app[CFG_KEY] = cfg
    r = app.router
    r.add_post("/v1/completions", api.completions)
    r.add_post("/v1/chat/completions", api.chat)
    r.add_get("/v1/models", api.models)
    r.add_get("/health", api.health)
    r.add_get("/ping", api.health)
    r.add_post("/ping", api.health)
    r.add_get("/version", api.version)
    r.add_get("/metrics", api.metrics)
    r.add_get("/sim/faults", api.get_faults)
    r.add_post("/sim/faults", api.set_faults)
    r.add_get("/sim/state", api.state)
    r.add_post("/sim/crash", api.crash)
    r.add_post("/reset_prefix_cache", api.reset_prefix_cache)
    _kv_events(app, cfg, engines)
    return app


def _kv_events(app: web.Application, cfg: SimConfig, engines: list[Engine]) -> None:
    """``--kv-events-config`` with the zmq publisher: each engine (data-parallel rank) publishes its block pool's
    events on the endpoint's port + its rank, as vLLM does (sim/kvevents.py)."""
    raw = getattr(cfg, "kv_events", None)
    if not raw:
        return
    kcfg = kvevents.KVEventsConfig.parse(json.dumps(raw))
    if not kcfg.publishes:
        return
    pubs: list[kvevents.ZmqPublisher] = []

    async def start(_: web.Application) -> None:
        for e in engines:
            pub = kvevents.ZmqPublisher(kcfg, e.dp_rank,
                                        on_error=lambda exc: log.warning("kv_events_error", error=str(exc)))
            pubs.append(pub)
            e.enable_kv_events(pub.publish)
            log.info("kv_events_publishing", endpoint=pub.endpoint, replay=pub.replay_endpoint, rank=e.dp_rank)

    async def stop(_: web.Application) -> None:
        for pub in pubs:
            pub.close()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
