"""``disagg router --workers N``: one router process per core behind one port.

The parent (this module) binds nothing and serves nothing: it starts N worker processes — each a complete router
(``disagg router`` with the same flags plus ``--worker-index i``) — that listen on the same host:port with
``SO_REUSEPORT``, so the kernel spreads incoming connections over them. Each worker has its own event loop and its
own load view: worker scrapes, breakers, probe limiter, prefix index, backlog clocks (as N router replicas would;
docs/router.md, *Several workers*).

Metrics: the workers run prometheus_client in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, a fresh directory
per parent on /dev/shm, else in the temp directory; ``$DISAGG_ROUTER_METRICS_DIR`` to choose): whichever worker
answers ``GET /metrics`` returns the sum over all workers (counters and histograms summed; gauges aggregated per
metric, see ``metrics.py``), so one scrape of the port is the whole replica. A dead worker's live gauges are
dropped (``mark_process_dead``); its counters stay in the sums.

Lifecycle: SIGTERM/SIGINT to the parent → SIGTERM to every worker (each drains like a single router), wait up to
``grace`` seconds, then SIGKILL what is left; exit 0. A worker that dies on its own is restarted, unless it dies
within ``STARTUP_SECONDS`` of its start (a bad flag, a busy port, a broken config file): then all are stopped and
the parent exits 1 (also when one worker exits 3 times within a minute). Workers get ``PR_SET_PDEATHSIG`` so
that a parent killed with SIGKILL takes them along.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

STARTUP_SECONDS = 5.0
CRASH_WINDOW_SECONDS, MAX_CRASHES = 60.0, 3  # a worker exiting this often is not worth restarting
_SIGNALS = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT}


def child_argv(parser: argparse.ArgumentParser, args: argparse.Namespace, index: int) -> list[str]:
    """The worker's command line: the parent's router flags (as parsed) plus ``--worker-index``."""
    argv = [sys.executable, "-m", "disagg.cli", "router"]
    for action in parser._actions:  # noqa: SLF001 (argparse has no public list of a parser's options)
        if not action.option_strings or action.dest in ("help", "worker_index"):
            continue
        value = getattr(args, action.dest, None)
        if value is None or value == []:
            continue
        flag = action.option_strings[-1]
        if isinstance(value, list):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return [*argv, "--worker-index", str(index)]


def _child_setup() -> None:  # pragma: no cover - runs in the forked child before exec
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
    with contextlib.suppress(Exception):  # Linux: die with the parent
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _log(event: str, **fields: object) -> None:
    from .. import logs

    logs.get("disagg.router").info(event, **fields)


def supervise(argvs: Sequence[list[str]], grace: float = 35.0) -> int:
    """Run one worker per argv until SIGTERM/SIGINT; see the module docstring."""
    metrics_dir = _metrics_dir()
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=metrics_dir)
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    procs: dict[int, subprocess.Popen[bytes]] = {}
    started: dict[int, float] = {}
    exits: dict[int, list[float]] = {}

    def spawn(i: int) -> None:
        procs[i] = subprocess.Popen(argvs[i], env=env, preexec_fn=_child_setup)  # the parent has no threads
        started[i] = time.monotonic()

    rc = 0
    try:
        for i in range(len(argvs)):
            spawn(i)
        _log("router_workers_started", processes=len(argvs), pids=[p.pid for p in procs.values()],
             metrics_dir=metrics_dir)
        while True:
            info = signal.sigtimedwait(_SIGNALS, 1.0)
            if info is not None and info.si_signo in (signal.SIGTERM, signal.SIGINT):
                _log("router_workers_stopping", signal=signal.Signals(info.si_signo).name)
                break
            failed = False
            for i, p in list(procs.items()):
                code = p.poll()
                if code is None:
                    continue
                _mark_dead(p.pid, metrics_dir)
                now = time.monotonic()
                recent = exits[i] = [t for t in exits.get(i, []) if now - t < CRASH_WINDOW_SECONDS] + [now]
                early = now - started[i] < STARTUP_SECONDS or len(recent) >= MAX_CRASHES
                _log("router_worker_exited", worker=i, pid=p.pid, returncode=code, restart=not early)
                if early:
                    failed = True
                    break
                spawn(i)
            if failed:
                rc = 1
                break
    finally:
        _stop(list(procs.values()), grace)
        for p in procs.values():
            _mark_dead(p.pid, metrics_dir)
        shutil.rmtree(metrics_dir, ignore_errors=True)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
    return rc


def _metrics_dir() -> str:
    """A fresh directory for the workers' metric files: under $DISAGG_ROUTER_METRICS_DIR when set, else on
    /dev/shm (tmpfs, writable in a pod whose root filesystem is read-only), else in the temp directory."""
    for base in (os.environ.get("DISAGG_ROUTER_METRICS_DIR"), "/dev/shm", None):
        if base is not None and not os.path.isdir(base):
            continue
        try:
            return tempfile.mkdtemp(prefix="disagg-router-metrics-", dir=base)
        except OSError:
            continue
    raise SystemExit("disagg router --workers: no writable directory for the metric files "
                     "(set DISAGG_ROUTER_METRICS_DIR or mount an emptyDir at /tmp)")


def _stop(procs: list[subprocess.Popen[bytes]], grace: float) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _mark_dead(pid: int, metrics_dir: str) -> None:
    from prometheus_client import multiprocess

    with contextlib.suppress(OSError):
        multiprocess.mark_process_dead(pid, metrics_dir)
