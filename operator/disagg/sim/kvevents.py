"""The simulated engine's KV cache events, in vLLM's wire format (issue 30).

What vLLM publishes with ``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'``
(``vllm/distributed/kv_events.py``, 0.33.0 and 0.32.0; ``vllm/config/kv_events.py`` for the config's fields and
defaults): per engine step one batch ``[ts, [events], data_parallel_rank]`` (msgpack; events as maps tagged
``"type"``: ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``, with the fields vLLM always writes and none
of those it omits at their defaults), sent on a PUB socket as ``(topic, seq as 8 bytes big-endian, payload)`` and
kept for replay on a ROUTER socket (a request ``[client, b"", start as 8 bytes]`` is answered by every buffered
batch from ``start`` and the end marker ``(client, b"", b"", -1 as 8 signed bytes, b"")``).

:func:`encode_batch` builds the structure (the twin hands it to an in-process sink without the bytes);
:class:`ZmqPublisher` sends it over ZMQ from a thread, as vLLM's ``ZmqEventPublisher`` does.
"""

from __future__ import annotations

import json
import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)
MEDIUM_GPU = "GPU"


def block_stored(hashes: Sequence[bytes], parent: bytes | None, token_ids: Sequence[int], block_size: int
                 ) -> dict[str, Any]:
    """vLLM's ``BlockStored`` as msgspec encodes it: required fields always, defaulted ones omitted."""
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent,
            "token_ids": list(token_ids), "block_size": block_size, "lora_id": None, "medium": MEDIUM_GPU,
            "lora_name": None}


def block_removed(hashes: Sequence[bytes]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": MEDIUM_GPU}


def all_blocks_cleared() -> dict[str, Any]:
    return {"type": "AllBlocksCleared"}


def encode_batch(ts: float, events: list[dict[str, Any]], dp_rank: int = 0) -> list[Any]:
    return [ts, events, dp_rank]


def pack(batch: list[Any]) -> bytes:
    return msgpack.packb(batch, use_bin_type=True)


@dataclass(frozen=True)
class KVEventsConfig:
    """The fields of vLLM's ``KVEventsConfig`` the simulator reads (``vllm/config/kv_events.py``, 0.33.0)."""

    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    topic: str = ""

    @property
    def publishes(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @classmethod
    def parse(cls, text: str) -> KVEventsConfig:
        """``--kv-events-config`` JSON; unknown keys refused, as vLLM's config dataclass refuses them."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("--kv-events-config must be a JSON object")
        known = {f for f in cls.__dataclass_fields__}
        known.add("max_queue_size")
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"--kv-events-config: unknown keys {sorted(unknown)}")
        raw.pop("max_queue_size", None)
        if raw.get("publisher") is None:  # vLLM 0.33.0 __post_init__: "zmq" when enabled, else "null"
            raw["publisher"] = "zmq" if raw.get("enable_kv_cache_events") else "null"
        if raw["publisher"] not in ("null", "zmq"):
            raise ValueError(f"--kv-events-config: unknown publisher {raw['publisher']!r}")
        return cls(**raw)


def offset_endpoint(endpoint: str | None, rank: int) -> str | None:
    """vLLM's ``ZmqEventPublisher.offset_endpoint_port``: data-parallel rank r publishes on the port + r."""
    if not endpoint or rank == 0:
        return endpoint
    base, _, port = endpoint.rpartition(":")
    return endpoint if int(port) == 0 else f"{base}:{int(port) + rank}"


class ZmqPublisher:
    """PUB + replay ROUTER, served by one thread (sockets are not thread-safe): batches are queued by
    :meth:`publish` and sent in order with consecutive sequence numbers from 0."""

    def __init__(self, cfg: KVEventsConfig, dp_rank: int = 0, on_error: Callable[[Exception], None] | None = None
                 ) -> None:
        self.cfg = cfg
        self.dp_rank = dp_rank
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(cfg.hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self.endpoint = offset_endpoint(cfg.endpoint, dp_rank) or cfg.endpoint
        self._pub.bind(self.endpoint)
        self._replay: zmq.Socket[bytes] | None = None
        self.replay_endpoint = offset_endpoint(cfg.replay_endpoint, dp_rank)
        if self.replay_endpoint:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.SNDHWM, 2 * (cfg.buffer_steps + 1))
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(self.replay_endpoint)
        self._topic = cfg.topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=cfg.buffer_steps)
        self._queue: queue.Queue[list[Any] | None] = queue.Queue()
        self._seq = 0
        self._on_error = on_error
        self.sent = 0
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def publish(self, batch: list[Any]) -> None:
        self._queue.put(batch)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=2.0)
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def _run(self) -> None:
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                batch = self._queue.get(timeout=0.02)
            except queue.Empty:
                continue
            if batch is None:
                return
            try:
                payload = pack(batch)
                seq = self._seq
                self._seq += 1
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
                self._buffer.append((seq, payload))
                self.sent += 1
            except Exception as e:  # noqa: BLE001 - a publisher fault must not stop the engine
                if self._on_error is not None:
                    self._on_error(e)

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            return
        client, _, start_bytes = frames
        start = int.from_bytes(start_bytes, "big")
        for seq, payload in list(self._buffer):
            if seq >= start:
                self._replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))
