"""Circuit breakers (router/breaker.py), pure: an injected clock, no sleeps."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from disagg.api.models import CircuitBreakerSpec
from disagg.router.breaker import Breakers, CircuitBreaker, State, decode_target, pair_target


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_opens_after_threshold_consecutive_failures_only() -> None:
    b = CircuitBreaker(threshold=3, cooldown_s=10, half_open_probes=1)
    assert b.failure(0.0) is None
    assert b.failure(0.0) is None
    assert b.success(False, 0.0) is None  # a success in between resets the count
    assert b.failure(1.0) is None
    assert b.failure(1.0) is None
    assert b.failure(2.0) == (State.CLOSED, State.OPEN)
    assert not b.admits(2.0)
    assert b.acquire(11.9) == (False, False, None)


def test_half_open_after_cooldown_then_close_on_success() -> None:
    b = CircuitBreaker(threshold=1, cooldown_s=10, half_open_probes=2)
    b.failure(0.0)
    ok, trial, tr = b.acquire(10.0)
    assert (ok, trial, tr) == (True, True, (State.OPEN, State.HALF_OPEN))
    assert b.acquire(10.0)[:2] == (True, True)
    assert b.acquire(10.0)[:2] == (False, False)  # both half-open slots taken
    assert b.success(True, 10.5) is None
    assert b.state is State.HALF_OPEN
    assert b.success(True, 10.6) == (State.HALF_OPEN, State.CLOSED)
    assert b.admits(10.6)


def test_half_open_failure_reopens_with_a_fresh_cooldown() -> None:
    b = CircuitBreaker(threshold=1, cooldown_s=10, half_open_probes=1)
    b.failure(0.0)
    assert b.acquire(10.0)[:2] == (True, True)
    assert b.failure(12.0) == (State.HALF_OPEN, State.OPEN)
    assert not b.admits(21.9)
    assert b.admits(22.0)


def test_release_frees_a_half_open_slot_without_a_verdict() -> None:
    b = CircuitBreaker(threshold=1, cooldown_s=1, half_open_probes=1)
    b.failure(0.0)
    assert b.acquire(1.0)[:2] == (True, True)
    assert not b.admits(1.0)
    b.release(True)
    assert b.state is State.HALF_OPEN and b.admits(1.0)


def test_success_of_a_request_admitted_before_opening_does_not_close() -> None:
    b = CircuitBreaker(threshold=1, cooldown_s=10, half_open_probes=1)
    b.failure(0.0)
    assert b.success(False, 1.0) is None
    assert b.state is State.OPEN


def _gauge() -> tuple[Gauge, CollectorRegistry]:
    r = CollectorRegistry()
    return Gauge("disagg_circuit_state", "x", ["pool", "worker"], registry=r), r


class Recorder:
    """Stands in for the structlog logger: records (event, fields)."""

    def __init__(self) -> None:
        self.lines: list[dict] = []

    def warning(self, event: str, **kw: object) -> None:
        self.lines.append({"event": event, **kw})


def test_registry_blocks_decode_and_pair_logs_and_exports() -> None:
    clock = Clock()
    g, reg = _gauge()
    rec = Recorder()
    bs = Breakers(g, clock, rec)
    bs.configure(CircuitBreakerSpec(failure_threshold=2, cooldown_seconds=5, half_open_probes=1))
    p, d1, d2 = "http://p:1", "http://d:1", "http://d:2"
    for _ in range(2):
        t = bs.acquire(p, d1)
        assert t is not None
        t.failure("kv_transfer_timeout")
        t.success()  # a second verdict is ignored
    decodes, pairs = bs.blocked()
    assert decodes == {d1} and pairs == {(p, d1)}
    assert bs.acquire(p, d1) is None
    assert bs.acquire(p, d2) is not None  # other targets unaffected
    assert reg.get_sample_value("disagg_circuit_state", {"pool": "decode", "worker": d1}) == 1
    assert reg.get_sample_value("disagg_circuit_state", {"pool": "pair", "worker": f"{p}->{d1}"}) == 1
    assert reg.get_sample_value("disagg_circuit_state", {"pool": "decode", "worker": d2}) == 0
    lines = [x for x in rec.lines if x["event"] == "circuit"]
    assert {(x["pool"], x["from"], x["to"], x["cause"]) for x in lines} == {
        ("decode", "closed", "open", "kv_transfer_timeout"), ("pair", "closed", "open", "kv_transfer_timeout")}
    assert lines[0]["target"] in (d1, f"{p}->{d1}")

    clock.t += 5  # cooldown over: half-open, one trial
    assert bs.blocked() == (frozenset(), frozenset())
    assert reg.get_sample_value("disagg_circuit_state", {"pool": "decode", "worker": d1}) == 2
    t = bs.acquire(p, d1)
    assert t is not None
    assert bs.blocked()[0] == {d1}  # its only trial slot is taken
    t.success()
    assert bs.state(decode_target(d1)) is State.CLOSED and bs.state(pair_target(p, d1)) is State.CLOSED
    assert reg.get_sample_value("disagg_circuit_state", {"pool": "decode", "worker": d1}) == 0


def test_registry_pair_only_failure_leaves_other_pairs_open_for_the_decode() -> None:
    clock = Clock()
    bs = Breakers(None, clock)
    bs.configure(CircuitBreakerSpec(failure_threshold=1, cooldown_seconds=5, half_open_probes=1))
    p1, p2, d = "http://p:1", "http://p:2", "http://d:1"
    t = bs.acquire(p1, d)
    assert t is not None
    bs.get(decode_target(d)).success(False, clock())  # the decode side alone stays closed
    bs.get(pair_target(p1, d)).failure(clock())
    bs.record(pair_target(p1, d), (State.CLOSED, State.OPEN), "kv_load_failed")
    t.release()
    decodes, pairs = bs.blocked()
    assert decodes == frozenset() and pairs == {(p1, d)}
    assert bs.acquire(p1, d) is None
    assert bs.acquire(p2, d) is not None


def test_acquire_that_fails_on_the_pair_releases_the_decode_trial() -> None:
    clock = Clock()
    bs = Breakers(None, clock)
    bs.configure(CircuitBreakerSpec(failure_threshold=1, cooldown_seconds=5, half_open_probes=1))
    p, d = "http://p:1", "http://d:1"
    t = bs.acquire(p, d)
    assert t is not None
    t.failure("kv_load_failed")  # both open at t
    clock.t += 5
    bs.get(pair_target(p, d)).opened_at = clock.t  # the pair reopened later: still open
    assert bs.acquire(p, d) is None
    dec = bs.get(decode_target(d))
    assert dec.state is State.HALF_OPEN and dec.trials_out == 0  # the decode trial was given back


def test_reconfigure_applies_to_existing_breakers() -> None:
    clock = Clock()
    bs = Breakers(None, clock)
    t = bs.acquire("http://p", "http://d")
    assert t is not None
    t.release()
    bs.configure(CircuitBreakerSpec(failure_threshold=1, cooldown_seconds=1, half_open_probes=1))
    t = bs.acquire("http://p", "http://d")
    assert t is not None
    t.failure("kv_load_failed")
    assert bs.state(decode_target("http://d")) is State.OPEN
