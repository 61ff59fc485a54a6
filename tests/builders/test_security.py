"""Security contexts of the rendered pods (the apiserver's verdict on them is tests/test_pod_security.py)."""

from __future__ import annotations

from typing import Any

import pytest

from disagg.builders import BuildSettings, build_children, parse_model
from disagg.builders.router import router_deployment
from disagg.builders.security import NON_ROOT_UID, level_for
from disagg.builders.workers import CACHE_VOLUME, HF_CACHE_DIR, HOME_DIR, pool_security_level, worker_deployment

from .conftest import example_body, model

TRANSPORTS = ["rdma", "nvlink", "tcp", "auto"]
AGGREGATED = {"replicas": 1, "gpu": {"count": 1}}


def pod_spec(dep: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = dep["spec"]["template"]["spec"]
    return spec


def assert_hardened(spec: dict[str, Any], *, root: bool, add: list[str]) -> None:
    pod = spec["securityContext"]
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    if root:
        assert pod["runAsUser"] == 0 and pod["runAsNonRoot"] is False
    else:
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] == NON_ROOT_UID
    for cont in spec["containers"]:
        ctx = cont["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False
        assert ctx["capabilities"]["drop"] == ["ALL"]
        assert ctx["capabilities"].get("add", []) == add
        assert "privileged" not in ctx
    assert not any(k in spec for k in ("hostNetwork", "hostPID", "hostIPC"))
    assert all("hostPath" not in v for v in spec.get("volumes", []))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_workers_are_hardened_per_transport(transport: str) -> None:
    rdma = transport == "rdma"
    dm = model(kvTransfer={"transport": transport, **({"rdma": {}} if rdma else {})}, aggregated=AGGREGATED)
    for role in ("prefill", "decode"):
        assert_hardened(pod_spec(worker_deployment(dm, role)), root=rdma, add=["IPC_LOCK"] if rdma else [])
        assert pool_security_level(dm, role) == ("privileged" if rdma else "restricted")
    # The aggregated pool moves no KV cache: no IPC_LOCK, non-root, whatever the transport.
    assert_hardened(pod_spec(worker_deployment(dm, "aggregated")), root=False, add=[])
    assert pool_security_level(dm, "aggregated") == "restricted"


def test_router_is_hardened() -> None:
    spec = pod_spec(router_deployment(model(), BuildSettings()))
    assert_hardened(spec, root=False, add=[])
    assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("name", ["llama-8b-nvlink", "llama-70b-rdma", "local-demo", "aggregated-rollback"])
def test_every_rendered_pod_has_a_security_context(name: str) -> None:
    for obj in build_children(parse_model(example_body(name))):
        if obj["kind"] == "Deployment":
            spec = pod_spec(obj)
            assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
            assert all(ct["securityContext"]["allowPrivilegeEscalation"] is False for ct in spec["containers"])


def test_workers_get_a_writable_home_for_a_non_root_user() -> None:
    spec = pod_spec(worker_deployment(model(), "decode"))
    cont = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in cont["env"]}
    assert env["HOME"] == HOME_DIR
    assert env["USER"]  # getpass.getuser() (torch inductor) fails for a uid without a passwd entry otherwise
    mount = next(m for m in cont["volumeMounts"] if m["mountPath"] == HOME_DIR)
    assert {"name": mount["name"], "emptyDir": {}} in spec["volumes"]
    assert spec["securityContext"]["fsGroup"] == NON_ROOT_UID


def test_users_home_and_user_env_are_not_duplicated() -> None:
    dm = model(engine={"image": "vllm/vllm-openai:v0.11.2", "env": [{"name": "HOME", "value": "/cache"}]})
    env = pod_spec(worker_deployment(dm, "prefill"))["containers"][0]["env"]
    assert [e["value"] for e in env if e["name"] == "HOME"] == ["/cache"]
    assert len([e for e in env if e["name"] == "USER"]) == 1


def test_pod_template_overrides_merge_into_the_security_context() -> None:
    body = example_body("llama-8b-nvlink")
    body["spec"]["decode"]["podTemplate"] = {
        "spec": {
            "securityContext": {"runAsUser": 2000, "supplementalGroups": [44]},
            "containers": [{"name": "vllm", "securityContext": {"readOnlyRootFilesystem": True}}],
        }
    }
    spec = pod_spec(worker_deployment(parse_model(body), "decode"))
    pod = spec["securityContext"]
    assert pod["runAsUser"] == 2000 and pod["supplementalGroups"] == [44]
    assert pod["runAsNonRoot"] is True and pod["seccompProfile"] == {"type": "RuntimeDefault"}
    ctx = spec["containers"][0]["securityContext"]
    assert ctx == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}


