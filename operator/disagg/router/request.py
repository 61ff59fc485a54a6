"""One request: its bookkeeping (``Ctx``, which becomes the log line), body validation, and HTTP helpers.

``parse_request`` validates the body once (JSON object, model, stream flags, prompt shape) and raises
``features.BadRequestError`` with an OpenAI-style status/type/param; nothing here does I/O.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from . import features

HOP_HEADERS = {"authorization"}  # forwarded from the client to the workers


def openai_error(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 headers: dict[str, str] | None = None, code: str | int | None = None) -> web.Response:
    """OpenAI's error shape; ``code`` defaults to the status."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": status if code is None else code}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json", headers=headers)


@dataclass
class Ctx:
    """One request's bookkeeping (becomes the log line)."""

    request_id: str
    endpoint: str
    stream: bool
    t0: float
    tenant: str = "default"
    decision: str = ""
    reason: str = ""
    path: str = ""
    input_tokens: int = 0
    # a text prompt without --tokenizer: the router's estimate from its bytes before the learned scale (tokenscale.py
    # compares it with the engine's count), and the scale applied to it and to the text prefix matches; 0 and 1.0
    # when the prompt is counted exactly (token ids, a tokenizer)
    input_text_estimate: int = 0
    input_scale: float = 1.0
    engine_prompt_tokens: int | None = None  # the prompt as an engine counted it (a leg's usage.prompt_tokens)
    prefill_worker: str | None = None
    decode_worker: str | None = None
    fallback: str | None = None
    outcome: str = ""
    status: int = 0
    output_tokens: int | None = None
    timings: dict[str, float] = field(default_factory=dict)
    first_upstream_at: float | None = None
    upstream_id: str = ""  # X-Request-Id sent on both legs
    probe: bool = False  # a mode probe (probe.py)
    # timing keys that came from a worker's recent metric averages, not from a per-request source
    estimated: set[str] = field(default_factory=set)
    span: Any = None  # the router's span for this request (tracing on and sampled or not); None when tracing is off
    # request log schema 2 (docs/planning.md "The request log"; read by disagg replay and disagg plan --from-log)
    arrival_unix: float = 0.0  # wall clock when the router received the request
    max_tokens: int | None = None  # what the client asked for (None: absent)
    prefix_hash: str | None = None  # chained hash of the longest leading block run the prefix index had seen
    prefix_tokens: int = 0  # its length in tokens (0: no worker held any of this prompt's prefix)
    # the SLO placement's choice and runner-up (placement.py Prediction.as_detail), and the chosen prediction itself
    priority: int | None = None  # vLLM request priority sent on every leg (None: priority scheduling is off)
    placement: dict[str, Any] | None = None
    runner_up: Any = None  # placement.RunnerUp: priced when the log line asks for it (rejected_placement)
    prediction: Any = None
    # admission under overload (core.py RequestCore.admit): outcome and reason (None: admission is off), and when
    # the request left the admission queue (core clock; the prediction ratios start there)
    admission: str | None = None
    admission_reason: str | None = None
    admitted_at: float | None = None
    # the exact prefix index (issue 30, kvindex.py): the prompt's token ids when the router knows them (a prompt of
    # token ids; the twin's arrivals), the prompt tokens expected cached on the worker chosen and where that came
    # from ("events": the engines' own KV events; "estimate": prefix.py), and what the engine reported reusing
    token_ids: tuple[int, ...] | None = None
    # its block keys per block size (features.token_block_keys), computed once per request; the router's estimate
    # hashes of a token-id prompt are the 16-token keys already (features.prefix_block_hashes)
    token_keys: dict[int, Sequence[int]] = field(default_factory=dict)
    expected_cached_tokens: int | None = None
    cache_source: str | None = None
    reused_tokens: int | None = None  # the serving worker's usage.prompt_tokens_details.cached_tokens
    prefill_reused_tokens: int | None = None  # the prefill worker's (remote path)

    def mark_upstream(self) -> None:
        if self.first_upstream_at is None:
            self.first_upstream_at = time.monotonic()

    @property
    def rejected_placement(self) -> dict[str, Any] | None:
        """The SLO placement's runner-up (placement.py Prediction.as_detail), None under Thresholds."""
        got = self.runner_up.get() if self.runner_up is not None else None
        return got.as_detail() if got is not None else None


@dataclass(frozen=True)
class ParsedRequest:
    body: dict[str, Any]
    stream: bool
    view: features.PromptView
    max_tokens: int | None


def parse_request(raw: bytes, endpoint: str, served_model: str) -> ParsedRequest:
    """Validate a completions / chat completions body; raises features.BadRequestError."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise features.BadRequestError(f"invalid JSON body: {e}") from None
    if not isinstance(body, dict):
        raise features.BadRequestError("request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise features.BadRequestError("'model' must be a string", "model")
    if served_model and model is not None and model != served_model:
        raise features.BadRequestError(f"The model `{model}` does not exist.", "model", 404, "NotFoundError")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise features.BadRequestError("'stream' must be a boolean", "stream")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise features.BadRequestError("'stream_options' must be an object", "stream_options")
    view = features.prompt_view(endpoint, body)
    return ParsedRequest(body, stream, view, features.requested_max_tokens(body))


def fwd_headers(request: web.Request, request_id: str | None) -> dict[str, str]:
    """Headers for an upstream leg: the client's hop headers, our request id, JSON."""
    h = {k: v for k, v in request.headers.items() if k.lower() in HOP_HEADERS}
    if request_id:
        h["X-Request-Id"] = request_id
    h["Content-Type"] = "application/json"
    return h


def decision_headers(ctx: Ctx) -> dict[str, str]:
    """Response headers telling the client which path served it and why (debugging, demo, benchmarks)."""
    return {"X-Request-Id": ctx.request_id, "X-Disagg-Decision": ctx.decision, "X-Disagg-Reason": ctx.reason,
            "X-Disagg-Path": ctx.path}
