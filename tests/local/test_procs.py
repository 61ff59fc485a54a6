"""The one process harness (disagg.local.procs) and the one polling helper (disagg.poll): free ports, polling with
a deadline (sync and async), HTTP readiness, stopping a process group, and Processes stopping everything it
started."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from disagg.local.procs import Processes, free_port, free_port_block, free_ports, stop_group, wait_http
from disagg.poll import WaitTimeoutError, until, wait_for


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))
    base = free_port_block(4)
    socks = [socket.socket() for _ in range(4)]
    try:
        for i, s in enumerate(socks):  # all four consecutive ports can be bound
            s.bind(("127.0.0.1", base + i))
    finally:
        for s in socks:
            s.close()


def test_free_ports_lie_below_the_ephemeral_range_and_are_not_handed_out_twice() -> None:
    """An outgoing connection's local port comes from the kernel's ephemeral range; a port handed out to a child
    process from that range could be taken by one before the child binds it (a sim's NIXL side channel did, in CI)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    seen: list[int] = []
    for _ in range(50):
        seen += free_ports(3)
    base = free_port_block(4)
    seen += range(base, base + 4)
    assert max(seen) < low
    assert len(set(seen)) == len(seen)  # none handed out twice by this process


def test_a_port_block_leaves_out_ports_handed_out_lately(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block's base comes from free_port (so it is new), but the ports after it must be new too: a block that
    overlapped a port handed out to another child let two children bind the same port (found as a flaky
    duplicate in the test above)."""
    from disagg.local import procs

    taken = free_ports(1)[0]
    later = iter([taken - 1])  # first a base whose block (taken - 1, taken) overlaps the port just handed out

    def base(host: str = procs.HOST) -> int:
        return next(later, None) or procs.free_ports(1, host)[0]

    monkeypatch.setattr(procs, "free_port", base)
    got = free_port_block(2)
    assert got != taken - 1 and taken not in range(got, got + 2)


def test_wait_for_returns_the_first_truthy_value() -> None:
    calls = iter([None, 0, "", "got it", "later"])
    assert wait_for(lambda: next(calls), 5, "a value", interval=0.001) == "got it"


def test_wait_for_times_out_with_the_last_value() -> None:
    t0 = time.monotonic()
    with pytest.raises(WaitTimeoutError, match=r"timed out after 0\.2s waiting for nothing \(last: \[\]\)"):
        wait_for(lambda: [], 0.2, "nothing", interval=0.01)
    assert 0.2 <= time.monotonic() - t0 < 2
    # a failed wait is both a failed assertion (tests) and a TimeoutError (code)
    assert issubclass(WaitTimeoutError, AssertionError) and issubclass(WaitTimeoutError, TimeoutError)


def test_wait_for_stops_at_an_error_unless_told_to_retry() -> None:
    def boom() -> bool:
        raise KeyError("x")

    with pytest.raises(KeyError):
        wait_for(boom, 5)
    calls: list[str | Exception] = [KeyError("not yet"), KeyError("still not"), "ok"]

    def flaky() -> str:
        v = calls.pop(0)
        if isinstance(v, Exception):
            raise v
        return v

    assert wait_for(flaky, 5, retry_on=(KeyError,), interval=0.001) == "ok"
    with pytest.raises(WaitTimeoutError, match="KeyError"):
        wait_for(boom, 0.05, retry_on=(KeyError,), interval=0.01)


async def test_until_polls_without_blocking_the_loop() -> None:
    box: list[int] = []

    async def fill() -> None:
        await asyncio.sleep(0.05)
        box.append(1)

    task = asyncio.create_task(fill())  # runs only while until() yields to the loop
    assert await until(lambda: box, 5, "the box to fill") == [1]
    await task
    with pytest.raises(WaitTimeoutError, match="never"):
        await until(lambda: False, 0.05, "never")
    errors = [KeyError("not yet")]

    def flaky() -> str:
        if errors:
            raise errors.pop()
        return "ok"

    assert await until(flaky, 5, retry_on=(KeyError,)) == "ok"


class _Flaky(BaseHTTPRequestHandler):
    hits = 0

    def do_GET(self) -> None:
        type(self).hits += 1
        self.send_response(200 if type(self).hits >= 3 else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_wait_http_waits_for_200_and_fails_fast_when_the_process_exits() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        wait_http(f"http://127.0.0.1:{server.server_port}/health", 10, interval=0.01)
        assert _Flaky.hits >= 3
    finally:
        server.shutdown()
        server.server_close()
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="exited with 3"):
        wait_http(f"http://127.0.0.1:{free_port()}/", 30, dead)
    assert time.monotonic() - t0 < 5


def test_stop_group_reaches_grandchildren(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild"
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    grandchild = int(wait_for(lambda: pidfile.read_text() if pidfile.exists() else None, 20, "the grandchild's pid"))
    assert stop_group(proc, grace=5) == -signal.SIGTERM  # the TERM ended it (no SIGKILL needed)
    wait_for(lambda: not _alive(grandchild), 10, "the grandchild to be gone")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_processes_stop_everything_on_an_exception(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), Processes(tmp_path) as procs:
        p = procs.spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], "http://127.0.0.1:1")
        raise RuntimeError("boom")
    assert p.proc.poll() == -signal.SIGTERM  # stopped by the harness's SIGTERM, not still running
    assert procs.procs == []


def test_processes_wait_ready_reports_an_early_exit_with_its_log(tmp_path: Path) -> None:
    with Processes(tmp_path) as procs:
        p = procs.spawn("crasher", [sys.executable, "-c", "print('no model here'); raise SystemExit(2)"],
                        f"http://127.0.0.1:{free_port()}")
        with pytest.raises(RuntimeError, match=r"crasher exited with 2:\n.*no model here"):
            procs.wait_ready(p, timeout=30)


def test_processes_start_a_sim_and_a_router_in_front_of_it(tmp_path: Path) -> None:
    import json
    import urllib.request

    with Processes(tmp_path) as procs:
        sim = procs.sim("decode", time_scale=0.05, gpu=None, model_preset=None, model="m-test",
                        kv_load_failure_policy="fail", wait=True)
        assert {"role", "port", "side_port"} <= set(sim.info)
        conf = tmp_path / "router.yaml"
        conf.write_text("model: m-test\n")
        router = procs.router(conf, decode=[sim.url], wait=True)
        with urllib.request.urlopen(router.url + "/v1/models", timeout=10) as r:
            assert "m-test" in json.dumps(json.loads(r.read()))
        pids = [p.proc.pid for p in procs.procs]
    assert all(not _alive(pid) for pid in pids)
