"""Pod Security: the securityContext of every pod the operator renders, and the Pod Security Standard it meets.

Levels are Kubernetes' Pod Security Standards (https://kubernetes.io/docs/concepts/security/pod-security-standards/,
enforced by the apiserver's PodSecurity admission; the checks are in k8s.io/pod-security-admission/policy):

- ``restricted`` needs, for every container: ``runAsNonRoot: true`` and no ``runAsUser: 0``,
  ``allowPrivilegeEscalation: false``, ``capabilities.drop: [ALL]`` with only ``NET_BIND_SERVICE`` added,
  ``seccompProfile`` ``RuntimeDefault`` (or ``Localhost``), and only configMap/csi/downwardAPI/emptyDir/ephemeral/
  persistentVolumeClaim/projected/secret volumes.
- ``baseline`` allows adding only AUDIT_WRITE, CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, MKNOD, NET_BIND_SERVICE,
  SETFCAP, SETGID, SETPCAP, SETUID and SYS_CHROOT (check_capabilities_baseline.go).

So a pod that adds ``IPC_LOCK`` meets neither: its namespace must allow ``privileged``. That is the one exception
here: RDMA KV transfer registers (pins) memory beyond the default RLIMIT_MEMLOCK, which needs CAP_IPC_LOCK.
Kubernetes gives added capabilities to a non-root process only in its bounding set (no ambient capabilities,
kubernetes/kubernetes#56374), so CAP_IPC_LOCK is effective only for uid 0: RDMA workers run as root with every
other capability dropped, no privilege escalation and the runtime's seccomp profile. docs/kv-transport.md
("Pod Security") says how to run RDMA pools ``restricted`` where the nodes raise the memlock limit instead.

The other way to ``privileged`` is the user's choice of a ``hostPath`` model cache (``spec.model.cache.hostPath``):
``baseline`` refuses hostPath volumes (workers.py ``pool_security_level``; docs/install.md, "Model cache").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

Level = Literal["restricted", "baseline", "privileged"]
LEVELS: tuple[Level, ...] = ("restricted", "baseline", "privileged")  # strictest first

# The UID/GID of the images/ Dockerfiles (numeric, so that runAsNonRoot can verify it).
NON_ROOT_UID = 10001

# Capabilities each level lets a container add (k8s.io/pod-security-admission/policy/check_capabilities_*.go).
RESTRICTED_ADDABLE = frozenset({"NET_BIND_SERVICE"})
BASELINE_ADDABLE = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP",
    "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
})
# Added capabilities the operator makes effective by running the pod as uid 0 (an added capability only takes
# effect for uid 0 in Kubernetes, see above). A pod adding one of these runs as root.
ROOT_ONLY_CAPABILITIES = frozenset({"IPC_LOCK"})

SECCOMP_RUNTIME_DEFAULT = {"type": "RuntimeDefault"}


def pod_security_context(added_capabilities: Iterable[str] = ()) -> dict[str, Any]:
    """The pod-level securityContext: a numeric non-root identity, or root when a capability needs it."""
    if runs_as_root(added_capabilities):
        return {"runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0, "seccompProfile": dict(SECCOMP_RUNTIME_DEFAULT)}
    return {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        "fsGroup": NON_ROOT_UID,
        # Only re-own a volume whose root does not already match: a model PVC may hold millions of files.
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": dict(SECCOMP_RUNTIME_DEFAULT),
    }


def container_security_context(added_capabilities: Iterable[str] = (), *,
                                read_only_root_filesystem: bool = False) -> dict[str, Any]:
    """The container-level securityContext: no privilege escalation, every capability dropped but ``added``."""
    caps: dict[str, Any] = {"drop": ["ALL"]}
    added = list(added_capabilities)
    if added:
        caps["add"] = added
    out: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": caps}
    if read_only_root_filesystem:
        out["readOnlyRootFilesystem"] = True
    return out


def runs_as_root(added_capabilities: Iterable[str]) -> bool:
    return bool(ROOT_ONLY_CAPABILITIES & set(added_capabilities))


def level_for(added_capabilities: Iterable[str]) -> Level:
    """The strictest Pod Security Standard a pod built with these two functions meets, given what it adds."""
    added = set(added_capabilities)
    if added - BASELINE_ADDABLE:
        return "privileged"
    if added - RESTRICTED_ADDABLE or runs_as_root(added):
        return "baseline"
    return "restricted"
