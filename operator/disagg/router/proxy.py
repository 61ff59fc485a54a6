"""Upstream legs of the vLLM NixlConnector proxy protocol, the minimal stream accounting, and error shapes.

Prefill leg (``prefill_body``): the client's body with max_tokens=1 (and max_completion_tokens=1 when present),
stream=false, stream_options removed, min_tokens / min_completion_tokens removed, and
kv_transfer_params = {do_remote_decode: true, do_remote_prefill: false, remote_*: null}.
Decode leg (``decode_body``): the client's body, unchanged, plus the prefill response's kv_transfer_params verbatim.
"""

from __future__ import annotations

import re
import time
from typing import Any

import orjson

PREFILL_KV_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    out = dict(body)
    out["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)
    out["stream"] = False
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out.pop("stream_options", None)
    out.pop("min_tokens", None)
    out.pop("min_completion_tokens", None)
    return out


def decode_body(body: dict[str, Any], kv_transfer_params: Any) -> dict[str, Any]:
    out = dict(body)
    out["kv_transfer_params"] = kv_transfer_params
    return out


def local_body(body: dict[str, Any]) -> dict[str, Any]:
    """A local (aggregated) request: the client's body; client-supplied kv_transfer_params are not honoured."""
    if "kv_transfer_params" not in body:
        return body
    out = dict(body)
    out.pop("kv_transfer_params")
    return out


class UpstreamError(Exception):
    """An upstream leg failed before anything reached the client (so it may be retried or fall back)."""

    def __init__(self, cause: str, status: int | None = None, body: bytes = b"", content_type: str | None = None,
                 worker: str | None = None) -> None:
        super().__init__(f"{cause} ({status})" if status else cause)
        self.cause = cause
        self.status = status
        self.body = body
        self.content_type = content_type
        self.worker = worker


_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
# usage.prompt_tokens: the prompt as the engine counted it (UsageInfo, vllm/entrypoints/serve/engine/protocol.py,
# 0.33.0); the closing quote keeps prompt_tokens_details out
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
# usage.prompt_tokens_details.cached_tokens: the prompt tokens the engine served from its prefix cache, reported
# with vLLM's --enable-prompt-tokens-details (PromptTokenUsageInfo, vllm/entrypoints/serve/engine/protocol.py and
# the flag in vllm/entrypoints/common/cli_args.py, 0.33.0)
_CACHED_TOKENS = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')

# Errors inside a 200 response. vLLM 0.33.0 (vllm/entrypoints/openai/chat_completion/serving.py:947-950,
# completion/serving.py:552-553, generate/base/serving.py:183-213) ends a stream whose request finished with reason
# "error" (e.g. a failed KV pull under kv_load_failure_policy "fail") with ``data: {"error": {...}}`` then
# ``data: [DONE]``: compact JSON on chat, json.dumps (", " / ": ") on completions; chat streams send the role chunk
# first. Older releases and our simulator may also send a choice with ``finish_reason: "error"``: both count.
_STREAM_ERROR = re.compile(rb'data:\s*\{\s*"error"|"finish_reason"\s*:\s*"error"')
# vLLM's non-streamed GenerationError (vllm/exceptions.py:131-136, serve/exception_handling/handlers/vllm_error.py:
# 69-77 in 0.33.0): HTTP 500, type InternalServerError, the fixed message "Internal server error". On a remote
# decode leg this is the KV load failing (the only request-level error before the first token there).
GENERATION_ERROR_MESSAGE = "Internal server error"
_HOLD_LIMIT = 64 * 1024  # leading token-less events held back at most this many bytes


def is_generation_error(status: int | None, body: bytes) -> bool:
    if status != 500 or b"InternalServerError" not in body:
        return False
    try:
        err = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return False
    return isinstance(err, dict) and err.get("message") == GENERATION_ERROR_MESSAGE


def has_error_finish(payload: bytes) -> bool:
    """A non-streamed 200 body that is an error object or carries a choice with finish_reason "error"."""
    if b'"error"' not in payload:
        return False
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(obj, dict):
        return False
    if obj.get("error") is not None:
        return True
    choices = obj.get("choices")
    return isinstance(choices, list) and any(isinstance(c, dict) and c.get("finish_reason") == "error"
                                             for c in choices)


HOLD, COMMIT, ERROR = "hold", "commit", "error"


def _classify_event(payload: bytes) -> str:
    """One SSE data payload before the first token: HOLD (no token: the chat role chunk, a comment),
    ERROR (an error object or finish_reason "error"), or COMMIT (a token, a normal finish, anything else)."""
    if payload == b"[DONE]":
        return COMMIT
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return COMMIT
    if not isinstance(obj, dict):
        return COMMIT
    if obj.get("error") is not None:
        return ERROR
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices:
        return HOLD if isinstance(choices, list) else COMMIT  # [] (a usage chunk): no token
    for c in choices:
        if not isinstance(c, dict):
            return COMMIT
        fr = c.get("finish_reason")
        if fr == "error":
            return ERROR
        if fr is not None or c.get("text"):
            return COMMIT
        delta = c.get("delta")
        if isinstance(delta, dict) and any(v for k, v in delta.items() if k != "role"):
            return COMMIT
    return HOLD


class StreamStart:
    """Holds a stream's leading events until one carries a token (commit) or an error (the leg failed).

    Only the first few events are parsed (JSON); once committed, the relay stops using this.
    """

    __slots__ = ("_pos", "buf")

    def __init__(self) -> None:
        self.buf = b""
        self._pos = 0  # start of the first event not yet classified

    def feed(self, chunk: bytes) -> str:
        self.buf += chunk
        buf = self.buf
        while True:
            end = buf.find(b"\n\n", self._pos)
            if end < 0:
                break
            event, self._pos = buf[self._pos:end], end + 2
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    verdict = _classify_event(line[5:].strip())
                    if verdict != HOLD:
                        return verdict
        return COMMIT if len(buf) > _HOLD_LIMIT else HOLD


class StreamAccount:
    """Counts SSE events as they are relayed (no JSON parsing): first/last event times and token count.

    Tokens = data events except ``[DONE]``, less the chat role-only first event, unless the stream carries
    ``usage.completion_tokens`` (stream_options.include_usage), which then wins.
    """

    __slots__ = ("_etail", "_tail", "cached_tokens", "chat", "done", "error", "events", "first_at", "last_at",
                 "prompt_tokens", "usage_tokens")

    def __init__(self, chat: bool) -> None:
        self.events = 0
        self.done = False
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.usage_tokens: int | None = None
        self.cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, when reported
        self.prompt_tokens: int | None = None  # usage.prompt_tokens, when reported
        self._tail = b""
        self._etail = b""
        self.error = False  # an error event or finish_reason "error" was relayed
        self.chat = chat

    def feed(self, chunk: bytes, now: float | None = None) -> None:
        """Account one relayed chunk. O(len(chunk)); no copy of the chunk in the common case (vLLM sends whole
        events: a chunk that ends with a newline leaves nothing that a later chunk could complete)."""
        if now is None:
            now = time.monotonic()
        tail = self._tail
        data = tail + chunk if tail else chunk
        if not self.error:
            # A new match ends in this chunk with the literal '"error"': in the chunk, or across the boundary.
            etail = self._etail
            if (b'"error"' in chunk or (etail and b'"error"' in etail[-6:] + chunk[:6])) and \
                    _STREAM_ERROR.search(etail + chunk):
                self.error = True
            self._etail = chunk[-32:] if len(chunk) >= 32 else (etail + chunk)[-32:]
        n = data.count(b"data:")
        if n:
            if b"[DONE]" in data:
                self.done = True
                n -= data.count(b"data: [DONE]") + data.count(b"data:[DONE]")
            if n > 0:
                if self.first_at is None:
                    self.first_at = now
                self.last_at = now
                self.events += n
            if b'"usage"' in data and (n_usage := usage_completion_tokens(data)) is not None:
                self.usage_tokens = n_usage
                self.cached_tokens = usage_cached_tokens(data)
                self.prompt_tokens = usage_prompt_tokens(data)
        # What a later chunk could complete ("data:", "[DONE]", a usage field): nothing after a newline (none of
        # them contains one); else the last 5 bytes, less a "data:" already counted here.
        if data[-1:] == b"\n":
            self._tail = b""
        else:
            tail = data[-5:]
            self._tail = b"" if tail.endswith(b"data:") else tail

    @property
    def tokens(self) -> int:
        if self.usage_tokens is not None:
            return self.usage_tokens
        n = self.events - (1 if self.chat and self.events > 1 else 0)
        return max(n, 0)

    def tpot(self) -> float | None:
        n = self.tokens
        if self.first_at is None or self.last_at is None or n < 2:
            return None
        return (self.last_at - self.first_at) / (n - 1)


def usage_cached_tokens(payload: bytes) -> int | None:
    found = _CACHED_TOKENS.findall(payload)
    return int(found[-1]) if found else None


def usage_prompt_tokens(payload: bytes) -> int | None:
    found = _PROMPT_TOKENS.findall(payload)
    return int(found[-1]) if found else None


def usage_completion_tokens(payload: bytes) -> int | None:
    found = _COMPLETION_TOKENS.findall(payload)
    return int(found[-1]) if found else None
