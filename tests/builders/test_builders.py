"""Table tests of the pure builders: args, transport, resources, placement, labels, hashes, errors."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from disagg.api import contract as c
from disagg.api.contract import Role
from disagg.api.models import DisaggregatedModel
from disagg.builders import (
    BuildSettings,
    build_children,
    compat_hash,
    desired_replicas,
    multinode,
    parse_model,
    router_config,
    worker_args,
)
from disagg.builders.vllm import image_version, supports_shutdown_timeout
from disagg.builders.workers import GRACE_MARGIN_SECONDS, engine_profile, worker_deployment
from disagg.perf.costs import EngineCost, plateau_chunk_budget, prefill_chunk_budget, tpot_chunk_budget

from .conftest import UID, example_body, model, refused


def by_ref(dm: DisaggregatedModel) -> dict[str, dict[str, Any]]:
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in build_children(dm)}


def container(dm: DisaggregatedModel, role: Role) -> dict[str, Any]:
    cont: dict[str, Any] = worker_deployment(dm, role)["spec"]["template"]["spec"]["containers"][0]
    return cont


def env_of(cont: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in cont["env"]}


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def kv_config(args: list[str]) -> dict[str, Any]:
    """The parsed ``--kv-transfer-config`` of a worker's args (the flag must be there)."""
    value = flag(args, "--kv-transfer-config")
    assert value is not None
    parsed: dict[str, Any] = json.loads(value)
    return parsed


# ------------------------------------------------------------------------------------------------ args


def test_worker_args_order_and_kv_roles() -> None:
    dm = model("llama-70b-rdma")
    pairs: tuple[tuple[Role, str], ...] = (("prefill", "kv_producer"), ("decode", "kv_consumer"))
    for role, kv_role in pairs:
        args = worker_args(dm, role)
        assert args[0] == "/models/llama-3.1-70b-instruct"  # PVC path under the mount
        assert args[1:7] == ["--port", "8000", "--served-model-name", "llama-70b", "--tensor-parallel-size", "8"]
        assert flag(args, "--max-model-len") == "65536"
        kv = kv_config(args)
        assert kv["kv_connector"] == "NixlConnector" and kv["kv_role"] == kv_role
        assert args[-1] == "--enable-prefix-caching"  # user args last
    assert flag(worker_args(dm, "prefill"), "--max-num-batched-tokens") == "16384"
    assert flag(worker_args(dm, "decode"), "--max-num-seqs") == "512"
    assert "kv_load_failure_policy" not in kv_config(worker_args(dm, "prefill"))
    assert kv_config(worker_args(dm, "decode"))["kv_load_failure_policy"] == "recompute"


def test_chunk_budgets_of_the_pools_that_run_streams() -> None:
    """Unset maxNumBatchedTokens: the decode pool gets the TPOT-bounded chunk, the prefill pool of an elastic fleet
    the same but never below the prefill plateau, a prefill-only pool and the aggregated pool vLLM's default; the
    router's engine profile says the same as the flag."""
    for tpot_ms in (25, 50, 100):
        body = example_body("llama-8b-nvlink")
        body["spec"]["slo"] = {"ttftP95Ms": 1000, "tpotP95Ms": tpot_ms}
        body["spec"]["aggregated"] = {"replicas": 1, "gpu": {"count": 1, "product": "NVIDIA-H100-80GB-HBM3"}}
        for role in ("prefill", "decode"):
            body["spec"][role].pop("maxNumBatchedTokens", None)
        dm = parse_model(body)
        cost = EngineCost.from_profile(c.EngineProfile(gpu="H100-SXM", model=dm.spec.model.name))
        seqs = {r: getattr(dm.spec, r).max_num_seqs or cost.max_num_seqs for r in ("prefill", "decode")}
        decode = tpot_chunk_budget(cost, tpot_ms / 1000.0, seqs["decode"])
        prefill = prefill_chunk_budget(cost, tpot_ms / 1000.0, seqs["prefill"])
        assert flag(worker_args(dm, "decode"), "--max-num-batched-tokens") == str(decode)
        own = tpot_chunk_budget(cost, tpot_ms / 1000.0, seqs["prefill"])
        assert prefill == max(own, plateau_chunk_budget(cost))
        assert flag(worker_args(dm, "prefill"), "--max-num-batched-tokens") == str(prefill)
        assert (prefill == plateau_chunk_budget(cost) > own) == (tpot_ms == 25)  # 8B, H100: 1024 < the plateau
        assert "--max-num-batched-tokens" not in worker_args(dm, "aggregated")
        roles: tuple[Role, ...] = ("prefill", "decode")
        for role in roles:
            rendered = flag(worker_args(dm, role), "--max-num-batched-tokens")
            assert engine_profile(dm.spec, role).max_num_batched_tokens == (int(rendered) if rendered else None)
        body["spec"].setdefault("routing", {})["elasticFleet"] = False  # prefill workers only prefill
        assert "--max-num-batched-tokens" not in worker_args(parse_model(body), "prefill")
        body["spec"]["prefill"]["maxNumBatchedTokens"] = 12288  # the spec's own value wins
        assert flag(worker_args(parse_model(body), "prefill"), "--max-num-batched-tokens") == "12288"


