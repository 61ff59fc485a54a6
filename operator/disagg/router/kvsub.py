"""The router's subscription to every ready worker's KV cache events (issue 30): ZMQ SUB → kvindex.KVIndex.

One asyncio task per worker (``sync`` starts and stops them as workers come and go; a worker that goes away has
its entries dropped). Each task follows the worker's PUB socket (vLLM's ``ZmqEventPublisher``: kvevents.py has
the format) and keeps the sequence numbers in order (kvevents.SeqTracker):

* a gap (batches lost: PUB drops past its high-water mark; a subscriber that connects late misses what came
  before) is filled from the worker's replay socket (a DEALER asks its ROUTER from the first missing number) —
  ``disagg_kv_event_gaps_total{outcome="recovered"}``; when the replay cannot fill it (no replay endpoint, the
  buffer no longer holds those steps, no answer within ``replay_timeout``) the worker's entries are dropped and
  the stream is followed from there (``reset``): stale entries would send requests to a cache that is gone;
* a sequence that goes back (the engine restarted: vLLM counts from 0 per publisher) drops the worker's entries
  (``restart``): a restarted engine's cache is empty.

What each worker publishes on: ``endpoints(url)`` → (PUB endpoint, replay endpoint or None), or None for a worker
not followed: by default the worker's host with the ports the operator renders into ``--kv-events-config``
(builders/vllm.py ``KV_EVENTS_PORT``, ``KV_EVENTS_REPLAY_PORT``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

import zmq
import zmq.asyncio

from .. import logs
from .kvevents import END_SEQ, DecodeError, SeqTracker, decode_payload, decode_seq, replay_request
from .kvindex import Applied, KVIndex
from .metrics import RouterMetrics

log = logs.get("disagg.router.kvsub")

Endpoints = Callable[[str], "tuple[str, str | None] | None"]


def endpoints_from_ports(pub_port: int, replay_port: int | None) -> Endpoints:
    """Each worker's events at its own host: ``tcp://<host>:<pub_port>`` (and the replay port)."""

    def of(url: str) -> tuple[str, str | None] | None:
        host = urlsplit(url).hostname
        if not host or pub_port <= 0:
            return None
        h = f"[{host}]" if ":" in host else host
        return f"tcp://{h}:{pub_port}", (f"tcp://{h}:{replay_port}" if replay_port else None)

    return of


def parse_endpoint_arg(value: str) -> tuple[str, tuple[str, str | None]]:
    """``URL=tcp://host:pub[,tcp://host:replay]`` (``--kv-events-endpoint``)."""
    url, sep, rest = value.partition("=")
    if not sep or not rest.startswith("tcp://"):
        raise ValueError(f"expected URL=tcp://host:port[,tcp://host:replay-port], got {value!r}")
    pub, _, replay = rest.partition(",")
    return url.strip().rstrip("/"), (pub, replay or None)


def kv_endpoints(port: int, replay_port: int, overrides: Iterable[str] = ()) -> Endpoints | None:
    """The router's flags → ``endpoints``: explicit ``URL=…`` first, else the worker's host at ``port``; None
    when both are off."""
    explicit = dict(parse_endpoint_arg(v) for v in overrides)
    by_port = endpoints_from_ports(port, replay_port or None) if port > 0 else None
    if not explicit and by_port is None:
        return None

    def of(url: str) -> tuple[str, str | None] | None:
        ep = explicit.get(url.rstrip("/"))
        if ep is not None:
            return ep
        return by_port(url) if by_port is not None else None

    return of


