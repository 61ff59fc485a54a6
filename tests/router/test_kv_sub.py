"""The router's KV event subscription over real ZMQ sockets on 127.0.0.1 (issue 30): the simulator's publisher
(vLLM's PUB + replay ROUTER protocol) and the router's subscriber in one event loop — gap recovery through the
replay socket, a restarted publisher clearing the worker's entries, a worker going away."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import zmq

from disagg.local.procs import free_port
from disagg.router.kvindex import KVIndex
from disagg.router.kvsub import KVSubscriber, kv_endpoints
from disagg.router.metrics import RouterMetrics
from disagg.sim import kvevents as sim_events

WORKER = "http://10.0.0.1:8000"


def _stored(hashes: list[bytes], parent: bytes | None, ids: list[int]) -> dict[str, object]:
    return sim_events.block_stored(hashes, parent, ids, 4)


def _counter(m: RouterMetrics, name: str, **labels: str) -> float:
    v = m.registry.get_sample_value(name, labels)
    return v or 0.0


def _sent(pub: sim_events.ZmqPublisher, n: int) -> Callable[[], bool]:
    return lambda: pub.sent == n


async def _until(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _publisher(pub: int, replay: int | None) -> sim_events.ZmqPublisher:
    cfg = sim_events.KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=f"tcp://127.0.0.1:{pub}",
                                    replay_endpoint=f"tcp://127.0.0.1:{replay}" if replay else None, topic="kv")
    return sim_events.ZmqPublisher(cfg)


async def _rebind(pub: int, replay: int) -> sim_events.ZmqPublisher:
    """A new publisher on the endpoints a closed one had (ZMQ releases a closed socket's port asynchronously)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    while True:
        try:
            return _publisher(pub, replay)
        except zmq.ZMQError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.05)


@pytest.fixture
def ports() -> tuple[int, int]:
    return free_port(), free_port()


async def test_a_late_subscriber_fills_the_gap_from_the_replay_socket(ports: tuple[int, int]) -> None:
    pub_port, replay_port = ports
    pub = _publisher(pub_port, replay_port)
    idx, m = KVIndex(), RouterMetrics()
    ids = list(range(40))
    try:
        # batches 0..4 go out before anyone listens (PUB drops them): the subscriber's first live batch is a gap
        for i in range(5):
            pub.publish(sim_events.encode_batch(0.0, [_stored([bytes([i])], bytes([i - 1]) if i else None,
                                                              ids[i * 4:(i + 1) * 4])]))
        await _until(_sent(pub, 5), "the first batches sent")
        eps = kv_endpoints(0, 0, [f"{WORKER}=tcp://127.0.0.1:{pub_port},tcp://127.0.0.1:{replay_port}"])
        assert eps is not None
        sub = KVSubscriber(idx, m, eps, topic="kv")
        sub.sync([WORKER])
        # ZMQ's slow joiner: keep publishing the next block until the subscriber has it
        i = 5
        while not idx.match(ids).get(WORKER, 0) >= 24:
            pub.publish(sim_events.encode_batch(0.0, [_stored([bytes([i])], bytes([i - 1]), ids[i * 4:(i + 1) * 4])]))
            i += 1
            await _until(_sent(pub, i), "sent")
            await asyncio.sleep(0.02)
            assert i < 10, "the subscriber never caught up"
        assert idx.match(ids)[WORKER] == 4 * i  # every block, those before it connected included
        assert _counter(m, "disagg_kv_event_gaps_total", outcome="recovered") == 1
        assert _counter(m, "disagg_kv_event_gaps_total", outcome="reset") == 0
        assert _counter(m, "disagg_kv_index_blocks", worker=WORKER) == i

        # the worker restarts (a new publisher on the same endpoints counts from 0): its old entries go
        pub.close()
        pub = await _rebind(pub_port, replay_port)
        other = list(range(1000, 1008))
        for j in range(20):
            pub.publish(sim_events.encode_batch(0.0, [_stored([b"n%d" % j], None, other[:4])]))
            await asyncio.sleep(0.05)
            if _counter(m, "disagg_kv_event_gaps_total", outcome="restart"):
                break
        await _until(lambda: idx.match(other).get(WORKER) == 4, "the restarted worker's block")
        assert idx.match(ids) == {}
        assert _counter(m, "disagg_kv_event_gaps_total", outcome="restart") == 1

        # the worker goes away: its entries and its gauge go with it
        sub.sync([])
        assert idx.match(other) == {} and not idx.publishing(WORKER)
        assert m.registry.get_sample_value("disagg_kv_index_blocks", {"worker": WORKER}) is None
        await sub.close()
    finally:
        pub.close()


async def test_without_a_replay_socket_a_gap_resets_the_worker(ports: tuple[int, int]) -> None:
    pub_port, _ = ports
    pub = _publisher(pub_port, None)
    idx, m = KVIndex(), RouterMetrics()
    eps = kv_endpoints(0, 0, [f"{WORKER}=tcp://127.0.0.1:{pub_port}"])
    assert eps is not None
    sub = KVSubscriber(idx, m, eps)
    try:
        pub.publish(sim_events.encode_batch(0.0, [_stored([b"lost"], None, [1, 2, 3, 4])]))
        await _until(lambda: pub.sent == 1, "sent")
        sub.sync([WORKER])
        ids = [5, 6, 7, 8]
        for j in range(40):  # until the subscriber is connected and has one
            pub.publish(sim_events.encode_batch(0.0, [_stored([b"b%d" % j], None, ids)] if j == 0 else []))
            await asyncio.sleep(0.05)
            if idx.publishing(WORKER):
                break
        assert idx.publishing(WORKER)
        # the lost first batch stays unknown; the stream is followed from where the subscriber joined
        assert _counter(m, "disagg_kv_event_gaps_total", outcome="reset") == 1
        assert idx.match([1, 2, 3, 4]) == {}
        await sub.close()
    finally:
        pub.close()
