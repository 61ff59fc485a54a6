"""The control-plane build is cached and envtest conventions are honoured."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from disagg.local.controlplane import BUILD_SCRIPT, find_binaries
from disagg.poll import wait_for

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def test_build_script_uses_cache() -> None:
    first = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=3600)
    assert first.returncode == 0, first.stderr
    second = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=60)
    assert second.returncode == 0
    assert "cached" in second.stderr
    bindir = second.stdout.strip().splitlines()[-1]
    assert bindir == first.stdout.strip().splitlines()[-1]
    for name in ("etcd", "kube-apiserver", "kube-controller-manager"):
        assert os.access(os.path.join(bindir, name), os.X_OK)
    version = subprocess.run([os.path.join(bindir, "kube-apiserver"), "--version"], capture_output=True, text=True)
    assert version.stdout.startswith("Kubernetes v1.3")


def test_kubebuilder_assets_are_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = find_binaries()
    for name, path in real.items():
        (tmp_path / name).symlink_to(path)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    found = find_binaries(build=False)
    assert all(p.parent == tmp_path for p in found.values())
    monkeypatch.setenv("TEST_ASSET_ETCD", str(real["etcd"]))
    assert find_binaries(build=False)["etcd"] == real["etcd"]


def test_kubectl_explain_shows_descriptions(kubectl: Kubectl) -> None:
    # the apiserver publishes the CRD's OpenAPI a moment after it is Established
    def explained() -> subprocess.CompletedProcess[str] | None:
        r = kubectl("explain", "dm.spec.prefill")
        return r if r.returncode == 0 else None

    r = wait_for(explained, 60, "kubectl explain dm.spec.prefill", interval=0.5)
    assert "The prefill pool (kv_producer workers)." in r.stdout
    assert "minReplicas" in r.stdout and "Lower bound for the autoscaler." in r.stdout
    r = kubectl("explain", "dm.spec.kvTransfer.transport")
    assert "rdma" in r.stdout and "nvlink" in r.stdout


def test_kubectl_get_shows_printer_columns(kubectl: Kubectl, namespace: str) -> None:
    from tests.paths import EXAMPLES

    kubectl("apply", "--server-side", "-n", namespace, "-f", str(EXAMPLES[0]), check=True)
    r = kubectl("get", "dm", "-n", namespace)
    header = r.stdout.splitlines()[0].split()
    assert header == ["NAME", "MODE", "READY", "PREFILL", "DECODE", "TTFT-P95", "TPOT-P95", "GOODPUT", "AGE"]
    wide = kubectl("get", "dm", "-n", namespace, "-o", "wide").stdout.splitlines()[0].split()
    assert wide == ["NAME", "MODE", "READY", "PREFILL", "DECODE", "TTFT-P95", "TPOT-P95", "GOODPUT", "REASON",
                    "SPEC-MODE", "TRANSPORT", "PREFILL-SCALED", "DECODE-SCALED", "AGE"]
