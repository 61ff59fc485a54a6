"""A real, local Kubernetes control plane: etcd + kube-apiserver (+ kube-controller-manager).

Binaries are found the envtest way (``TEST_ASSET_ETCD``, ``TEST_ASSET_KUBE_APISERVER``,
``TEST_ASSET_KUBE_CONTROLLER_MANAGER``, or a ``KUBEBUILDER_ASSETS`` directory), else built from Go module
sources by ``hack/build-control-plane.sh`` (cached outside the repo, keyed by version).

Everything listens on 127.0.0.1 on free ports, uses a throwaway CA and an admin client certificate, and
is stopped (process group killed, temp dir removed) by :meth:`ControlPlane.stop`, also on interpreter exit.
"""

from __future__ import annotations

import atexit
import http.client
import os
import shutil
import ssl
import subprocess
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from ..poll import WaitTimeoutError, wait_for
from .procs import free_ports, stop_group, tail_lines

REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-control-plane.sh"

_ENV_ASSETS = {
    "etcd": "TEST_ASSET_ETCD",
    "kube-apiserver": "TEST_ASSET_KUBE_APISERVER",
    "kube-controller-manager": "TEST_ASSET_KUBE_CONTROLLER_MANAGER",
}


class ControlPlaneError(RuntimeError):
    pass


