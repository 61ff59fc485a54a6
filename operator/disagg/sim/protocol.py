"""vLLM's OpenAI-compatible protocol as the simulator speaks it (server.py serves it over HTTP, the twin's engine legs
in process): the request body read and checked (model, prompts, lengths, ``max_tokens``, the priority header, the
prefill/decode ``kv_transfer_params``), and the error and event shapes vLLM answers with. Shapes follow
vllm/entrypoints/openai/protocol.py; each constant cites the vLLM source it copies."""

from __future__ import annotations

import json
from typing import Any

import orjson
from aiohttp import web

from . import tokenizer
from .config import SimConfig


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


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json", headers=headers)


def sse_event(data: Any) -> bytes:
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
        return sse_event(body)
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


def int_param(body: dict[str, Any], name: str, minimum: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(f"{name} must be an integer, got {v!r}", param=name)
    if minimum is not None and v < minimum:
        raise ApiError(f"{name} must be at least {minimum}, got {v}.", param=name)
    return v


async def read_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ApiError(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError("request body must be a JSON object")
    return body


def check_model(cfg: SimConfig, body: dict[str, Any]) -> str:
    model = body.get("model")
    if model is None:
        return cfg.served_model_name
    if not isinstance(model, str) or model not in cfg.served_model_names:
        raise ApiError(f"The model `{model}` does not exist.", 404, "NotFoundError", "model")
    return model


def prompt_ids(body: dict[str, Any], vocab: int) -> list[list[int]]:
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


def output_plan(cfg: SimConfig, n_prompt: int, max_tokens: int | None) -> tuple[int, str]:
    """How many tokens to generate and the finish reason: max_tokens → length; unset → the sim's EOS (stop)."""
    if max_tokens is not None:
        return max_tokens, "length"
    room = cfg.max_model_len - n_prompt
    if cfg.output_tokens >= room:
        return room, "length"
    return cfg.output_tokens, "stop"


def kv_params(body: dict[str, Any]) -> dict[str, Any] | None:
    p = body.get("kv_transfer_params")
    if p is None:
        return None
    if not isinstance(p, dict):
        raise ApiError("kv_transfer_params must be an object", param="kv_transfer_params")
    return p


# ------------------------------------------------------------------------------------------ handlers