def test_rdma_override_to_restricted() -> None:
    """Where the nodes raise RLIMIT_MEMLOCK for containers, IPC_LOCK can go and the pool runs restricted."""
    body = example_body("llama-70b-rdma")
    body["spec"]["prefill"]["podTemplate"] = RDMA_RESTRICTED_OVERRIDE
    spec = pod_spec(worker_deployment(parse_model(body), "prefill"))
    assert_hardened(spec, root=False, add=[])


# docs/kv-transport.md ("Pod Security") shows this override.
RDMA_RESTRICTED_OVERRIDE: dict[str, Any] = {
    "spec": {
        "securityContext": {"runAsNonRoot": True, "runAsUser": NON_ROOT_UID, "runAsGroup": NON_ROOT_UID},
        "containers": [{"name": "vllm", "securityContext": {"capabilities": {"add": []}}}],
    }
}


@pytest.mark.parametrize("added,want", [
    ([], "restricted"),
    (["NET_BIND_SERVICE"], "restricted"),
    (["CHOWN"], "baseline"),
    (["IPC_LOCK"], "privileged"),
    (["SYS_ADMIN"], "privileged"),
])
def test_level_for(added: list[str], want: str) -> None:
    assert level_for(added) == want


# ----------------------------------------------------------------------------------------- model cache


def test_no_model_cache_by_default() -> None:
    spec = pod_spec(worker_deployment(model(), "decode"))
    assert "initContainers" not in spec
    assert "HF_HOME" not in {e["name"] for e in spec["containers"][0]["env"]}


@pytest.mark.parametrize("transport", ["tcp", "rdma"])
def test_host_path_model_cache(transport: str) -> None:
    dm = model(model={"name": "meta-llama/Llama-3.1-8B-Instruct", "cache": {"hostPath": "/var/cache/disagg-models"}},
               kvTransfer={"transport": transport, **({"rdma": {}} if transport == "rdma" else {})},
               aggregated=AGGREGATED)
    for role in ("prefill", "decode", "aggregated"):
        spec = pod_spec(worker_deployment(dm, role))
        cont = spec["containers"][0]
        assert {"name": CACHE_VOLUME, "hostPath": {"path": "/var/cache/disagg-models", "type": "DirectoryOrCreate"}} \
            in spec["volumes"]
        assert {"name": CACHE_VOLUME, "mountPath": HF_CACHE_DIR} in cont["volumeMounts"]
        assert HF_CACHE_DIR.startswith(HOME_DIR + "/")
        assert {"name": "HF_HOME", "value": HF_CACHE_DIR} in cont["env"]
        assert pool_security_level(dm, role) == "privileged"  # hostPath: neither baseline nor restricted
        root = spec["securityContext"]["runAsUser"] == 0
        if root:  # rdma workers run as root: the cache needs no new owner
            assert "initContainers" not in spec
            continue
        [init] = spec["initContainers"]  # hands the kubelet-created (root-owned) directory to the worker's uid
        assert init["command"] == ["chown", "-R", f"{NON_ROOT_UID}:{NON_ROOT_UID}", HF_CACHE_DIR]
        assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
        assert init["securityContext"]["allowPrivilegeEscalation"] is False
        assert init["volumeMounts"] == [{"name": CACHE_VOLUME, "mountPath": HF_CACHE_DIR}]


def test_pvc_model_cache_keeps_restricted() -> None:
    dm = model(model={"name": "meta-llama/Llama-3.1-8B-Instruct", "cache": {"pvc": {"claimName": "hf-cache"}}})
    for role in ("prefill", "decode"):
        spec = pod_spec(worker_deployment(dm, role))
        assert {"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": "hf-cache"}} in spec["volumes"]
        assert {"name": CACHE_VOLUME, "mountPath": HF_CACHE_DIR} in spec["containers"][0]["volumeMounts"]
        assert "initContainers" not in spec  # fsGroup makes the claim writable for the worker's uid
        assert pool_security_level(dm, role) == "restricted"
        assert_hardened(spec, root=False, add=[])
