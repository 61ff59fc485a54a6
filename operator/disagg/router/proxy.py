"""Upstream legs of the vLLM NixlConnector proxy protocol, and the minimal stream accounting.

Prefill leg (``prefill_body``): the client's body with max_tokens=1 (and max_completion_tokens=1 when present),
stream=false, stream_options removed, min_tokens / min_completion_tokens removed, and
kv_transfer_params = {do_remote_decode: true, do_remote_prefill: false, remote_*: null}.
Decode leg (``decode_body``): the client's body, unchanged, plus the prefill response's kv_transfer_params verbatim.
"""

from __future__ import annotations

import re
import time
from typing import Any

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
                 worker: str | None = None):
        super().__init__(f"{cause} ({status})" if status else cause)
        self.cause = cause
        self.status = status
        self.body = body
        self.content_type = content_type
        self.worker = worker


_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


class StreamAccount:
    """Counts SSE events as they are relayed (no JSON parsing): first/last event times and token count.

    Tokens = data events except ``[DONE]``, less the chat role-only first event, unless the stream carries
    ``usage.completion_tokens`` (stream_options.include_usage), which then wins.
    """

    __slots__ = ("_tail", "chat", "done", "events", "first_at", "last_at", "usage_tokens")

    def __init__(self, chat: bool) -> None:
        self.events = 0
        self.done = False
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.usage_tokens: int | None = None
        self._tail = b""
        self.chat = chat

    def feed(self, chunk: bytes, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        data = self._tail + chunk
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
            if b'"usage"' in data:
                m = None
                for m in _COMPLETION_TOKENS.finditer(data):
                    pass
                if m is not None:
                    self.usage_tokens = int(m.group(1))
        self._tail = data[-5:]
        # avoid double counting a "data:" that straddles the tail: drop it from the tail if complete in `data`
        if self._tail.endswith(b"data:"):
            self._tail = b""

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


def usage_completion_tokens(payload: bytes) -> int | None:
    m = None
    for m in _COMPLETION_TOKENS.finditer(payload):
        pass
    return int(m.group(1)) if m is not None else None