def test_the_prefill_plateau_is_where_a_larger_chunk_stops_paying() -> None:
    cost = EngineCost.from_profile(c.EngineProfile(gpu="H100-SXM", model="Llama-3.1-8B"))
    plateau = plateau_chunk_budget(cost)
    rate = {b: b / cost.prefill(b).step_s for b in range(256, cost.budget + 1, 256)}
    assert plateau % 256 == 0 and rate[plateau] >= 0.99 * max(rate.values())
    assert rate[plateau - 256] < 0.99 * max(rate.values())  # the smallest such
    assert plateau < cost.budget  # vLLM's 8192 on an H100 is past it
    # a tight TPOT target does not shrink a prefill worker's chunk below the plateau; a loose one may raise it
    assert prefill_chunk_budget(cost, 0.01) == plateau
    assert prefill_chunk_budget(cost, 0.1) == tpot_chunk_budget(cost, 0.1) > plateau


def test_hub_model_and_extra_config_and_parallelism() -> None:
    body = example_body("llama-8b-nvlink")
    body["spec"]["kvTransfer"]["extraConfig"] = {"backends": ["UCX"]}
    body["spec"]["kvTransfer"]["loadFailurePolicy"] = "fail"
    body["spec"]["decode"]["parallelism"] = {"tensor": 2, "pipeline": 2, "data": 2}
    body["spec"]["decode"]["gpu"] = {}
    dm = parse_model(body)
    args = worker_args(dm, "decode")
    assert args[0] == "meta-llama/Llama-3.1-8B-Instruct"
    assert flag(args, "--pipeline-parallel-size") == "2" and flag(args, "--data-parallel-size") == "2"
    assert kv_config(args) == {
        "kv_connector": "NixlConnector", "kv_role": "kv_consumer", "kv_load_failure_policy": "fail",
        "kv_connector_extra_config": {"backends": ["UCX"]}}
    assert container(dm, "decode")["resources"]["limits"]["nvidia.com/gpu"] == "8"  # tp × pp × dp
    assert "--pipeline-parallel-size" not in worker_args(dm, "prefill")
    hf = env_of(container(dm, "prefill"))["HF_TOKEN"]
    assert hf == {"secretKeyRef": {"name": "hf-token", "key": "token"}}


@pytest.mark.parametrize("image,version,shutdown", [
    ("vllm/vllm-openai:v0.11.2", (0, 11, 2), False),
    ("vllm/vllm-openai:v0.18.0", (0, 18, 0), True),
    ("registry:5000/vllm/vllm-openai:0.33.1-cu129", (0, 33, 1), True),
    # no version in the tag: rendered for the default release (which drains), and said so in a condition
    ("vllm/vllm-openai:latest", None, True),
    ("vllm/vllm-openai@sha256:abcd", None, True),
])
def test_shutdown_timeout_only_for_vllm_that_knows_it(image: str, version: tuple[int, int, int] | None,
                                                      shutdown: bool) -> None:
    assert image_version(image) == version
    assert supports_shutdown_timeout(image) is shutdown
    dm = model(engine={"image": image, "shutdownTimeoutSeconds": 120})
    args = worker_args(dm, "decode")
    assert (flag(args, "--shutdown-timeout") == "120") is shutdown
    pod = worker_deployment(dm, "decode")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 120 + GRACE_MARGIN_SECONDS > 120


@pytest.mark.parametrize("where,arg", [("engine", "--port=9000"), ("prefill", "--kv-transfer-config"),
                                       ("decode", "-tp"), ("engine", "--served-model-name")])
