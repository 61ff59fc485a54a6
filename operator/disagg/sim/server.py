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

import orjson
from aiohttp import web

from .. import logs, tracing
from . import kvevents, tokenizer
from .config import SimConfig
from .engine import Engine, ReqCtx, make_request
from .metrics import CONTENT_TYPE
from .scheduler import Request

log = logs.get("disagg.sim.server")

ENGINE_KEY = web.AppKey("engine", Engine)
CFG_KEY = web.AppKey("cfg", SimConfig)



def prompt_tokens_details(cached: int) -> dict[str, Any]:
    """``usage.prompt_tokens_details`` as vLLM writes it (PromptTokenUsageInfo in
    vllm/entrypoints/serve/engine/protocol.py, the same in 0.32.0 and 0.33.0: cached_tokens, created_cache_tokens,
    multimodal_tokens); only the prefix cache's reuse is simulated, the others are null as for a text prompt
    without cache-creation accounting."""
    return {"cached_tokens": cached, "created_cache_tokens": None, "multimodal_tokens": None}

class ApiError(Exception):
    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.err_type, self.param = message, status, err_type, param


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def error_response(e: ApiError, request_id: str | None = None) -> web.Response:
    headers = {"X-Request-Id": request_id} if request_id else None
    return web.json_response(error_body(e.message, e.err_type, e.status, e.param), status=e.status,
                             dumps=lambda o: orjson.dumps(o).decode(), headers=headers)


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json", headers=headers)


def _sse(data: Any) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


# A request the engine finished with reason "error" (here: a failed KV load under kv_load_failure_policy=fail).
# vLLM 0.33.0 turns it into GenerationError("Internal server error") before building any choice for that output
# (vllm/entrypoints/generate/base/serving.py:200-207 _raise_if_error; vllm/exceptions.py:131-136, status 500), so
# no chunk ever carries finish_reason "error" and the detail only reaches the server log:
# - not streamed: HTTP 500 with this body, compact (serve/exception_handling/handlers/vllm_error.py:69-77
#   generation_error_handler; error_response.py:60-67 type InternalServerError; starlette JSONResponse separators
#   (",", ":"));
# - chat, streamed: HTTP 200; the role chunk (sent with the engine's first output, which is this one), then this
#   body as `data:` compact (openai/chat_completion/serving.py:686 raise, :947-950 ErrorResponse, :496-497
#   model_dump_json), then `data: [DONE]` (:507); no usage chunk;
# - completion, streamed: HTTP 200; no chunk before it; this body as `data:` through json.dumps, i.e. with ", " and
#   ": " separators (openai/completion/serving.py:350 raise, :552-553; generate/base/serving.py:183-198), then
#   `data: [DONE]` (:558).
GENERATION_ERROR = "Internal server error"


def generation_error_body() -> dict[str, Any]:
    return error_body(GENERATION_ERROR, "InternalServerError", 500)


def generation_error_event(chat: bool) -> bytes:
    body = generation_error_body()
    if chat:
        return _sse(body)
    return b"data: " + json.dumps(body).encode() + b"\n\n"


# ------------------------------------------------------------------------------------------ parsing
PRIORITY_HEADER = "X-Vllm-Priority"  # vllm/entrypoints/generate/base/serving.py PRIORITY_HEADER (0.33.0)
_INT64 = 2**63


def request_priority(headers: Any, body: dict[str, Any]) -> int:
    """The request's scheduling priority as vLLM 0.33.0 reads it (serving.py ``_get_priority``): the
    ``X-Vllm-Priority`` header when it is an integer, else the body's ``priority`` (an int64, default 0; lower is
    served first under ``--scheduling-policy priority``)."""
    h = headers.get(PRIORITY_HEADER)
    if h is not None:
        try:
            return int(h)
        except ValueError:
            pass
    v = body.get("priority", 0)
    if not isinstance(v, int) or isinstance(v, bool) or not -_INT64 <= v < _INT64:
        raise ApiError("priority must be an integer", param="priority")
    return v


