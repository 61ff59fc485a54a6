"""`disagg demo`: the local loop on this machine (no GPU, no cluster, no Docker).

Starts a real control plane (etcd + kube-apiserver + kube-controller-manager on loopback), installs the
CRD, applies the examples in docs/examples and prints `kubectl get dm`. Everything it starts is stopped
when it ends or is interrupted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .api.crd import build_crd
from .kube import api_client, install_crd
from .local.controlplane import REPO_ROOT, ControlPlane

EXAMPLES_DIR = REPO_ROOT / "docs" / "examples"


def _say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def run_demo(keep: bool = False, examples_dir: Path = EXAMPLES_DIR) -> int:
    started = time.monotonic()
    cp = ControlPlane(with_controller_manager=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        _say("starting etcd + kube-apiserver + kube-controller-manager on 127.0.0.1 (built from Go sources)")
        cp.start()
        _say(f"control plane ready at {cp.server} ({time.monotonic() - started:.1f}s)")
        install_crd(api_client(cp.kubeconfig), build_crd())
        _say("CRD disaggregatedmodels.serving.disagg.dev established")
        env = {**os.environ, "KUBECONFIG": str(cp.kubeconfig)}
        for path in sorted(examples_dir.glob("*.yaml")):
            out = subprocess.run(["kubectl", "apply", "--server-side", "-n", "default", "-f", str(path)],
                                 env=env, capture_output=True, text=True)
            if out.returncode != 0:
                print(out.stderr, file=sys.stderr)
                return 1
            _say(out.stdout.strip())
        _say("kubectl get dm")
        subprocess.run(["kubectl", "get", "dm", "-n", "default"], env=env, check=True)
        if keep:
            _say(f"control plane kept running; export KUBECONFIG={cp.kubeconfig}  (Ctrl-C to stop)")
            while True:
                time.sleep(3600)
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        cp.stop()
        _say(f"stopped everything ({time.monotonic() - started:.1f}s)")
