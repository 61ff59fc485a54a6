"""The one process harness: everything that starts local processes (control plane, pods, Prometheus, the operator,
benchmarks, tests) uses these helpers.

- :func:`free_ports` / :func:`free_port` / :func:`free_port_block`: free loopback ports;
- :func:`wait_http`: poll a URL until it answers 200 (with :func:`disagg.poll.wait_for`, the one polling helper);
- :func:`stop_group`: SIGTERM a child's process group, then SIGKILL after a grace period;
- :func:`process_tree`: a process and its descendants (``vllm serve`` and its engine core);
- :class:`Processes`: start and stop a set of processes (sims, routers, nginx), each in its own process group on
  loopback with its log in a file, all stopped at the end — also on Ctrl-C, SIGTERM or an exception
  (``with Processes() as procs:``).

Each child is started with ``start_new_session=True``, so its pid is its process group and a signal to the group
reaches whatever it forked.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from ..poll import WaitTimeoutError, wait_for

HOST = "127.0.0.1"
SIM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"



# ---------------------------------------------------------------------------------------------------- ports
# Ports handed out here lie below the kernel's ephemeral range. A port taken from that range (bind to port 0) is free
# when it is chosen, but until the child process binds it the kernel may give it to any outgoing connection as its
# local port — a client of a sim, a Prometheus scrape — and the child's bind fails with EADDRINUSE (it did in CI: a
# sim's NIXL side channel). Below the range no connect() ever takes it; a port this process handed out recently is
# not handed out again, and one another process holds fails the bind check.
PORT_SPAN = 16_000  # how far below the ephemeral range to draw from
_RECENT_PORTS: dict[int, None] = {}  # handed out lately, oldest first (insertion order)
_RECENT_MAX = 4096
_RECENT_LOCK = threading.Lock()


@functools.cache
def _port_range() -> range:
    """Ports below the ephemeral range (/proc/sys/net/ipv4/ip_local_port_range; Linux's default 32768–60999)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    start = max(1024, low - PORT_SPAN)
    return range(start, low) if low - start >= 1024 else range(10_000, 26_000)


def _handed_out(ports: Sequence[int]) -> None:
    with _RECENT_LOCK:
        for port in ports:
            _RECENT_PORTS[port] = None
        while len(_RECENT_PORTS) > _RECENT_MAX:
            del _RECENT_PORTS[next(iter(_RECENT_PORTS))]


def free_ports(n: int, host: str = HOST) -> list[int]:
    """n distinct free ports below the ephemeral range, none handed out lately by this process (all sockets held
    open together, so no port is handed out twice)."""
    ports = _port_range()
    rng = random.SystemRandom()
    socks: list[socket.socket] = []
    try:
        for _ in range(50 * n + 200):
            if len(socks) == n:
                break
            port = rng.choice(ports)
            with _RECENT_LOCK:
                if port in _RECENT_PORTS:
                    continue
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        if len(socks) < n:
            raise OSError(f"no {n} free ports on {host} in {ports.start}–{ports.stop - 1}")
        got = [s.getsockname()[1] for s in socks]
        _handed_out(got)
        return got
    finally:
        for s in socks:
            s.close()


def free_port(host: str = HOST) -> int:
    """One free port."""
    return free_ports(1, host)[0]


def free_port_block(n: int, host: str = HOST, attempts: int = 200) -> int:
    """The first of ``n`` consecutive free ports (a data-parallel sim listens on its side-channel port + rank)."""
    for _ in range(attempts):
        base = free_port(host)
        if base + n > _port_range().stop:  # the block stays below the ephemeral range too
            continue
        with _RECENT_LOCK:  # the base is ours (free_port handed it out); the rest of the block must not be another's
            if any(port in _RECENT_PORTS for port in range(base + 1, base + n)):
                continue
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind((host, port))
            _handed_out(range(base, base + n))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise OSError(f"no {n} consecutive free ports on {host} after {attempts} attempts")


# ---------------------------------------------------------------------------------------------------- HTTP
def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen[Any] | None = None,
              interval: float = 0.05, context: ssl.SSLContext | None = None,
              headers: dict[str, str] | None = None) -> None:
    """Poll ``url`` until it answers 200; fail at once (RuntimeError) when ``proc`` exits first. ``context``: the
    TLS context of an https:// URL (its CA); ``headers``: sent with each poll (credentials)."""

    def ok() -> bool:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2,
                                        context=context) as r:
                return bool(r.status == 200)
        except (OSError, http.client.HTTPException):  # refused, reset, an error status (HTTPError), a timeout
            return False

    wait_for(ok, timeout, f"{url} to answer 200", interval=interval)