def test_operator_owned_flags_are_refused_in_extra_args(where: str, arg: str) -> None:
    # the CRD's CEL rule (rules.py), which parse_model applies as the apiserver does
    body = example_body("llama-8b-nvlink")
    body["spec"].setdefault(where, {})["extraArgs"] = ["--enforce-eager", arg]
    with pytest.raises(ValidationError, match=rf"spec\.{where}\.extraArgs: extraArgs must not set a flag the operator"):
        parse_model(body)


@pytest.mark.parametrize("where,arg", [("engine", "--serv"), ("prefill", "--kv-transfer"), ("decode", "-t"),
                                       ("aggregated", "--tensor-parallel=2")])
def test_abbreviated_owned_flags_are_refused_by_the_operator(where: str, arg: str) -> None:
    # argparse's abbreviations are beyond the CEL rule's pattern: the operator's own check refuses them (InvalidSpec)
    body = example_body("llama-8b-nvlink")
    body["spec"].setdefault(where, {})["extraArgs"] = ["--enforce-eager", arg]
    dm = parse_model(body)
    flag_ = re.escape(arg.split("=")[0])
    assert re.search(rf"^spec\.{where}\.extraArgs\[1\]: {flag_} \(an abbreviation of --", refused(dm))


# ------------------------------------------------------------------------------------------- transport

TRANSPORTS: dict[str, dict[str, Any]] = {
    "rdma": {"ucx_tls": "rc,cuda_copy,cuda_ipc", "ipc_lock": True, "rdma": "1", "affinity": False},
    "nvlink": {"ucx_tls": "cuda_ipc,cuda_copy,tcp", "ipc_lock": False, "rdma": None, "affinity": True},
    "tcp": {"ucx_tls": "tcp,cuda_copy", "ipc_lock": False, "rdma": None, "affinity": False},
    "auto": {"ucx_tls": None, "ipc_lock": False, "rdma": None, "affinity": False},
}


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_transport(transport: str) -> None:
    want = TRANSPORTS[transport]
    rdma: dict[str, Any] = {"rdma": {}} if transport == "rdma" else {}  # rdma/ib x 1, explicitly
    dm = model(kvTransfer={"transport": transport, "sideChannelPort": 5601, **rdma})
    for role in ("prefill", "decode"):
        cont = container(dm, role)
        env = env_of(cont)
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"
        assert env.get("UCX_TLS") == want["ucx_tls"]
        assert "UCX_NET_DEVICES" not in env
        ports = {p["name"]: p["containerPort"] for p in cont["ports"]}
        assert ports == {c.WORKER_PORT_NAME: 8000, c.SIDE_CHANNEL_PORT_NAME: 5601}
        caps = cont.get("securityContext", {}).get("capabilities", {}).get("add", [])
        assert ("IPC_LOCK" in caps) is want["ipc_lock"]
        assert cont["resources"]["limits"].get("rdma/ib") == want["rdma"]
        affinity = worker_deployment(dm, role)["spec"]["template"]["spec"].get("affinity", {})
        terms = affinity.get("podAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", [])
        assert bool(terms) is want["affinity"]
        if terms:
            assert terms[0]["topologyKey"] == "kubernetes.io/hostname"
            exprs = {e["key"]: e["values"] for e in terms[0]["labelSelector"]["matchExpressions"]}
            assert exprs == {c.LABEL_MODEL: ["llama-8b"], c.LABEL_ROLE: ["prefill", "decode"]}


