"""A real one-node Kubernetes cluster on this machine: the local :class:`ControlPlane` plus kube-scheduler, kubelet,
containerd and a bridge pod network. Pods are containers run from the images ``hack/build-images.sh`` builds.

What it is:

- etcd + kube-apiserver + kube-controller-manager (:class:`ControlPlane`), kube-scheduler, one kubelet (node
  ``localhost``) with client certificates and Webhook authorization (no anonymous access), containerd 1.6 (Debian)
  with runc, its own root/state/socket, ``restrict_oom_score_adj`` and a locally built pause image;
- a bridge (``disagg0``, :data:`POD_CIDR`) that the stack owns; pods get addresses there and the machine reaches
  them directly. Nothing is masqueraded and nothing is forwarded off the machine;
- the ``kubernetes`` Service: there is no kube-proxy, so one nftables rule in the stack's own table DNATs
  :data:`KUBERNETES_SERVICE_IP`:443 to a socat forwarder on the bridge address, which connects to the loopback
  apiserver (whose serving certificate is re-issued with those addresses as SANs);
- the node advertises :data:`GPU_RESOURCE` and :data:`RDMA_RESOURCE` as extended resources (a status patch, as the
  Kubernetes docs describe for extended resources) and the GPU product label, so worker pods schedule as they would
  on a GPU node. There are no GPUs: the workers run the twin image (``disagg sim`` under the vLLM image name).

Everything lives under one state directory; :meth:`LocalCluster.stop` deletes the pods through the kubelet (so
CNI tears their network down), then stops every process by pid, kills the containerd shims it started, unmounts
what is left under the state dir, removes the pod cgroups, the bridge and the nftables table. A stale state dir
(a crashed run) is cleaned the same way before a start.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import shutil
import socket
import ssl
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ..kube import api_client
from ..poll import WaitTimeoutError, wait_for
from .controlplane import REPO_ROOT, ControlPlane, _openssl, find_binaries
from .host import (
    kill_cgroup_members,
    kill_if,
    make_cgroup_root,
    pids,
    remove_cgroups,
    remove_kubelet_chains,
)
from .node_config import GATEWAY, POD_CIDR, containerd_toml, kubelet_config
from .procs import free_ports, stop_group, tail_lines

NODE_NAME = "localhost"
BRIDGE = "disagg0"
KUBERNETES_SERVICE_IP = "10.96.0.1"  # the first address of ControlPlane's --service-cluster-ip-range 10.96.0.0/16
NFT_TABLE = "disagg-local"
GPU_RESOURCE = "nvidia.com/gpu"
RDMA_RESOURCE = "rdma/hca"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
NODE_TOOLS = REPO_ROOT / "hack" / "ensure-node-tools.sh"
BUILD_NODE = REPO_ROOT / "hack" / "build-node.sh"
BUILD_IMAGES = REPO_ROOT / "hack" / "build-images.sh"


def cache_dir() -> Path:
    root = os.environ.get("DISAGG_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "disagg")
    return Path(root)


class NodeUnsupportedError(RuntimeError):
    """This machine cannot run the real node; the message names the missing package or kernel feature."""


class ClusterError(RuntimeError):
    pass


def check_machine() -> None:
    """Raise :class:`NodeUnsupportedError` naming what is missing (``hack/ensure-node-tools.sh --check``)."""
    if os.geteuid() != 0:
        raise NodeUnsupportedError("the real node needs root (kubelet, containerd, network namespaces); run as root")
    proc = subprocess.run(["bash", str(NODE_TOOLS), "--check"], capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln.strip(" -") for ln in proc.stderr.splitlines() if ln.strip().startswith("[node-tools]   -")]
        raise NodeUnsupportedError("missing for the real node: " + "; ".join(
            ln.removeprefix("[node-tools]").strip(" -") for ln in lines or [proc.stderr.strip()]))


def _script(path: Path, what: str) -> Path:
    """Run a hack/ script that prints a path on its last stdout line."""
    proc = subprocess.run(["bash", str(path)], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"{path.name} failed with exit code {proc.returncode} ({what})")
    return Path(proc.stdout.strip().splitlines()[-1])


def image_archives(list_file: Path) -> dict[str, Path]:
    """``hack/build-images.sh``'s list file: image ref → ``podman save`` archive."""
    out = {}
    for line in list_file.read_text().splitlines():
        if line.strip():
            ref, archive = line.split(maxsplit=1)
            out[ref] = Path(archive)
    return out


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