def _int_param(body: dict[str, Any], name: str, minimum: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(f"{name} must be an integer, got {v!r}", param=name)
    if minimum is not None and v < minimum:
        raise ApiError(f"{name} must be at least {minimum}, got {v}.", param=name)
    return v


async def _read_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ApiError(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError("request body must be a JSON object")
    return body


def _check_model(cfg: SimConfig, body: dict[str, Any]) -> str:
    model = body.get("model")
    if model is None:
        return cfg.served_model_name
    if not isinstance(model, str) or model not in cfg.served_model_names:
        raise ApiError(f"The model `{model}` does not exist.", 404, "NotFoundError", "model")
    return model


def _prompts(body: dict[str, Any], vocab: int) -> list[list[int]]:
    prompt = body.get("prompt")
    if prompt is None:
        raise ApiError("prompt is required", param="prompt")
    if isinstance(prompt, str):
        return [[tokenizer.BOS_ID, *tokenizer.encode(prompt, vocab)]]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return [list(prompt)]
        if all(isinstance(p, str) for p in prompt):
            return [[tokenizer.BOS_ID, *tokenizer.encode(p, vocab)] for p in prompt]
        if all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompt):
            return [list(p) for p in prompt]
    raise ApiError("prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids",
                   param="prompt")


def check_lengths(cfg: SimConfig, n_prompt: int, max_tokens: int | None) -> None:
    if n_prompt >= cfg.max_model_len:
        raise ApiError(f"This model's maximum context length is {cfg.max_model_len} tokens. However, your request "
                       f"has {n_prompt} input tokens. Please reduce the length of the input messages.",
                       param="prompt")
    if max_tokens is not None and n_prompt + max_tokens > cfg.max_model_len:
        raise ApiError(f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                       f"context length is {cfg.max_model_len} tokens and your request has {n_prompt} input tokens "
                       f"({max_tokens} > {cfg.max_model_len} - {n_prompt}).", param="max_tokens")


def _output_plan(cfg: SimConfig, n_prompt: int, max_tokens: int | None) -> tuple[int, str]:
    """How many tokens to generate and the finish reason: max_tokens → length; unset → the sim's EOS (stop)."""
    if max_tokens is not None:
        return max_tokens, "length"
    room = cfg.max_model_len - n_prompt
    if cfg.output_tokens >= room:
        return room, "length"
    return cfg.output_tokens, "stop"


def _kv_params(body: dict[str, Any]) -> dict[str, Any] | None:
    p = body.get("kv_transfer_params")
    if p is None:
        return None
    if not isinstance(p, dict):
        raise ApiError("kv_transfer_params must be an object", param="kv_transfer_params")
    return p


# ------------------------------------------------------------------------------------------ handlers
def _tracing(cfg: SimConfig) -> tracing.Tracing | None:
    """vLLM's tracer set-up, reduced: an endpoint turns it on; the sampler is the SDK's default (ParentBased(
    ALWAYS_ON), or OTEL_TRACES_SAMPLER/_ARG), as vLLM builds its TracerProvider without one (tracing/otel.py:83)."""
    endpoint = cfg.otlp_traces_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if not endpoint:
        return None
    # vLLM's default is gRPC (tracing/otel.py:95); the simulator honours the variable when it is set, as vLLM does,
    # and otherwise keeps to OTLP/HTTP (what a bare `disagg sim --otlp-traces-endpoint …/v1/traces` means)
    protocol = os.environ.get(tracing.PROTOCOL_ENV)
    if protocol is None:
        log.warning("otlp_protocol_unset", using=tracing.PROTOCOL,
                    note=f"vLLM would use grpc; set {tracing.PROTOCOL_ENV} (grpc or http/protobuf) as the operator "
                    "does for vLLM")
    # vLLM: init_tracer("vllm.llm_engine", endpoint) (v1/engine/async_llm.py:149-151; resource: tracing/otel.py:76-81)
    return tracing.setup(endpoint, None, None, resource={"vllm.instrumenting_module_name": "vllm.llm_engine",
                                                            "vllm.process_id": str(os.getpid())},
                         protocol=protocol or tracing.PROTOCOL)


class Api:
    def __init__(self, cfg: SimConfig, engines: list[Engine]) -> None:
        self.cfg, self.engines = cfg, engines
        self.engine = engines[0]  # the shared clock and the fault RNG
        self.tracing = _tracing(cfg)
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

    def _wall_ns(self, t: float) -> int:
        """A simulated instant as Unix-epoch nanoseconds."""
        clock = self.engine.clock
        return time.time_ns() - int((clock.now() - t) * clock.scale * 1e9)

    def _finished(self, req: Request, headers: Any, max_tokens: int | None) -> None:
        """vLLM's do_tracing for one finished request (v1/engine/output_processor.py:941-1001)."""
        tr = self.tracing
        if tr is None:
            return
        scale = self.engine.clock.scale
        now = self.engine.clock.now()
        sched, first, last = req.first_scheduled, req.first_token, req.last_token
        attrs: dict[str, Any] = {
            tracing.ATTR_TTFT: (first - req.received_at) * scale if first is not None else 0.0,
            tracing.ATTR_E2E: (now - req.received_at) * scale,
            tracing.ATTR_QUEUE: (sched - req.queued_at) * scale if sched is not None else 0.0,
            tracing.ATTR_PROMPT_TOKENS: req.prompt_len,
            tracing.ATTR_COMPLETION_TOKENS: req.num_output,
            tracing.ATTR_PREFILL: (first - sched) * scale if first is not None and sched is not None else 0.0,
            tracing.ATTR_DECODE: (last - first) * scale if last is not None and first is not None else 0.0,
            tracing.ATTR_INFERENCE: (last - sched) * scale if last is not None and sched is not None else 0.0,
            tracing.ATTR_REQUEST_ID: req.request_id,
        }
        if max_tokens:
            attrs[tracing.ATTR_MAX_TOKENS] = max_tokens
        attrs[tracing.ATTR_N] = 1
        parent = tracing.parent_context(headers)
        span = tr.start(tracing.LLM_REQUEST_SPAN, parent, "SERVER", self._wall_ns(req.received_at), attrs)
        ctx: ReqCtx = req.ctx
        if req.kv_requested is not None:  # the decode side's KV pull (twin-only span, inside time_in_queue)
            start = max(req.kv_requested, req.arrival)
            end = start + ctx.xfer_s if ctx.xfer_s is not None else (sched if sched is not None else now)
            if sched is not None:
                end = min(end, sched)
            pull = tr.start(tracing.SIM_KV_PULL_SPAN, span, "INTERNAL", self._wall_ns(start), {
                "disagg.sim.kv_tokens": req.num_external, "disagg.sim.ok": ctx.xfer_s is not None,
                "disagg.sim.remote_engine_id": str((req.remote_prefill or {}).get("remote_engine_id", ""))})
            pull.end(self._wall_ns(end))
        span.end(self._wall_ns(now))

    def _request_metrics(self, req: Request) -> dict[str, Any]:
        """vLLM's per-request ``metrics`` (--enable-per-request-metrics; generate/base/serving.py:45-103), in
        wall milliseconds."""
        ms = self.engine.clock.scale * 1000.0
        sched, first, last, n = req.first_scheduled, req.first_token, req.last_token, req.num_output
        out: dict[str, Any] = {"time_to_first_token_ms": None, "generation_time_ms": None, "queue_time_ms": None,
                               "mean_itl_ms": None, "tokens_per_second": None, "speculative_decoding": None}
        if sched is not None and first is not None:
            out["time_to_first_token_ms"] = (first - sched) * ms
        if first is not None and last is not None:
            out["generation_time_ms"] = (last - first) * ms
            if n > 1:
                out["mean_itl_ms"] = (last - first) / (n - 1) * ms
        if sched is not None:
            out["queue_time_ms"] = (sched - req.queued_at) * ms
        if sched is not None and last is not None and last > sched:
            out["tokens_per_second"] = n / ((last - sched) * ms) * 1000.0
        return out

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
            body = await _read_body(request)
            model = _check_model(self.cfg, body)
            vocab = self.cfg.model_preset.vocab
            if chat:
                messages = body.get("messages")
                if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
                    raise ApiError("messages must be a non-empty list of message objects", param="messages")
                prompts = [tokenizer.encode_chat(messages, vocab)]
                max_tokens = _int_param(body, "max_completion_tokens", 1)
                if max_tokens is None:
                    max_tokens = _int_param(body, "max_tokens", 1)
            else:
                prompts = _prompts(body, vocab)
                max_tokens = _int_param(body, "max_tokens", 1)
            n = _int_param(body, "n", 1)
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
            kvp = _kv_params(body)
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
            count, reason = _output_plan(self.cfg, len(ids), max_tokens)
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
                self._finished(req, headers or {}, ctx.max_tokens_param)
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
        body["metrics"] = self._request_metrics(reqs[0]) if self.per_request_metrics and len(reqs) == 1 else None
        return _json(body, headers={"X-Request-Id": base})

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
                return _sse(out)
            choice.setdefault("stop_reason", None)
            choice.update(prompt_token_ids=None, token_ids=None)
            return _sse({"id": request_id, "object": obj, "created": created, "model": model, "choices": [choice]})

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
                        self._finished(req, request.headers, ctx.max_tokens_param)
                    pending.append(chunk(c))
                    if ctx.queue.qsize() == 0 or finish is not None:
                        await resp.write(b"".join(pending))
                        pending.clear()
                    if finish is not None:
                        break
                else:
                    self._finished(req, request.headers, ctx.max_tokens_param)
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
                    last["metrics"] = self._request_metrics(req)
                await resp.write(_sse(last))
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
        return _json({"object": "list", "data": data})

    async def health(self, _request: web.Request) -> web.Response:
        if self.cfg.faults.health_fail:
            return web.Response(status=503)
        return web.Response(status=200)

    async def version(self, _request: web.Request) -> web.Response:
        return _json({"version": self.cfg.vllm_version})

    async def metrics(self, _request: web.Request) -> web.Response:
        for e in self.engines:
            e.update_gauges()
        return web.Response(body=self.engine.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def get_faults(self, _request: web.Request) -> web.Response:
        return _json(self.cfg.faults.as_dict())

    async def set_faults(self, request: web.Request) -> web.Response:
        try:
            body = await _read_body(request)
            self.cfg.faults.update(body)
        except ApiError as e:
            return error_response(e)
        except ValueError as e:
            return error_response(ApiError(str(e)))
        log.warning("faults_updated", **self.cfg.faults.as_dict())
        return _json(self.cfg.faults.as_dict())

    async def state(self, _request: web.Request) -> web.Response:
        return _json(aggregate_state([e.state() for e in self.engines]))

    async def crash(self, _request: web.Request) -> web.Response:
        log.error("injected_crash", via="POST /sim/crash")
        asyncio.get_running_loop().call_later(0.05, os._exit, 1)
        return _json({"crashing": True})


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
