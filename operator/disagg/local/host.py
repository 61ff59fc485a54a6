"""What a local node (cluster.py ``LocalCluster``) leaves on the host besides its state directory, and how it is
removed: the pods' cgroups under :data:`CGROUP_ROOT`, the processes in them, the kubelet's iptables chains, and
processes found by their command line. The only node on this machine is ours (cluster.py holds the lock)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from ..poll import WaitTimeoutError, wait_for

CGROUP_ROOT = "/disagg-local"  # the kubelet's cgroupRoot: every pod's cgroup lies under it


def _quiet(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True)


def make_cgroup_root() -> None:
    """The kubelet's cgroupRoot must exist in every hierarchy (cgroups v1 here; v2: one directory)."""
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").exists():  # cgroups v2
        (base / CGROUP_ROOT.lstrip("/")).mkdir(exist_ok=True)
        return
    for ctl in base.iterdir():
        if not ctl.is_dir() or ctl.is_symlink() or ctl.name == "unified":
            continue
        d = ctl / CGROUP_ROOT.lstrip("/")
        d.mkdir(exist_ok=True)
        if ctl.name == "cpuset":  # a new cpuset is empty: inherit the parent's CPUs and memory nodes
            for f in ("cpuset.cpus", "cpuset.mems"):
                if not (d / f).read_text().strip():
                    (d / f).write_text((ctl / f).read_text())


def cgroup_tops() -> list[Path]:
    base = Path("/sys/fs/cgroup")
    if not base.is_dir():
        return []
    tops = [base / CGROUP_ROOT.lstrip("/")] + [c / CGROUP_ROOT.lstrip("/") for c in base.iterdir()
                                               if c.is_dir() and not c.is_symlink()]
    return [t for t in tops if t.is_dir()]


def cgroup_members() -> set[int]:
    pids: set[int] = set()
    for top in cgroup_tops():
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def kill_cgroup_members(timeout: float = 15) -> None:
    """SIGKILL every process left in the node's cgroups (only pods live there) and wait until they are gone."""
    for pid in cgroup_members():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(WaitTimeoutError):
        wait_for(lambda: not cgroup_members(), timeout, "the pods' processes to exit", interval=0.1)


# The iptables chains a kubelet makes (its canaries, the hint for kube-proxy, the martian-packet firewall)
KUBELET_CHAINS = (("mangle", "KUBE-KUBELET-CANARY"), ("nat", "KUBE-KUBELET-CANARY"),
                  ("filter", "KUBE-KUBELET-CANARY"), ("mangle", "KUBE-IPTABLES-HINT"), ("filter", "KUBE-FIREWALL"))


def remove_kubelet_chains() -> None:
    """Remove the kubelet's iptables chains (the only kubelet on this machine is ours: the lock)."""
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue
        for hook in ("INPUT", "OUTPUT"):
            while _quiet(tool, "-w", "-t", "filter", "-D", hook, "-j", "KUBE-FIREWALL").returncode == 0:
                pass
        for table, chain in KUBELET_CHAINS:
            _quiet(tool, "-w", "-t", table, "-F", chain)
            _quiet(tool, "-w", "-t", table, "-X", chain)


def pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def kill_if(pid: int, match: Callable[[str], bool]) -> None:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return
    if match(cmd):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def remove_cgroups() -> None:
    """Remove the node's cgroups, deepest first, in every hierarchy (their processes gone:
    :func:`kill_cgroup_members`)."""
    for ctl in Path("/sys/fs/cgroup").iterdir() if Path("/sys/fs/cgroup").is_dir() else []:
        top = ctl / CGROUP_ROOT.lstrip("/")
        if top.is_dir():
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts),
                            reverse=True):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()