def find_binaries(build: bool = True, needed: tuple[str, ...] = tuple(_ENV_ASSETS)) -> dict[str, Path]:
    """Locate control-plane binaries: envtest variables first, then the build cache (building if allowed)."""
    found: dict[str, Path] = {}
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    for name in needed:
        explicit = os.environ.get(_ENV_ASSETS[name])
        if explicit and Path(explicit).is_file():
            found[name] = Path(explicit)
        elif assets and (Path(assets) / name).is_file():
            found[name] = Path(assets) / name
    missing = [n for n in needed if n not in found]
    if not missing:
        return found
    if not build:
        raise ControlPlaneError(f"control-plane binaries not found: {', '.join(missing)}")
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise ControlPlaneError(f"{BUILD_SCRIPT} failed with exit code {proc.returncode}")
    bindir = Path(proc.stdout.strip().splitlines()[-1])
    for name in missing:
        if not (bindir / name).is_file():
            raise ControlPlaneError(f"{name} missing from {bindir}")
        found[name] = bindir / name
    return found


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def make_pki(d: Path) -> None:
    """Throwaway CA, apiserver serving cert (127.0.0.1/localhost), admin client cert, SA signing key."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "2", "-subj", "/CN=disagg-local-ca", cwd=d)
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n"
    )
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subj, ext in (
        ("server", "/CN=kube-apiserver", "server.ext"),
        ("admin", "/O=system:masters/CN=disagg-admin", "client.ext"),
    ):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subj, cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", "-extfile", ext, cwd=d)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


@dataclass
class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager) on loopback. Use as a context manager."""

    with_controller_manager: bool = False
    workdir: Path | None = None
    log_to: Path | None = None
    server: str = ""
    kubeconfig: Path = field(default_factory=Path)
    _procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    _logs: list[IO[bytes]] = field(default_factory=list)
    _tmp: Path | None = None

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    @property
    def tmp_dir(self) -> Path | None:
        """The started control plane's temp dir (PKI, etcd data, kubeconfig; logs unless ``log_to``)."""
        return self._tmp

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 120.0) -> None:
        needed = ("etcd", "kube-apiserver") + (("kube-controller-manager",) if self.with_controller_manager else ())
        bins = find_binaries(needed=needed)
        self._tmp = Path(tempfile.mkdtemp(prefix="disagg-cp-", dir=self.workdir))
        atexit.register(self.stop)
        pki = self._tmp / "pki"
        make_pki(pki)
        etcd_port, peer_port, api_port = free_ports(3)
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._spawn("etcd", [
            str(bins["etcd"]), "--data-dir", str(self._tmp / "etcd"), "--name", "disagg",
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"disagg=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync", "--log-level", "warn",
        ])
        self.server = f"https://127.0.0.1:{api_port}"
        self._spawn("kube-apiserver", [
            str(bins["kube-apiserver"]),
            "--etcd-servers", etcd_url, "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(api_port), "--cert-dir", str(self._tmp / "certs"),
            "--tls-cert-file", str(pki / "server.crt"), "--tls-private-key-file", str(pki / "server.key"),
            "--client-ca-file", str(pki / "ca.crt"), "--authorization-mode", "RBAC",
            # kubectl logs/exec through a real kubelet (local/cluster.py) authenticate as the admin client
            "--kubelet-client-certificate", str(pki / "admin.crt"), "--kubelet-client-key", str(pki / "admin.key"),
            "--service-cluster-ip-range", "10.96.0.0/16", "--allow-privileged=true",
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--enable-priority-and-fairness=false", "--profiling=false", "--shutdown-delay-duration=0s", "--v=0",
        ])
        self.kubeconfig = self._tmp / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump(self.kubeconfig_dict()))
        self._wait_ready(timeout)
        if self.with_controller_manager:
            self._spawn("kube-controller-manager", [
                str(bins["kube-controller-manager"]), "--kubeconfig", str(self.kubeconfig),
                "--leader-elect=false", "--secure-port=0", "--use-service-account-credentials=false",
                "--service-account-private-key-file", str(pki / "sa.key"), "--root-ca-file", str(pki / "ca.crt"),
                "--controllers=*,-nodeipam,-nodelifecycle,-persistentvolume-binder,-attachdetach,"
                "-persistentvolume-expander,-cloud-node-lifecycle,-ttl,-bootstrapsigner,-tokencleaner",
                "--concurrent-deployment-syncs=5", "--v=0",
            ])

    def stop(self) -> None:
        for _name, proc in reversed(self._procs):  # controller-manager, apiserver, then etcd
            stop_group(proc, grace=10)
        self._procs.clear()
        for f in self._logs:
            f.close()
        self._logs.clear()
        if self._tmp and self._tmp.exists():
            shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp = None

    # ------------------------------------------------------------------ helpers
    def _spawn(self, name: str, argv: list[str]) -> None:
        assert self._tmp is not None, "start() first"
        logdir = self.log_to or (self._tmp / "logs")
        logdir.mkdir(parents=True, exist_ok=True)
        log = open(logdir / f"{name}.log", "wb")  # noqa: SIM115 - closed by stop(), after the process
        self._logs.append(log)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._procs.append((name, proc))

    def log_tail(self, name: str, lines: int = 30) -> str:
        return tail_lines((self.log_to or (self._tmp / "logs" if self._tmp else Path("."))) / f"{name}.log", lines)

    def _ssl_context(self) -> ssl.SSLContext:
        assert self._tmp is not None
        pki = self._tmp / "pki"
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return ctx

    def _wait_ready(self, timeout: float) -> None:
        ctx = self._ssl_context()

        def ready() -> bool:
            for name, proc in self._procs:
                if proc.poll() is not None:
                    raise ControlPlaneError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")
            try:
                with urllib.request.urlopen(f"{self.server}/readyz", context=ctx, timeout=2) as r:
                    return bool(r.status == 200)
            except (OSError, http.client.HTTPException):  # not ready yet (refused, 500 while starting, …)
                return False

        try:
            wait_for(ready, timeout, "kube-apiserver /readyz", interval=0.2)
        except WaitTimeoutError as e:
            raise ControlPlaneError(f"kube-apiserver not ready after {timeout}s ({e}):\n"
                                    f"{self.log_tail('kube-apiserver')}") from e

    def kubeconfig_dict(self) -> dict[str, Any]:
        assert self._tmp is not None
        pki = self._tmp / "pki"
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "disagg-local", "cluster": {
                "server": self.server, "certificate-authority": str(pki / "ca.crt")}}],
            "users": [{"name": "disagg-admin", "user": {
                "client-certificate": str(pki / "admin.crt"), "client-key": str(pki / "admin.key")}}],
            "contexts": [{"name": "disagg-local", "context": {"cluster": "disagg-local", "user": "disagg-admin"}}],
            "current-context": "disagg-local",
        }