def test_rdma_devices_and_resource() -> None:
    dm = model("llama-70b-rdma")
    cont = container(dm, "decode")
    assert env_of(cont)["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1"
    assert cont["resources"]["limits"] == {"nvidia.com/gpu": "8", "rdma/ib": "1"}
    dm = model("llama-70b-rdma", kvTransfer={"transport": "rdma", "rdma": {"resourceName":
                                                                         "rdma/hca_shared_devices_a", "count": 2}})
    assert container(dm, "prefill")["resources"]["limits"]["rdma/hca_shared_devices_a"] == "2"


def test_side_channel_port_must_differ_from_http_port() -> None:
    assert re.search(r"spec\.kvTransfer\.sideChannelPort", refused(model(kvTransfer={"sideChannelPort": 8000})))


# ------------------------------------------------------------------------------------ pods and placement


def test_gpu_resources_node_selector_tolerations_and_shm() -> None:
    body = example_body("llama-70b-rdma")
    body["spec"]["decode"]["nodeSelector"] = {"pool": "decode"}
    body["spec"]["decode"]["tolerations"] = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    body["spec"]["decode"]["gpu"]["productLabel"] = "example.com/gpu"
    body["spec"]["decode"]["resources"] = {"requests": {"cpu": "8", "memory": "64Gi"}}
    dm = parse_model(body)
    pre = worker_deployment(dm, "prefill")["spec"]["template"]["spec"]
    dec = worker_deployment(dm, "decode")["spec"]["template"]["spec"]
    assert pre["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert dec["nodeSelector"] == {"pool": "decode", "example.com/gpu": "NVIDIA-H200"}
    assert dec["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert dec["containers"][0]["resources"] == {"requests": {"cpu": "8", "memory": "64Gi"},
                                                 "limits": {"nvidia.com/gpu": "8", "rdma/ib": "1"}}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in dec["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in dec["containers"][0]["volumeMounts"]
    pvc = {"name": "model", "persistentVolumeClaim": {"claimName": "model-weights", "readOnly": True}}
    assert pvc in dec["volumes"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert dec["containers"][0][probe]["httpGet"] == {"path": "/health", "port": c.WORKER_PORT_NAME}


def test_pod_template_overrides_merge_by_name_and_keep_selector_labels() -> None:
    body = example_body("llama-8b-nvlink")
    body["spec"]["decode"]["podTemplate"] = {
        "metadata": {"labels": {"team": "a", c.LABEL_ROLE: "hijack"}},
        "spec": {"containers": [{"name": "vllm", "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]},
                                {"name": "sidecar", "image": "busybox"}],
                 "priorityClassName": "inference"},
    }
    dep = worker_deployment(parse_model(body), "decode")
    tpl = dep["spec"]["template"]
    assert tpl["metadata"]["labels"]["team"] == "a"
    assert tpl["metadata"]["labels"][c.LABEL_ROLE] == "decode"  # selector labels survive overrides
    names = [ct["name"] for ct in tpl["spec"]["containers"]]
    assert names == ["vllm", "sidecar"]
    env = env_of(tpl["spec"]["containers"][0])
    assert env["VLLM_LOGGING_LEVEL"] == "DEBUG" and "VLLM_NIXL_SIDE_CHANNEL_HOST" in env
    assert tpl["spec"]["priorityClassName"] == "inference"


# ------------------------------------------------------------------------------ metadata, names, hashes


def test_owner_references_labels_and_names(example: str) -> None:
    dm = parse_model(example_body(example))
    name = dm.metadata["name"]
    objs = build_children(dm)
    assert len({(o["kind"], o["metadata"]["name"]) for o in objs}) == len(objs)
    for o in objs:
        meta = o["metadata"]
        assert meta["namespace"] == "serving"
        assert meta["ownerReferences"] == [{"apiVersion": "serving.disagg.dev/v1alpha1", "kind":
                                            "DisaggregatedModel", "name": name, "uid": UID, "controller": True,
                                            "blockOwnerDeletion": True}]
        labels = meta["labels"]
        assert labels[c.LABEL_NAME] == "disagg" and labels[c.LABEL_INSTANCE] == name
        assert labels[c.LABEL_MODEL] == name and labels[c.LABEL_MANAGED_BY] == "disagg-operator"
        if multinode.LABEL_GROUP in labels:  # a multi-node group's Service and StatefulSets (builders/multinode.py)
            assert meta["name"].startswith(labels[multinode.LABEL_GROUP])
            assert labels[multinode.LABEL_GROUP].startswith(c.pool_name(name, labels[multinode.LABEL_POOL]) + "-")
            continue
        assert labels[c.LABEL_ROLE] == labels[c.LABEL_COMPONENT]
        assert meta["name"] in (c.pool_name(name, labels[c.LABEL_ROLE]), c.router_name(name))
    deps = [o for o in objs if o["kind"] == "Deployment"]
    for d in deps:
        role = d["metadata"]["labels"][c.LABEL_ROLE]
        assert d["spec"]["selector"]["matchLabels"] == {c.LABEL_MODEL: name, c.LABEL_ROLE: role}
        assert d["spec"]["template"]["metadata"]["labels"][c.LABEL_ROLE] == role


def test_render_without_uid_has_no_owner_references() -> None:
    body = example_body("llama-8b-nvlink")
    del body["metadata"]["uid"]
    assert all("ownerReferences" not in o["metadata"] for o in build_children(parse_model(body)))


def test_compat_hash_equal_across_pools_and_changes_with_image() -> None:
    dm = model("llama-70b-rdma")
    assert compat_hash(dm.spec, "prefill") == compat_hash(dm.spec, "decode")
    other = model("llama-70b-rdma", engine={"image": "vllm/vllm-openai:v0.18.0"})
    assert compat_hash(other.spec, "prefill") != compat_hash(dm.spec, "prefill")
    # Pool-local settings that NIXL tolerates do not split generations...
    body = example_body("llama-70b-rdma")
    body["spec"]["decode"].update(replicas=3, maxNumSeqs=64, extraArgs=["--enforce-eager"])
    body["spec"]["decode"]["gpu"]["product"] = "NVIDIA-B200"
    assert compat_hash(parse_model(body).spec, "decode") == compat_hash(dm.spec, "decode")
    # ...KV-layout settings do: a decode pool with another KV-cache dtype is never paired with this prefill pool.
    body["spec"]["decode"]["extraArgs"] = ["--kv-cache-dtype", "fp8"]
    changed = parse_model(body)
    assert compat_hash(changed.spec, "decode") != compat_hash(changed.spec, "prefill")
    for role in ("prefill", "decode"):
        dep = worker_deployment(changed, role)
        assert dep["spec"]["template"]["metadata"]["labels"][c.LABEL_COMPAT] == compat_hash(changed.spec, role)


def test_model_name_too_long_for_services() -> None:
    body = example_body("llama-8b-nvlink")
    body["metadata"]["name"] = "m" * 56
    assert re.search(r"metadata\.name: .* would be named .*-prefill.*at most 55", refused(parse_model(body)))
    body["metadata"]["name"] = "1-model"
    assert re.search("DNS-1035", refused(parse_model(body)))


# ----------------------------------------------------------------------------------- modes and router


def test_aggregated_pool_has_no_kv_connector() -> None:
    dm = model(aggregated={"replicas": 2, "gpu": {"count": 1}})
    refs = by_ref(dm)
    dep = refs["Deployment/llama-8b-aggregated"]
    cont = dep["spec"]["template"]["spec"]["containers"][0]
    assert "--kv-transfer-config" not in cont["args"]
    assert not any(e["name"].startswith(("VLLM_NIXL", "UCX_")) for e in cont["env"])
    assert [p["name"] for p in cont["ports"]] == [c.WORKER_PORT_NAME]
    assert dep["spec"]["replicas"] == 2
    assert "Service/llama-8b-aggregated" in refs and "PodDisruptionBudget/llama-8b-aggregated" in refs
    agg = router_config(dm).pools.aggregated
    assert agg is not None and (agg.service, agg.port) == ("llama-8b-aggregated", 8000)
    # the SLO placement's prior: the pool's engines as the spec describes them (vLLM's default budget here)
    assert agg.engine is not None and agg.engine.max_num_batched_tokens is None


@pytest.mark.parametrize("mode,status_mode,want", [
    ("Auto", None, "Disaggregated"),
    ("Auto", "Aggregated", "Aggregated"),
    ("Aggregated", None, "Aggregated"),
    ("Disaggregated", "Aggregated", "Disaggregated"),
])
def test_router_config_active_mode(mode: str, status_mode: str | None, want: str) -> None:
    body = example_body("llama-8b-nvlink")
    body["spec"]["mode"] = mode
    if status_mode:
        body["status"] = {"activeMode": status_mode}
    dm = parse_model(body)
    cm = by_ref(dm)["ConfigMap/llama-8b-router"]
    cfg = c.RouterConfig.model_validate(yaml.safe_load(cm["data"][c.ROUTER_CONFIG_KEY]))
    assert cfg.active_mode.value == want and cfg.effective_mode().value == want
    assert cfg.model == "llama-8b"
    assert cfg.pools.prefill is not None and cfg.pools.prefill.service == "llama-8b-prefill"
    assert cfg.pools.decode is not None and cfg.pools.decode.service == "llama-8b-decode"
    # workers keep their KV connector in both modes (a mode flip restarts nothing)
    assert "--kv-transfer-config" in worker_args(dm, "prefill")


@pytest.mark.parametrize("status_mode,want", [(None, (2, 0)), ("Aggregated", (0, 0))])
def test_router_config_carries_the_role_moves(status_mode: str | None, want: tuple[int, int]) -> None:
    # status.roleMoves (the predictive autoscaler's) reach the router as activeMode does; none while aggregated
    body = example_body("llama-8b-nvlink")
    body["status"] = {"roleMoves": {"prefillToDecode": 2, "reason": "decode short", "time": "2026-12-06T10:00:00Z"}}
    if status_mode:
        body["status"]["activeMode"] = status_mode
    cm = by_ref(parse_model(body))["ConfigMap/llama-8b-router"]
    cfg = c.RouterConfig.model_validate(yaml.safe_load(cm["data"][c.ROUTER_CONFIG_KEY]))
    if want == (0, 0):
        assert cfg.role_moves is None and "roleMoves" not in cm["data"][c.ROUTER_CONFIG_KEY]
    else:
        assert cfg.role_moves is not None
        assert (cfg.role_moves.prefill_to_decode, cfg.role_moves.decode_to_prefill) == want
        assert cfg.role_moves.lends() == {"decode": want[0], "prefill": want[1]}


def test_router_objects() -> None:
    dm = model("llama-70b-rdma")
    refs = {f"{o['kind']}/{o['metadata']['name']}": o
            for o in build_children(dm, BuildSettings(router_image="r:1", router_replicas=2))}
    dep = refs["Deployment/llama-70b-router"]
    cont = dep["spec"]["template"]["spec"]["containers"][0]
    assert cont["image"] == "r:1" and dep["spec"]["replicas"] == 2
    assert cont["command"] == ["disagg", "router", "--config", "/etc/disagg/router.yaml", "--host", "0.0.0.0",
                               "--port", str(c.ROUTER_PORT), "--workers", "1"]
    # in the Service only once it knows a worker to send to (the soak saw 503s from a new router otherwise)
    assert cont["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert cont["livenessProbe"]["httpGet"]["path"] == "/health"
    env = env_of(cont)
    assert env == {"POD_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}}, "DISAGG_MODEL_NAME": "llama-70b"}
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "llama-70b-router"
    svc = refs["Service/llama-70b-router"]
    assert svc["spec"]["ports"][0]["port"] == c.ROUTER_PORT
    for role in ("prefill", "decode"):
        assert refs[f"Service/llama-70b-{role}"]["spec"]["clusterIP"] == "None"
    binding = refs["RoleBinding/llama-70b-router"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llama-70b-router", "namespace": "serving"}]
    cfg = yaml.safe_load(refs["ConfigMap/llama-70b-router"]["data"][c.ROUTER_CONFIG_KEY])
    assert cfg["transferTimeoutMs"] == 5000 and cfg["rollout"]["canary"]["trafficPercent"] == 5


# --------------------------------------------------------------------------------------------- replicas


def test_replicas_owner() -> None:
    body = example_body("llama-70b-rdma")  # autoscaling enabled, prefill 1..6, initial 2
    assert desired_replicas(parse_model(body), "prefill") == 2
    body["status"] = {"pools": {"prefill": {"desiredReplicas": 5}, "decode": {"desiredReplicas": 100}}}
    dm = parse_model(body)
    assert desired_replicas(dm, "prefill") == 5
    assert desired_replicas(dm, "decode") == 8  # clamped to maxReplicas
    body["spec"]["autoscaling"]["enabled"] = False
    assert desired_replicas(parse_model(body), "prefill") == 2  # spec wins when autoscaling is off


# ------------------------------------------------------------------------------------- issue 13 day-2 safety


@pytest.mark.parametrize("spelling", [["--kv_cache_dtype", "fp8"], ["--kv-cache-dtype=fp8"], ["--kv_cache_dtype=fp8"],
                                      ["--enforce-eager", "--kv-cache-dtype", "fp8"]])
def test_every_spelling_of_a_kv_layout_flag_splits_generations(spelling: list[str]) -> None:
    canonical = example_body("llama-70b-rdma")
    canonical["spec"]["decode"]["extraArgs"] = ["--kv-cache-dtype", "fp8"]
    written = example_body("llama-70b-rdma")
    written["spec"]["decode"]["extraArgs"] = spelling
    want, got = parse_model(canonical).spec, parse_model(written).spec
    assert compat_hash(got, "decode") == compat_hash(want, "decode") != compat_hash(got, "prefill")


def test_kv_layout_args_are_canonical() -> None:
    from disagg.builders.workers import kv_layout_args

    assert kv_layout_args(["-q", "awq", "--enforce-eager", "--speculative_config.method=eagle", "--max-num-seqs", "8",
                           "--disable_hybrid_kv_cache_manager", "--block-size=32"]) == [
        "--quantization=awq", "--speculative-config.method=eagle", "--disable-hybrid-kv-cache-manager",
        "--block-size=32"]


def test_engine_env_replaces_the_operators_variable_of_the_same_name() -> None:
    env = [{"name": "UCX_TLS", "value": "rc,cuda_copy"}, {"name": "HOME", "value": "/cache"},
           {"name": "VLLM_LOGGING_LEVEL", "value": "INFO"}, {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]
    dm = model("llama-70b-rdma", engine={"env": env})
    for role in ("prefill", "decode"):
        entries = container(dm, role)["env"]
        names = [e["name"] for e in entries]
        assert len(names) == len(set(names)), names  # server-side apply refuses a name twice (list map by name)
        assert [e for e in entries if e["name"] == "UCX_TLS"] == [{"name": "UCX_TLS", "value": "rc,cuda_copy"}]
        assert env_of(container(dm, role))["HOME"] == "/cache"
        assert env_of(container(dm, role))["VLLM_LOGGING_LEVEL"] == "DEBUG"  # the last entry of a name
        assert names[-3:] == ["UCX_TLS", "HOME", "VLLM_LOGGING_LEVEL"]  # the user's entries last, in their order
    # without the override, the operator's value
    assert env_of(container(model("llama-70b-rdma"), "decode"))["UCX_TLS"] == "rc,cuda_copy,cuda_ipc"


@pytest.mark.parametrize("rolling,want", [
    ({}, {"maxSurge": 1, "maxUnavailable": 0}),
    ({"maxSurge": 0, "maxUnavailable": 1}, {"maxSurge": 0, "maxUnavailable": 1}),
    ({"maxSurge": "25%", "maxUnavailable": "50%"}, {"maxSurge": "25%", "maxUnavailable": "50%"}),
])
def test_rolling_update_per_pool(rolling: dict[str, Any], want: dict[str, Any]) -> None:
    body = example_body("llama-70b-rdma")
    body["spec"]["decode"]["rollingUpdate"] = rolling
    dm = parse_model(body)
    strategy = worker_deployment(dm, "decode")["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": want}
    # the other pool keeps the default
    assert worker_deployment(dm, "prefill")["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1,
                                                                                      "maxUnavailable": 0}


def test_rolling_update_both_zero_is_refused_naming_the_field() -> None:
    body = example_body("llama-8b-nvlink")
    body["spec"]["prefill"]["rollingUpdate"] = {"maxSurge": "0%", "maxUnavailable": 0}
    with pytest.raises(ValidationError, match=r"spec\.prefill\.rollingUpdate\.maxUnavailable: maxUnavailable may "
                                              r"not be 0 when maxSurge is 0"):
        parse_model(body)


@pytest.mark.parametrize("key", ["args", "command"])
def test_pod_template_may_not_override_the_vllm_command_or_args(key: str) -> None:
    body = example_body("llama-8b-nvlink")
    body["spec"]["decode"]["podTemplate"] = {"spec": {"containers": [
        {"name": "vllm", key: ["--tensor-parallel-size", "8"]}]}}
    assert re.search(rf"^spec\.decode\.podTemplate\.spec\.containers\[0\]\.{key}: the vllm "
                     rf"container's {key} belongs to the operator", refused(parse_model(body)))
    # a sidecar's args are its own
    body["spec"]["decode"]["podTemplate"] = {"spec": {"containers": [
        {"name": "log", "image": "busybox", key: ["tail"]}]}}
    assert refused(parse_model(body)) == ""
    assert build_children(parse_model(body))


def test_a_tenant_below_interactive_turns_on_vllms_priority_scheduler_on_every_pool() -> None:
    tenants = [{"name": "batch", "match": {"values": ["b"]}, "priority": "Batch"},
               {"name": "chat", "match": {"values": ["c"]}}]
    dm = model(routing={"tenants": tenants})
    for role in ("prefill", "decode"):
        args = worker_args(dm, role)
        i = args.index("--scheduling-policy")
        assert args[i + 1] == "priority"
    # every tenant Interactive (the default): vLLM's FCFS, no flag
    plain = model(routing={"tenants": [tenants[1]]})
    assert all("--scheduling-policy" not in worker_args(plain, role) for role in ("prefill", "decode"))