# ---------------------------------------------------------------------------------------------------- stopping
def stop_group(proc: subprocess.Popen[Any] | None, grace: float = 10.0, group: bool = True) -> int | None:
    """SIGTERM the process group (or, with ``group=False``, the process alone: one not started in a session of
    its own), wait up to ``grace`` seconds, then SIGKILL it. Returns the exit code."""
    if proc is None:
        return None
    if proc.poll() is None:
        _signal(proc, signal.SIGTERM, group)
        try:
            proc.wait(timeout=max(0.1, grace))
        except subprocess.TimeoutExpired:
            _signal(proc, signal.SIGKILL, group)
            proc.wait()
    return proc.returncode


def _signal(proc: subprocess.Popen[Any], sig: int, group: bool = True) -> None:
    try:
        if group:
            os.killpg(proc.pid, sig)  # pgid == pid (start_new_session)
        else:
            proc.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        pass


def process_tree(pid: int) -> set[int]:
    """A process and its descendants, from /proc (each thread's ``children``); gone ones are skipped."""
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        out.add(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except FileNotFoundError:
                continue
    return out


def tail_lines(path: Path | None, lines: int) -> str:
    """The last ``lines`` lines of a process's log file ("" when there is none yet)."""
    if path is None:
        return ""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def cpu_seconds(pids: list[int]) -> float:
    """User+system CPU seconds of the given processes and of every process in their process groups (nginx's
    workers, say), from Linux /proc, for reporting CPU use."""
    tick = os.sysconf("SC_CLK_TCK")
    groups = set(pids)
    total = 0.0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            if int(d) in groups or int(fields[2]) in groups:  # fields[2] = pgrp
                total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


# ---------------------------------------------------------------------------------------------------- Processes
def disagg_argv() -> list[str]:
    """How to run `disagg` as a subprocess with the same interpreter."""
    return [sys.executable, "-c", "import sys; from disagg.cli import main; sys.exit(main())"]


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    info: dict[str, Any] = field(default_factory=dict)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


_Handler = Callable[[int, FrameType | None], Any] | int | None


class Processes:
    """Start and stop a set of processes. A context manager; stop_all() is idempotent."""

    def __init__(self, log_dir: Path | None = None) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if log_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="disagg-procs-")
            log_dir = Path(self._tmp.name)
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: list[Proc] = []
        self._old_handlers: dict[int, _Handler] = {}

    # ------------------------------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Processes:
        # SIGTERM/SIGHUP become KeyboardInterrupt so that `finally`/`__exit__` run and the children are stopped.
        for sig in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError):  # not the main thread: no handlers
                self._old_handlers[sig] = signal.signal(sig, _raise_interrupt)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop_all()
        for sig, h in self._old_handlers.items():
            signal.signal(sig, h)
        if self._tmp is not None:
            self._tmp.cleanup()

    def spawn(self, name: str, argv: list[str], url: str, env: dict[str, str] | None = None,
              **info: Any) -> Proc:
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "wb") as f:
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                                    start_new_session=True)  # own process group: killpg reaches its children
        p = Proc(name, proc, url, log_path, info)
        self.procs.append(p)
        return p

    def stop(self, p: Proc, timeout: float = 10.0) -> None:
        stop_group(p.proc, grace=timeout)
        if p in self.procs:
            self.procs.remove(p)

    def stop_all(self, timeout: float = 10.0) -> None:
        """SIGTERM every group at once, wait for them together, SIGKILL what is left (grandchildren too)."""
        procs = list(self.procs)
        for p in procs:
            _signal(p.proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(p.proc, signal.SIGKILL)
                p.proc.wait()
        for p in procs:  # anything left in the groups (grandchildren)
            _signal(p.proc, signal.SIGKILL)
        self.procs.clear()

    def wait_ready(self, p: Proc, path: str = "/health", timeout: float = 60.0) -> None:
        try:
            wait_http(p.url + path, timeout, p.proc)
        except RuntimeError as e:
            raise RuntimeError(f"{p.name} exited with {p.proc.returncode}:\n{p.log_tail()}") from e
        except WaitTimeoutError as e:
            raise WaitTimeoutError(f"{p.name} ({p.url}) not ready after {timeout}s: {e}\n{p.log_tail()}") from e

    # ------------------------------------------------------------------------------------------ components
    def sim(self, role: str = "aggregated", *, time_scale: float, gpu: str | None = "H100-SXM",
            model_preset: str | None = "Llama-3.1-8B", model: str = SIM_MODEL,
            kv_load_failure_policy: str = "recompute", env: dict[str, str] | None = None,
            extra: Sequence[str] | None = None, wait: bool = False) -> Proc:
        """A `disagg sim` worker: role prefill (kv_producer), decode (kv_consumer) or aggregated (no connector
        unless ``extra`` brings one). ``gpu``/``model_preset`` None: the simulator's defaults. ``info``: role, port,
        side_port (its NIXL side channel, always set)."""
        port, side = free_ports(2)
        argv = [*disagg_argv(), "sim", model, "--host", HOST, "--port", str(port), "--time-scale", str(time_scale)]
        argv += ["--gpu", gpu] if gpu else []
        argv += ["--model-preset", model_preset] if model_preset else []
        argv += [*(extra or [])]
        if role in ("prefill", "decode"):
            kv = {"kv_connector": "NixlConnector",
                  "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
                  "kv_load_failure_policy": kv_load_failure_policy}
            argv += ["--kv-transfer-config", json.dumps(kv)]
        sim_env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": HOST, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)}
        p = self.spawn(f"sim-{role}-{port}", argv, f"http://{HOST}:{port}", {**sim_env, **(env or {})}, role=role,
                       port=port, side_port=side)
        if wait:
            self.wait_ready(p)
        return p

    def router(self, config_path: Path | None = None, *, prefill: Sequence[str] = (), decode: Sequence[str] = (),
               aggregated: Sequence[str] = (), extra: Sequence[str] | None = None, env: dict[str, str] | None = None,
               wait: bool = False) -> Proc:
        """A `disagg router` with static worker lists (or none: ``extra`` and ``env`` may name a cluster mode:
        ``--kubeconfig``, ``POD_NAMESPACE``). A later ``--log-level`` in ``extra`` wins over the WARNING here."""
        port = free_port()
        argv = [*disagg_argv(), "router", "--host", HOST, "--port", str(port), "--log-level", "WARNING",
                *(["--config", str(config_path)] if config_path else []), *(extra or [])]
        if prefill:
            argv += ["--prefill", *prefill]
        if decode:
            argv += ["--decode", *decode]
        if aggregated:
            argv += ["--aggregated", *aggregated]
        p = self.spawn(f"router-{port}", argv, f"http://{HOST}:{port}", env, role="router")
        if wait:
            self.wait_ready(p)
        return p


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:  # noqa: ARG001 - a signal handler's signature
    raise KeyboardInterrupt(f"signal {signum}")