class KVSubscriber:
    def __init__(self, index: KVIndex, metrics: RouterMetrics, endpoints: Endpoints, topic: str = "",
                 clock: Callable[[], float] = time.time, replay_timeout: float = 2.0) -> None:
        self.index = index
        self.metrics = metrics
        self.endpoints = endpoints
        self.topic = topic.encode()
        self.clock = clock  # the batches' timestamps are the engine's time.time()
        self.replay_timeout = replay_timeout
        self._ctx = zmq.asyncio.Context()
        self._tasks: dict[str, asyncio.Task[None]] = {}

    # ------------------------------------------------------------------------------------ workers
    def sync(self, urls: Iterable[str]) -> None:
        """Follow exactly these workers: new ones subscribed, gone ones cancelled and dropped from the index."""
        want: dict[str, tuple[str, str | None]] = {}
        for u in urls:
            ep = self.endpoints(u)
            if ep is not None:
                want[u] = ep
        for u in list(self._tasks):
            if u not in want:
                self._tasks.pop(u).cancel()
                self.index.forget(u)
                with contextlib.suppress(KeyError):
                    self.metrics.kv_index_blocks.remove(u)
        for u, (pub, replay) in want.items():
            if u not in self._tasks:
                self._tasks[u] = asyncio.create_task(self._follow(u, pub, replay), name=f"kv-events {u}")

    async def run(self, urls: Callable[[], Iterable[str]], interval: float = 1.0) -> None:
        """Keep following the workers ``urls()`` names (the WorkerSet's, as discovery updates it)."""
        while True:
            self.sync(urls())
            await asyncio.sleep(interval)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        self._ctx.destroy(linger=0)

    # ------------------------------------------------------------------------------------ one worker
    def _apply(self, url: str, tracker: SeqTracker, seq: int, payload: bytes) -> None:
        try:
            batch = decode_payload(payload)
        except DecodeError as e:
            log.warning("kv_event_undecodable", worker=url, seq=seq, error=str(e))
            tracker.applied(seq)
            return
        self.record(url, self.index.apply(url, batch), batch.ts)
        tracker.applied(seq)

    def record(self, url: str, a: Applied, ts: float) -> None:
        m = self.metrics
        for name, n in (("stored", a.stored), ("removed", a.removed), ("cleared", a.cleared),
                        ("orphan", a.orphans), ("skipped", a.skipped)):
            if n:
                m.kv_events.labels(name).inc(n)
        m.kv_event_lag.observe(max(0.0, self.clock() - ts))
        m.kv_index_blocks.labels(url).set(self.index.blocks(url))

    async def _follow(self, url: str, pub: str, replay: str | None) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        sub.connect(pub)
        tracker = SeqTracker()
        try:
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3:
                    continue
                try:
                    seq = decode_seq(frames[1])
                except DecodeError:
                    continue
                kind = tracker.classify(seq)
                if kind == "duplicate":
                    continue
                if kind == "restart":
                    self.index.clear(url)
                    self.metrics.kv_event_gaps.labels("restart").inc()
                    log.info("kv_events_restart", worker=url, seq=seq, last=tracker.last)
                    tracker = SeqTracker()
                    kind = tracker.classify(seq)
                if kind == "gap":
                    recovered = replay is not None and await self._replay(url, replay, tracker, seq)
                    if tracker.expected > seq:  # the replay covered this one too
                        self.metrics.kv_event_gaps.labels("recovered").inc()
                        continue
                    if recovered and tracker.expected == seq:
                        self.metrics.kv_event_gaps.labels("recovered").inc()
                    else:
                        # what was lost stays unknown: without the removals the index would claim blocks that are
                        # gone, so the worker starts over from this batch
                        if tracker.last is not None:
                            self.index.clear(url)
                        self.metrics.kv_event_gaps.labels("reset").inc()
                        log.warning("kv_events_gap_unrecovered", worker=url, expected=tracker.expected, got=seq)
                        tracker.last = seq - 1
                self._apply(url, tracker, seq, frames[2])
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - one worker's stream must not take the router down
            log.warning("kv_events_error", worker=url, error=str(e))
        finally:
            sub.close(linger=0)

    async def _replay(self, url: str, endpoint: str, tracker: SeqTracker, live_seq: int) -> bool:
        """Ask the worker's replay socket for every batch from ``tracker.expected``; apply them in order. True
        when the replay ended with its end marker (whether or not its buffer still held the missing steps)."""
        tracker.replaying(live_seq)
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(endpoint)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.replay_timeout
        try:
            await dealer.send_multipart(replay_request(tracker.expected))
            while True:
                left = deadline - loop.time()
                if left <= 0 or not await dealer.poll(int(left * 1000)):
                    log.warning("kv_events_replay_timeout", worker=url, endpoint=endpoint)
                    return False
                frames = await dealer.recv_multipart()
                if len(frames) != 4:
                    continue
                _, _, seq_b, payload = frames
                if seq_b == END_SEQ:
                    return True
                seq = decode_seq(seq_b)
                if tracker.wanted(seq):
                    self._apply(url, tracker, seq, payload)
        finally:
            dealer.close(linger=0)