@dataclass
class LocalCluster:
    """Control plane + scheduler + kubelet + containerd + bridge CNI on this machine. Use as a context manager."""

    state_dir: Path = field(default_factory=lambda: cache_dir() / "local-cluster")
    gpus: int = 8
    gpu_product: str = "NVIDIA-L40S"
    rdma_devices: int = 8
    build_images: bool = True
    cp: ControlPlane | None = None
    api: client.ApiClient | None = None
    images: dict[str, Path] = field(default_factory=dict)
    _procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    _logs: list[IO[bytes]] = field(default_factory=list)
    _lock: IO[str] | None = None

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def kubeconfig(self) -> Path:
        assert self.cp is not None, "start() first"
        return self.cp.kubeconfig

    @property
    def containerd_socket(self) -> Path:
        return self.state_dir / "containerd" / "containerd.sock"

    # ------------------------------------------------------------------ lifecycle
    def start(self, say: Callable[[str], None] = lambda _: None) -> None:
        """Start everything (a second call on a started cluster does nothing)."""
        if self.cp is not None:
            return
        check_machine()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.state_dir / "lock", "w")  # noqa: SIM115 - held until stop()
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise ClusterError(f"another local cluster runs from {self.state_dir} (its lock is held); "
                               "one node per machine: the bridge and the pod range are fixed") from e
        atexit.register(self.stop)
        self._cleanup_stale()
        say("building or finding kubelet + kube-scheduler (hack/build-node.sh) and the images (hack/build-images.sh)")
        bindir = _script(BUILD_NODE, "kubelet, kube-scheduler")
        if self.build_images:
            self.images = image_archives(_script(BUILD_IMAGES, "images"))
        say(f"pod network: bridge {BRIDGE} {POD_CIDR}")
        self._network()
        say("starting etcd + kube-apiserver + kube-controller-manager")
        self.cp = ControlPlane(with_controller_manager=True, workdir=self.state_dir,
                               log_to=self.state_dir / "logs")
        self.cp.start()
        assert self.cp.tmp_dir is not None
        pki = self.cp.tmp_dir / "pki"
        self._reissue_serving_cert(pki)
        self.api = api_client(self.cp.kubeconfig)
        self._kubernetes_service_route()
        self._node_rbac()
        say("starting containerd, kube-scheduler and the kubelet")
        self._containerd()
        self._import_images()
        self._scheduler(bindir / "kube-scheduler", pki)
        self._node_lifecycle()
        self._kubelet(bindir / "kubelet", pki)
        self._wait_node_ready()
        self._advertise_devices()
        self._write_state()
        say(f"node {NODE_NAME} Ready ({self.gpus} × {GPU_RESOURCE} {self.gpu_product}, {self.rdma_devices} × "
            f"{RDMA_RESOURCE}); kubeconfig {self.cp.kubeconfig}")

    def stop(self) -> None:
        if self.cp is None and self._lock is None:
            return
        if self.api is not None and self._alive("kubelet"):
            # best effort: the processes, mounts and network go below whatever this finds
            with contextlib.suppress(Exception):
                self._delete_all_pods()
        for _name, proc in reversed(self._procs):
            stop_group(proc, grace=10)
        self._procs.clear()
        for f in self._logs:
            f.close()
        self._logs.clear()
        if self.cp is not None:
            self.cp.stop()
            self.cp = None
        self.api = None
        self._cleanup_stale()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # ------------------------------------------------------------------ processes
    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        logdir = self.state_dir / "logs"
        logdir.mkdir(parents=True, exist_ok=True)
        log = open(logdir / f"{name}.log", "wb")  # noqa: SIM115 - closed by stop(), after the process
        self._logs.append(log)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._procs.append((name, proc))
        self._write_state()
        return proc

    def _alive(self, name: str) -> bool:
        return any(n == name and p.poll() is None for n, p in self._procs)

    def log_tail(self, name: str, lines: int = 30) -> str:
        return tail_lines(self.state_dir / "logs" / f"{name}.log", lines)

    def _write_state(self) -> None:
        state = {"pids": {n: p.pid for n, p in self._procs if p.poll() is None}}
        (self.state_dir / "state.json").write_text(json.dumps(state))

    def _check_procs(self) -> None:
        for name, proc in self._procs:
            if proc.poll() is not None:
                raise ClusterError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")

    # ------------------------------------------------------------------ network
    def _network(self) -> None:
        if _run("ip", "link", "show", BRIDGE, check=False).returncode != 0:
            _run("ip", "link", "add", BRIDGE, "type", "bridge")
        addrs = _run("ip", "-o", "-4", "addr", "show", "dev", BRIDGE).stdout
        if f" {GATEWAY}/" not in addrs:
            _run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        netd = self.state_dir / "cni" / "net.d"
        netd.mkdir(parents=True, exist_ok=True)
        (netd / "10-disagg.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "disagg",
            "plugins": [{
                "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "dataDir": str(self.state_dir / "cni" / "ipam"),
                         "ranges": [[{"subnet": POD_CIDR, "gateway": GATEWAY}]],
                         "routes": [{"dst": "0.0.0.0/0"}]},
            }],
        }, indent=2))

    def _kubernetes_service_route(self) -> None:
        """socat on the bridge address → the loopback apiserver; DNAT from the Service's ClusterIP to it."""
        assert self.cp is not None
        api_port = int(self.cp.server.rsplit(":", 1)[1])
        fwd_port = int(self.expose(api_port, "apiserver").rsplit(":", 1)[1])
        rules = (f"table ip {NFT_TABLE} {{\n"
                 f"  chain prerouting {{ type nat hook prerouting priority dstnat; policy accept;\n"
                 f"    ip daddr {KUBERNETES_SERVICE_IP} tcp dport 443 dnat to {GATEWAY}:{fwd_port}\n  }}\n"
                 f"  chain output {{ type nat hook output priority -100; policy accept;\n"
                 f"    ip daddr {KUBERNETES_SERVICE_IP} tcp dport 443 dnat to {GATEWAY}:{fwd_port}\n  }}\n}}\n")
        proc = subprocess.run(["nft", "-f", "-"], input=rules, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ClusterError(f"nft: {proc.stderr.strip()}")

    # ------------------------------------------------------------------ PKI
    def _reissue_serving_cert(self, pki: Path) -> None:
        """The apiserver's serving cert with the Service IP and the bridge address as SANs (the apiserver reloads
        its --tls-cert-file when the file changes), so pods verify it through the kubernetes Service."""
        (pki / "server2.ext").write_text(
            f"subjectAltName=IP:127.0.0.1,IP:{KUBERNETES_SERVICE_IP},IP:{GATEWAY},DNS:localhost,DNS:kubernetes,"
            "DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
            "extendedKeyUsage=serverAuth\n")
        _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", "server2.crt", "-days", "2", "-extfile", "server2.ext", cwd=pki)
        os.replace(pki / "server2.crt", pki / "server.crt")
        assert self.cp is not None
        host, port = self.cp.server.removeprefix("https://").rsplit(":", 1)
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))

        def serves_new_cert() -> bool:
            with socket.create_connection((host, int(port)), timeout=2) as s, \
                    ctx.wrap_socket(s, server_hostname=host) as tls:
                cert = tls.getpeercert() or {}
                sans = cert.get("subjectAltName", ())
                return ("IP Address", KUBERNETES_SERVICE_IP) in sans

        wait_for(serves_new_cert, 90, "kube-apiserver serving the re-issued certificate", interval=0.5,
                 retry_on=(OSError,))

    def _client_cert(self, pki: Path, name: str, subject: str) -> None:
        if (pki / f"{name}.crt").exists():
            return
        (pki / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subject, cwd=pki)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", "-extfile", "client.ext", cwd=pki)

    def _kubeconfig_for(self, pki: Path, name: str) -> Path:
        assert self.cp is not None
        path = pki.parent / f"{name}.kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "local", "cluster": {"server": self.cp.server,
                                                       "certificate-authority": str(pki / "ca.crt")}}],
            "users": [{"name": name, "user": {"client-certificate": str(pki / f"{name}.crt"),
                                              "client-key": str(pki / f"{name}.key")}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": name}}],
            "current-context": "local",
        }))
        return path

    def _node_rbac(self) -> None:
        """RBAC authorizes the kubelet (the apiserver runs without the Node authorizer): system:node for its
        user, and system:auth-delegator for the TokenReviews/SubjectAccessReviews of its Webhook authn/authz."""
        assert self.api is not None
        rbac = client.RbacAuthorizationV1Api(self.api)
        for role in ("system:node", "system:auth-delegator"):
            body = client.V1ClusterRoleBinding(
                metadata=client.V1ObjectMeta(name=f"disagg-local:kubelet:{role.split(':')[1]}"),
                role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role),
                subjects=[client.RbacV1Subject(kind="User", name=f"system:node:{NODE_NAME}",
                                               api_group="rbac.authorization.k8s.io")])
            try:
                rbac.create_cluster_role_binding(body)
            except ApiException as e:
                if e.status != 409:
                    raise

    # ------------------------------------------------------------------ containerd, scheduler, kubelet
    def _containerd(self) -> None:
        d = self.state_dir / "containerd"
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.toml").write_text(containerd_toml(d, self.containerd_socket, self.state_dir / "cni" / "net.d"))
        self._spawn("containerd", ["containerd", "--config", str(d / "config.toml"), "--log-level", "warn"])

        def up() -> bool:
            self._check_procs()
            return self._ctr("version", check=False).returncode == 0

        wait_for(up, 30, "containerd", interval=0.2)

    def _ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run("ctr", "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args, check=check)

    def _import_images(self) -> None:
        """``ctr images import`` each archive whose content is not in containerd yet (recorded per archive)."""
        record = self.state_dir / "imported.json"
        done: dict[str, str] = json.loads(record.read_text()) if record.exists() else {}
        present = set(self._ctr("images", "ls", "-q").stdout.split())
        for ref, archive in self.images.items():
            first = ref.split("/")[0]
            full = ref if "/" in ref and ("." in first or first == "localhost") else f"docker.io/{ref}"
            if done.get(ref) == archive.name and full in present:
                continue
            self._ctr("images", "import", str(archive))
            done[ref] = archive.name
            record.write_text(json.dumps(done))

    def expose(self, port: int, name: str) -> str:
        """Make a loopback service of this machine reachable from the pods: a socat forwarder on the bridge
        address (this machine reaches that address too). Returns the URL for both."""
        (fwd_port,) = free_ports(1)
        self._spawn(f"{name}-forward", [
            "socat", f"TCP-LISTEN:{fwd_port},bind={GATEWAY},fork,reuseaddr", f"TCP:127.0.0.1:{port}"])

        def forwarding() -> bool:
            self._check_procs()
            with contextlib.suppress(OSError), socket.create_connection((GATEWAY, fwd_port), timeout=1):
                return True
            return False

        wait_for(forwarding, 10, f"socat forwarder for {name}", interval=0.1)
        return f"http://{GATEWAY}:{fwd_port}"

    def kill_container(self, container_id: str, signal_name: str = "SIGKILL") -> None:
        """Signal a container's process through containerd (as the OOM killer or a crash would end it)."""
        self._ctr("tasks", "kill", "--signal", signal_name, container_id)

    def _scheduler(self, binary: Path, pki: Path) -> None:
        self._client_cert(pki, "scheduler", "/CN=system:kube-scheduler")
        kc = self._kubeconfig_for(pki, "scheduler")
        self._spawn("kube-scheduler", [str(binary), "--kubeconfig", str(kc), "--authentication-kubeconfig",
                                       str(kc), "--authorization-kubeconfig", str(kc), "--leader-elect=false",
                                       "--secure-port=0", "--v=0"])

    def _node_lifecycle(self) -> None:
        """ControlPlane's kube-controller-manager leaves out nodelifecycle (it has no nodes): the node's
        not-ready taint would then never go. A second controller manager runs just that controller."""
        assert self.cp is not None
        kcm = find_binaries(needed=("kube-controller-manager",))["kube-controller-manager"]
        self._spawn("node-lifecycle-controller", [
            str(kcm), "--kubeconfig", str(self.cp.kubeconfig), "--leader-elect=false", "--secure-port=0",
            "--controllers=nodelifecycle", "--v=0"])

    def _kubelet(self, binary: Path, pki: Path) -> None:
        self._client_cert(pki, "kubelet", f"/O=system:nodes/CN=system:node:{NODE_NAME}")
        kc = self._kubeconfig_for(pki, "kubelet")
        root = self.state_dir / "kubelet"
        root.mkdir(parents=True, exist_ok=True)
        make_cgroup_root()
        (port,) = free_ports(1)
        config = kubelet_config(port, pki / "ca.crt", self.containerd_socket, self.state_dir / "pod-logs", root)
        (root / "config.yaml").write_text(yaml.safe_dump(config))
        self._spawn("kubelet", [
            str(binary), "--config", str(root / "config.yaml"), "--kubeconfig", str(kc),
            "--root-dir", str(root), "--cert-dir", str(root / "pki"), "--hostname-override", NODE_NAME,
            "--node-ip", GATEWAY, "--node-labels", f"{GPU_PRODUCT_LABEL}={self.gpu_product}", "--v=1",
        ])

    def _wait_node_ready(self, timeout: float = 120) -> None:
        assert self.api is not None
        core = client.CoreV1Api(self.api)

        def ready() -> bool:
            self._check_procs()
            status = core.read_node(NODE_NAME).status
            return any(c.type == "Ready" and c.status == "True" for c in (status.conditions if status else None) or [])

        try:
            wait_for(ready, timeout, f"node {NODE_NAME} Ready", interval=0.5, retry_on=(ApiException,))
        except WaitTimeoutError as e:
            raise ClusterError(f"{e}\nkubelet log:\n{self.log_tail('kubelet')}") from e

    def _advertise_devices(self) -> None:
        assert self.api is not None
        core = client.CoreV1Api(self.api)
        extra = {GPU_RESOURCE: str(self.gpus), RDMA_RESOURCE: str(self.rdma_devices)}
        core.patch_node_status(NODE_NAME, {"status": {"capacity": extra, "allocatable": extra}})

        def advertised() -> bool:
            status = core.read_node(NODE_NAME).status
            alloc = (status.allocatable if status else None) or {}
            return all(alloc.get(k) == v for k, v in extra.items())

        wait_for(advertised, 30, f"{GPU_RESOURCE} on node {NODE_NAME}", interval=0.2)

    # ------------------------------------------------------------------ teardown
    def _delete_all_pods(self, timeout: float = 60) -> None:
        """Delete every pod with grace 0 and wait until the kubelet has torn their sandboxes down (CNI DEL)."""
        assert self.api is not None
        core = client.CoreV1Api(self.api)
        with contextlib.suppress(ApiException):
            for pod in core.list_pod_for_all_namespaces().items:
                if pod.metadata and pod.metadata.name and pod.metadata.namespace:
                    with contextlib.suppress(ApiException):
                        core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)
        with contextlib.suppress(WaitTimeoutError, ClusterError):
            wait_for(lambda: not self._ctr("containers", "ls", "-q", check=False).stdout.strip()
                     and not self._ctr("tasks", "ls", "-q", check=False).stdout.strip(),
                     timeout, "the kubelet to remove every container", interval=0.5)

    def _cleanup_stale(self) -> None:
        """Remove whatever a run from this state dir left: processes (by pid), shims, mounts, cgroups, netns,
        the bridge and the nftables table. Safe to call when nothing is left."""
        state = self.state_dir / "state.json"
        if state.exists():
            with contextlib.suppress(ValueError, OSError):
                for pid in json.loads(state.read_text()).get("pids", {}).values():
                    kill_if(pid, lambda cmd: str(self.state_dir) in cmd or cmd.startswith("socat"))
            state.unlink(missing_ok=True)
        sock = str(self.containerd_socket)
        for pid in pids():  # containerd-shim-runc-v2 ... -address <our socket>: they outlive containerd
            kill_if(pid, lambda cmd: "containerd-shim" in cmd and sock in cmd)
        kill_cgroup_members()  # the containers' processes: with their shims gone, init is their parent
        mounts = [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()]
        for m in sorted((m for m in mounts if m.startswith(str(self.state_dir))), key=len, reverse=True):
            _run("umount", "-l", m, check=False)
        for netns in Path("/var/run/netns").glob("cni-*") if Path("/var/run/netns").exists() else []:
            # netns files of our sandboxes: containerd names them cni-<uuid>; only ours run on this machine
            # when the bridge exists (the lock is ours)
            if _run("ip", "link", "show", BRIDGE, check=False).returncode == 0:
                _run("umount", str(netns), check=False)
                netns.unlink(missing_ok=True)
        remove_cgroups()
        remove_kubelet_chains()
        _run("nft", "delete", "table", "ip", NFT_TABLE, check=False)
        _run("ip", "link", "del", BRIDGE, check=False)
        shutil.rmtree(self.state_dir / "cni" / "ipam", ignore_errors=True)
        shutil.rmtree(self.state_dir / "kubelet" / "pods", ignore_errors=True)
