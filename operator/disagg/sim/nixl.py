"""The simulated NIXL side channel: a real loopback/TCP exchange between a decode and a prefill sim.

vLLM's NixlConnector (pull model) has the decode engine (1) handshake with the prefill engine's side
channel at ``remote_host:remote_port`` (VLLM_NIXL_SIDE_CHANNEL_HOST/PORT) — NIXL refuses agents whose
layout differs — (2) READ the prompt's blocks ``remote_block_ids``, (3) send a notification naming the
request so the prefill engine frees the blocks. Here each step is a framed message over TCP:

    frame  = 4-byte big-endian length + JSON header [+ payload bytes announced by the header]
    client → {"op": "handshake", "compat": ..., "engine_id": ..., "tp_size": n}
    server ← {"ok": true, "engine_id": ..., "compat": ...} | {"ok": false, "error": ...}
    client → {"op": "read", "request_id": ..., "block_ids": [...], "remote_engine_id": ...}
    server ← {"ok": true, "tokens": n, "kv_bytes": b, "payload": p} + p bytes | {"ok": false, "error": ...}
    client → {"op": "notif", "request_id": ...}          (after the modelled transfer time)
    server ← {"ok": true}

The payload really crosses the socket (``kv_bytes × --kv-payload-scale`` bytes, capped), while the
*simulated* duration is bytes ÷ transport bandwidth from the perf model.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

MAX_PAYLOAD = 64 * 1024 * 1024
_CHUNK = 1 << 20
_ZEROS = bytes(_CHUNK)


def block_ids(params: dict[str, Any]) -> list[int]:
    """The blocks to read, from kv_transfer_params' remote_block_ids: one list per KV-cache group in vLLM
    (``[[1, 2, 3]]`` from a real 0.32.0 engine; pull_scheduler.py 0.33.0 line 281), one group in the sim; a flat
    list (the sim before it matched the real shape) is taken as that one group."""
    raw = params.get("remote_block_ids") or []
    if raw and isinstance(raw[0], list):
        return [int(b) for b in raw[0]]
    return [int(b) for b in raw]


def compat_hash(vllm_version: str, model: str, block_size: int, kv_cache_dtype: str, layers: int, kv_heads: int,
                head_dim: int) -> str:
    """What NIXL compares at handshake (version, attention layout, block size/len): equal → compatible."""
    text = f"vllm={vllm_version};model={model};block={block_size};kvdtype={kv_cache_dtype};layers={layers};" \
           f"kvheads={kv_heads};headdim={head_dim};layout=HND"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


async def _send(writer: asyncio.StreamWriter, header: dict[str, Any], payload_len: int = 0) -> None:
    body = orjson.dumps(header)
    writer.write(struct.pack(">I", len(body)) + body)
    left = payload_len
    while left > 0:
        n = min(left, _CHUNK)
        writer.write(_ZEROS[:n])
        left -= n
        await writer.drain()
    await writer.drain()


async def _recv(reader: asyncio.StreamReader) -> dict[str, Any]:
    (n,) = struct.unpack(">I", await reader.readexactly(4))
    if n > 1 << 20:
        raise ValueError("side-channel header too large")
    msg = orjson.loads(await reader.readexactly(n))
    if not isinstance(msg, dict):
        raise ValueError("side-channel header is not a JSON object")
    return msg


class SideChannelServer:
    """Prefill side: serves handshakes, reads of held blocks and free notifications."""

    def __init__(self, *, engine_id: str, compat: str, tp_size: int,
                 read: Callable[[str, list[int]], tuple[bool, str, int, float]],
                 release: Callable[[str], bool], payload_scale: float) -> None:
        self.engine_id, self.compat, self.tp_size = engine_id, compat, tp_size
        self._read, self._release = read, release
        self.payload_scale = payload_scale
        self.server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._handle, host, port, reuse_address=True)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    msg = await _recv(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                op = msg.get("op")
                if op == "handshake":
                    if msg.get("compat") != self.compat:
                        await _send(writer, {"ok": False, "error": f"incompatible NIXL agent: remote compat "
                                             f"{msg.get('compat')} != local {self.compat} (engine version, model "
                                             "or KV layout differ)"})
                        return
                    remote_tp = int(msg.get("tp_size") or 1)
                    if remote_tp % self.tp_size:
                        await _send(writer, {"ok": False, "error": f"decode tensor parallel size {remote_tp} is not "
                                             f"divisible by prefill tensor parallel size {self.tp_size}"})
                        return
                    await _send(writer, {"ok": True, "engine_id": self.engine_id, "compat": self.compat})
                elif op == "read":
                    if msg.get("remote_engine_id") not in (None, self.engine_id):
                        await _send(writer, {"ok": False, "error": f"engine id {msg.get('remote_engine_id')} is "
                                             f"not this engine ({self.engine_id})"})
                        continue
                    ok, err, tokens, kv_bytes = self._read(str(msg.get("request_id")), list(msg.get("block_ids")
                                                                                            or []))
                    if not ok:
                        await _send(writer, {"ok": False, "error": err})
                        continue
                    payload = min(MAX_PAYLOAD, int(kv_bytes * self.payload_scale))
                    await _send(writer, {"ok": True, "tokens": tokens, "kv_bytes": kv_bytes, "payload": payload},
                                payload)
                elif op == "notif":
                    freed = self._release(str(msg.get("request_id")))
                    await _send(writer, {"ok": True, "freed": freed})
                else:
                    await _send(writer, {"ok": False, "error": f"unknown op {op!r}"})
        except Exception:  # noqa: BLE001 - a broken peer must not take the server down
            return
        finally:
            writer.close()


@dataclass
class PullOutcome:
    ok: bool
    error: str = ""
    tokens: int = 0
    kv_bytes: float = 0.0
    payload: int = 0


class SideChannelClient:
    """Decode side: opens a connection per pull, handshakes, reads, and later notifies."""

    def __init__(self, *, engine_id: str, compat: str, tp_size: int, timeout_s: float = 10.0) -> None:
        self.engine_id, self.compat, self.tp_size = engine_id, compat, tp_size
        self.timeout_s = timeout_s

    async def pull(self, params: dict[str, Any], request_id: str,
                   wait_modelled: Callable[[PullOutcome], Awaitable[None]]) -> PullOutcome:
        """Handshake + READ; then ``wait_modelled`` (sleeps out the simulated transfer); then notify."""
        host, port = params.get("remote_host"), params.get("remote_port")
        engine = str(params.get("remote_engine_id"))
        if not host or not port:
            return PullOutcome(False, "kv_transfer_params lack remote_host/remote_port")
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), self.timeout_s)
        except (TimeoutError, OSError, ValueError) as e:
            return PullOutcome(False, f"side channel {host}:{port} unreachable: {e}")
        try:
            await _send(writer, {"op": "handshake", "compat": self.compat, "engine_id": self.engine_id,
                                 "tp_size": self.tp_size})
            hs = await asyncio.wait_for(_recv(reader), self.timeout_s)
            if not hs.get("ok"):
                return PullOutcome(False, f"NIXL handshake refused: {hs.get('error')}")
            if hs.get("engine_id") != engine:
                return PullOutcome(False, f"side channel {host}:{port} is engine {hs.get('engine_id')}, "
                                          f"not {engine}")
            await _send(writer, {"op": "read", "request_id": request_id, "remote_engine_id": engine,
                                 "block_ids": block_ids(params)})
            rd = await asyncio.wait_for(_recv(reader), self.timeout_s)
            if not rd.get("ok"):
                return PullOutcome(False, f"NIXL read failed: {rd.get('error')}")
            payload = int(rd.get("payload", 0))
            got = 0
            while got < payload:
                chunk = await asyncio.wait_for(reader.read(min(_CHUNK, payload - got)), self.timeout_s)
                if not chunk:
                    return PullOutcome(False, "side channel closed during transfer")
                got += len(chunk)
            out = PullOutcome(True, "", int(rd.get("tokens", 0)), float(rd.get("kv_bytes", 0.0)), payload)
            await wait_modelled(out)
            await _send(writer, {"op": "notif", "request_id": request_id})
            await asyncio.wait_for(_recv(reader), self.timeout_s)
            return out
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as e:
            return PullOutcome(False, f"side channel error: {e!r}")
        finally:
            writer.close()

    async def notify_only(self, params: dict[str, Any], request_id: str) -> bool:
        """Full local prefix hit: nothing to read, but the prefill engine must still free its blocks."""
        host, port = params.get("remote_host"), params.get("remote_port")
        if port is None:
            return False
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), self.timeout_s)
        except (TimeoutError, OSError, ValueError, TypeError):
            return False
        try:
            await _send(writer, {"op": "notif", "request_id": request_id})
            return bool((await asyncio.wait_for(_recv(reader), self.timeout_s)).get("ok"))
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
            return False
        finally:
            writer.close()
