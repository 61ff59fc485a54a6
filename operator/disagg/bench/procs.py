"""Processes a benchmark starts (sims, routers, nginx): each in its own process group on loopback, logs to files,
all stopped at the end — also on Ctrl-C, SIGTERM or an exception (``with Processes() as procs:``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ..local.controlplane import free_ports
from ..local.procs import stop_group

HOST = "127.0.0.1"
SIM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def free_port() -> int:
    return free_ports(1, HOST)[0]


def disagg_argv() -> list[str]:
    """How to run `disagg` as a subprocess with the same interpreter."""
    return [sys.executable, "-c", "import sys; from disagg.cli import main; sys.exit(main())"]


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen
    url: str
    log_path: Path
    info: dict = field(default_factory=dict)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


class Processes:
    """Start and stop a benchmark's processes. A context manager; stop_all() is idempotent."""

    def __init__(self, log_dir: Path | None = None) -> None:
        self._tmp = None
        if log_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="disagg-bench-")
            log_dir = Path(self._tmp.name)
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: list[Proc] = []
        self._old_handlers: dict[int, object] = {}

    # ------------------------------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Processes:
        # SIGTERM/SIGHUP become KeyboardInterrupt so that `finally`/`__exit__` run and the children are stopped.
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                self._old_handlers[sig] = signal.signal(sig, _raise_interrupt)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()
        for sig, h in self._old_handlers.items():
            signal.signal(sig, h)  # type: ignore[arg-type]
        if self._tmp is not None:
            self._tmp.cleanup()

    def spawn(self, name: str, argv: list[str], url: str, env: dict[str, str] | None = None, **info) -> Proc:
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
        procs = list(self.procs)
        for p in procs:
            self._signal(p, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._signal(p, signal.SIGKILL)
                p.proc.wait()
        for p in procs:  # anything left in the groups (grandchildren)
            self._signal(p, signal.SIGKILL)
        self.procs.clear()

    @staticmethod
    def _signal(p: Proc, sig: int) -> None:
        try:
            os.killpg(p.proc.pid, sig)  # pgid == pid (start_new_session)
        except (ProcessLookupError, PermissionError):
            pass

    def wait_ready(self, p: Proc, path: str = "/health", timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if not p.alive():
                raise RuntimeError(f"{p.name} exited with {p.proc.returncode}:\n{p.log_tail()}")
            try:
                with urllib.request.urlopen(p.url + path, timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception as e:  # noqa: BLE001 - not up yet
                last = str(e)
            time.sleep(0.05)
        raise TimeoutError(f"{p.name} ({p.url}) not ready after {timeout}s: {last}\n{p.log_tail()}")

    # ------------------------------------------------------------------------------------------ components
    def sim(self, role: str = "aggregated", *, time_scale: float, gpu: str = "H100-SXM",
            model_preset: str = "Llama-3.1-8B", extra: list[str] | None = None, wait: bool = False) -> Proc:
        """A `disagg sim` worker: role prefill (kv_producer), decode (kv_consumer) or aggregated (no connector)."""
        port = free_port()
        argv = [*disagg_argv(), "sim", SIM_MODEL, "--host", HOST, "--port", str(port), "--time-scale",
                str(time_scale), "--gpu", gpu, "--model-preset", model_preset, *(extra or [])]
        env: dict[str, str] = {}
        if role in ("prefill", "decode"):
            side = free_port()
            kv = {"kv_connector": "NixlConnector",
                  "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
                  "kv_load_failure_policy": "recompute"}
            argv += ["--kv-transfer-config", json.dumps(kv)]
            env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": HOST, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)}
        p = self.spawn(f"sim-{role}-{port}", argv, f"http://{HOST}:{port}", env, role=role)
        if wait:
            self.wait_ready(p)
        return p

    def router(self, config_path: Path, *, prefill: list[str] = (), decode: list[str] = (),
               aggregated: list[str] = (), extra: list[str] | None = None, wait: bool = False) -> Proc:
        port = free_port()
        argv = [*disagg_argv(), "router", "--host", HOST, "--port", str(port), "--config", str(config_path),
                "--log-level", "WARNING", *(extra or [])]
        if prefill:
            argv += ["--prefill", *prefill]
        if decode:
            argv += ["--decode", *decode]
        if aggregated:
            argv += ["--aggregated", *aggregated]
        p = self.spawn(f"router-{port}", argv, f"http://{HOST}:{port}", role="router")
        if wait:
            self.wait_ready(p)
        return p


def _raise_interrupt(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt(f"signal {signum}")


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
