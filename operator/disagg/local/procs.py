"""Process-group helpers shared by everything that starts local processes (control plane, pods, Prometheus,
the operator, benchmarks). Each child is started with ``start_new_session=True``, so its pid is its process
group and a signal to the group reaches whatever it forked."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_group(proc: subprocess.Popen | None, grace: float = 10.0, group: bool = True) -> int | None:
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


def _signal(proc: subprocess.Popen, sig: int, group: bool) -> None:
    try:
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except ProcessLookupError:
        pass
