"""The local node's configuration files, pure (cluster.py ``LocalCluster`` writes them and starts the daemons):
containerd's ``config.toml`` (CRI with runc, overlayfs, the CNI plugins) and the kubelet's
``KubeletConfiguration`` (webhook authn/authz, cgroupfs under :data:`~disagg.local.host.CGROUP_ROOT`, the pod
CIDR, and no eviction or image GC for the host's disk)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .host import CGROUP_ROOT

POD_CIDR = "10.244.0.0/24"
GATEWAY = "10.244.0.1"
CNI_BIN_DIR = "/usr/lib/cni"
PAUSE_IMAGE = "localhost/disagg/pause:3.10"


def containerd_toml(d: Path, socket: Path, cni_conf_dir: Path) -> str:
    """containerd's config: state under ``d``, its gRPC socket at ``socket``, CNI configs in ``cni_conf_dir``."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{d / 'root'}"
state = "{d / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{d / 'containerd.sock.ttrpc'}"
[debug]
  address = "{d / 'debug.sock'}"
[metrics]
  address = ""
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "/usr/bin/runc"
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni_conf_dir}"
"""


def kubelet_config(port: int, ca: Path, socket: Path, pod_logs: Path, root: Path) -> dict[str, Any]:
    """The kubelet's KubeletConfiguration: serving on the bridge's gateway at ``port``, client certs checked
    against ``ca``, containerd at ``socket``, its volume plugins under ``root``."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": GATEWAY, "port": port, "readOnlyPort": 0, "healthzPort": 0,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs", "cgroupRoot": CGROUP_ROOT,
        "containerRuntimeEndpoint": f"unix://{socket}",
        "failSwapOn": False, "podCIDR": POD_CIDR, "maxPods": 64, "resolvConf": "/etc/resolv.conf",
        "podLogsDir": str(pod_logs),
        # shared machine: never evict or garbage-collect images because of the host's disk
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False, "syncFrequency": "10s", "fileCheckFrequency": "10s",
        "volumePluginDir": str(root / "volume-plugins"),
        "shutdownGracePeriod": "0s", "rotateCertificates": False,
    }
