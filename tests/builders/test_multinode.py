"""Multi-node pools (issue 19): a replica is a group of pods, each started with its rank's vLLM arguments; only the
leader is routable; scaling adds or removes whole groups; a failed member restarts the group.

The rendered objects are checked with kubernetes-validate (the Kubernetes 1.34 schemas), the LeaderWorkerSet's pod
templates too; the LeaderWorkerSet worker command runs in a real /bin/sh."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from disagg.api import contract as c
from disagg.api.models import DisaggregatedModel
from disagg.builders import parse_model
from disagg.builders.multinode import (
    LABEL_GENERATION,
    LABEL_GROUP,
    LABEL_GROUP_ROLE,
    LABEL_NODE_RANK,
    LABEL_POOL,
    LWS_API_VERSION,
    LWS_LEADER_ADDRESS,
    LWS_WORKER_INDEX,
    Backend,
    group_name,
    layout,
    leader_address,
    leader_worker_set,
    lws_args,
    pool_objects,
    rank_args,
    rank_flags,
    resolve_backend,
    statefulset_objects,
)
from disagg.builders.workers import worker_service
from disagg.controller.group_health import groups_to_restart, ready_groups

from .conftest import example_body, refused

K8S = "1.34"
NS = "serving"


def _dm(example: str = "deepseek-wide-ep", **pools: dict[str, Any]) -> DisaggregatedModel:
    body = example_body(example, NS)
    for role, patch in pools.items():
        body["spec"][role] = {**body["spec"].get(role, {}), **patch}
    return parse_model(body)


def _flag(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def _sts(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == "StatefulSet"]


def _vllm(template: dict[str, Any]) -> dict[str, Any]:
    ctr: dict[str, Any] = next(x for x in template["spec"]["containers"] if x["name"] == "vllm")
    return ctr


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# ------------------------------------------------------------------------------------------ the arguments


def test_data_parallel_ranks_get_their_start_rank_and_the_leaders_address() -> None:
    dm = _dm()  # decode: 4 nodes, data 32, tensor 1, expert parallel
    lay = layout(dm.spec.decode)
    assert (lay.nodes, lay.data_local, lay.gpus_per_node, lay.expert_parallel_size) == (4, 8, 8, 32)
    address = leader_address(dm, group_name(dm, "decode", 0))
    for rank in range(4):
        args = rank_args(dm, "decode", rank, address)
        assert _flag(args, "--data-parallel-size") == "32"
        assert _flag(args, "--data-parallel-size-local") == "8"
        assert _flag(args, "--data-parallel-address") == address
        assert _flag(args, "--data-parallel-rpc-port") == "29550"
        assert "--enable-expert-parallel" in args
        assert _flag(args, "--tensor-parallel-size") == "1"
        # the leader is the head node: no start rank (a start rank would make it hybrid LB, serving its own
        # ranks only) and an API server; every other node is headless, its ranks starting at rank × local
        assert ("--headless" in args) is (rank > 0)
        assert _flag(args, "--data-parallel-start-rank") == (str(rank * 8) if rank else None)
        assert "--nnodes" not in args and "--master-addr" not in args
        # the user's extra args stay last, after every flag the operator renders
        assert args[-2:] == ["--all2all-backend", "deepep_low_latency"]


def test_tensor_pipeline_across_nodes_gets_node_ranks_and_the_master_address() -> None:
    dm = _dm("llama-405b-multinode")
    lay = layout(dm.spec.prefill)
    assert (lay.nodes, lay.gpus, lay.gpus_per_node, lay.data_parallel) == (2, 16, 8, False)
    address = leader_address(dm, group_name(dm, "prefill", 0))
    for rank in range(2):
        args = rank_args(dm, "prefill", rank, address)
        assert (_flag(args, "--tensor-parallel-size"), _flag(args, "--pipeline-parallel-size")) == ("8", "2")
        assert (_flag(args, "--nnodes"), _flag(args, "--node-rank")) == ("2", str(rank))
        assert (_flag(args, "--master-addr"), _flag(args, "--master-port")) == (address, "29501")
        assert ("--headless" in args) is (rank > 0)
        assert not any(a.startswith("--data-parallel") for a in args)
    with pytest.raises(ValueError, match=r"node rank 2 outside 0\.\.1"):
        rank_args(dm, "prefill", 2, address)


def test_rendezvous_ports_come_from_the_spec() -> None:
    body = example_body("deepseek-wide-ep", NS)
    body["spec"]["multiNode"] = {"dataParallelRpcPort": 31000, "masterPort": 31001}
    dm = parse_model(body)
    assert _flag(rank_flags(dm, "decode", 1, "a"), "--data-parallel-rpc-port") == "31000"
    body["spec"]["multiNode"]["dataParallelRpcPort"] = 8000  # the HTTP port
    assert re.search(r"spec\.multiNode\.dataParallelRpcPort: port 8000 is also spec\.engine\.port",
                     refused(parse_model(body)))
    body["spec"]["multiNode"]["dataParallelRpcPort"] = 5610  # the side channel of DP rank 10
    assert re.search(r"spec\.multiNode\.dataParallelRpcPort: port 5610 is also spec\.kvTransfer\.sideChannelPort",
                     refused(parse_model(body)))


# ------------------------------------------------------------------------------- StatefulSet back end


def test_each_pod_of_a_group_runs_its_rank_and_the_names_resolve() -> None:
    dm = _dm()
    objs = statefulset_objects(dm, "decode")
    services = [o for o in objs if o["kind"] == "Service"]
    assert len(services) == 2 and len(_sts(objs)) == 2 * 4  # decode: 2 groups × 4 nodes
    for g, svc in enumerate(services):
        group = group_name(dm, "decode", g)
        assert svc["metadata"]["name"] == group
        # the workers reach the leader while the group forms, before any pod is Ready
        assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
        members = [s for s in _sts(objs) if s["metadata"]["labels"][LABEL_GROUP] == group]
        assert [s["metadata"]["name"] for s in members] == [f"{group}-n{k}" for k in range(4)]
        for rank, sts in enumerate(members):
            assert sts["spec"]["serviceName"] == group and sts["spec"]["replicas"] == 1
            assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
            template = sts["spec"]["template"]
            labels = template["metadata"]["labels"]
            assert _matches(sts["spec"]["selector"]["matchLabels"], labels)
            assert _matches(svc["spec"]["selector"], labels)  # every member has a DNS name under the group Service
            assert labels[LABEL_NODE_RANK] == str(rank)
            # pod <sts>-0, <pod>.<group Service>.<namespace>.svc: the address every rank is given
            address = f"{group}-n0-0.{group}.{NS}.svc"
            assert _vllm(template)["args"] == rank_args(dm, "decode", rank, address)


def test_only_the_leader_is_routable() -> None:
    dm = _dm()
    pool_service = worker_service(dm, "decode")
    # the router's discovery: pods labelled model=<model>,role=<role> (router/discovery.py PodDiscovery._run)
    discovery = {c.LABEL_MODEL: "deepseek-v3", c.LABEL_ROLE: "decode"}
    pdb = next(o for o in statefulset_objects(dm, "decode") if o["kind"] == "PodDisruptionBudget")
    for sts in _sts(statefulset_objects(dm, "decode")):
        template = sts["spec"]["template"]
        labels = template["metadata"]["labels"]
        leader = labels[LABEL_NODE_RANK] == "0"
        assert labels[LABEL_GROUP_ROLE] == ("leader" if leader else "worker")
        assert _matches(discovery, labels) is leader
        assert _matches(pool_service["spec"]["selector"], labels) is leader
        assert _matches(pdb["spec"]["selector"]["matchLabels"], labels)  # the budget counts every pod
        assert labels[c.LABEL_COMPAT]  # generation isolation: the router pairs equal hashes only
        ctr = _vllm(template)
        ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
        assert (c.WORKER_PORT_NAME in ports) is leader
        assert ("readinessProbe" in ctr) is leader
        assert ("prometheus.io/scrape" in template["metadata"].get("annotations", {})) is leader
        assert ("dp-rpc" in ports) is leader


def test_every_data_parallel_rank_has_its_side_channel_port() -> None:
    dm = _dm()
    by_rank: dict[int, list[int]] = {}
    for sts in _sts(statefulset_objects(dm, "decode", groups=1)):
        template = sts["spec"]["template"]
        rank = int(template["metadata"]["labels"][LABEL_NODE_RANK])
        ctr = _vllm(template)
        by_rank[rank] = sorted(p["containerPort"] for p in ctr["ports"] if p["name"].startswith("nixl"))
        env = {e["name"]: e for e in ctr["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == "5600"  # vLLM adds the DP rank itself
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert ctr["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert ctr["resources"]["limits"]["rdma/ib"] == "8"
    assert by_rank == {k: list(range(5600 + 8 * k, 5608 + 8 * k)) for k in range(4)}
    assert sorted(p for ports in by_rank.values() for p in ports) == list(range(5600, 5632))


def test_scaling_adds_and_removes_whole_groups() -> None:
    dm = _dm()
    names = {n: {o["metadata"]["name"] for o in statefulset_objects(dm, "decode", groups=n)} for n in (1, 2, 3)}
    added = names[3] - names[2]
    group = group_name(dm, "decode", 2)
    assert added == {group, *(f"{group}-n{k}" for k in range(4))}
    assert names[1] < names[2] < names[3]
    # the default is the pool's desired replicas (spec.decode.replicas: 2)
    assert {o["metadata"]["name"] for o in statefulset_objects(dm, "decode")} == names[2]


def test_a_change_of_what_pods_run_is_a_new_generation_of_groups() -> None:
    dm = _dm()
    before = group_name(dm, "decode", 0)
    assert group_name(_dm(decode={"replicas": 3, "maxReplicas": 4}), "decode", 0) == before
    changed = _dm(decode={"maxNumSeqs": 128})
    after = group_name(changed, "decode", 0)
    assert after != before
    for sts in _sts(statefulset_objects(changed, "decode")):
        assert sts["metadata"]["labels"][LABEL_GENERATION] == after.split("-")[-2]
        assert sts["spec"]["template"]["metadata"]["labels"][LABEL_GENERATION] == after.split("-")[-2]


@pytest.mark.parametrize("example", ["deepseek-wide-ep", "llama-405b-multinode"])
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_statefulset_objects_pass_kubernetes_schemas(example: str, role: str) -> None:
    for obj in statefulset_objects(_dm(example), role):  # type: ignore[arg-type]
        kubernetes_validate.validate(obj, K8S, strict=True)


def test_one_pod_of_a_group_per_node() -> None:
    dm = _dm("llama-405b-multinode")
    for sts in _sts(statefulset_objects(dm, "decode")):
        [term] = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"][LABEL_GROUP] == sts["metadata"]["labels"][LABEL_GROUP]


def test_impossible_layouts_are_refused_naming_the_field() -> None:
    body = example_body("deepseek-wide-ep", NS)
    body["spec"]["kvTransfer"] = {"transport": "nvlink"}
    assert re.search(r"spec\.kvTransfer\.transport: nvlink keeps every KV-connected pod on one",
                     refused(parse_model(body)))
    long = example_body("deepseek-wide-ep", NS)
    long["metadata"]["name"] = "a-model-name-that-is-long-enough-for-sts"
    assert re.search(r"metadata\.name: .* too long for a multi-node decode pool", refused(parse_model(long)))
    # on the StatefulSet back end only: a LeaderWorkerSet's names are the pool's
    assert refused(parse_model(long), lws_installed=True) == ""


# ---------------------------------------------------------------------------- LeaderWorkerSet back end


def test_auto_picks_leaderworkerset_only_when_its_crd_exists() -> None:
    spec = _dm().spec  # backend: Auto
    assert resolve_backend(spec, lws_installed=True) == "LeaderWorkerSet"
    assert resolve_backend(spec, lws_installed=False) == "StatefulSet"
    pinned = _dm("llama-405b-multinode").spec  # backend: StatefulSet
    assert resolve_backend(pinned, lws_installed=True) == "StatefulSet"
    body = example_body("deepseek-wide-ep", NS)
    body["spec"]["multiNode"] = {"backend": "LeaderWorkerSet"}
    lws_spec = parse_model(body).spec
    assert resolve_backend(lws_spec, lws_installed=True) == "LeaderWorkerSet"
    assert refused(parse_model(body), lws_installed=True) == ""
    without = refused(parse_model(body), lws_installed=False)
    assert re.search(r"spec\.multiNode\.backend: LeaderWorkerSet needs the "
                     r"leaderworkersets\.leaderworkerset\.x-k8s\.io CRD", without)
    backends: tuple[Backend, ...] = ("LeaderWorkerSet", "StatefulSet")
    kinds = {backend: [o["kind"] for o in pool_objects(_dm(), "decode", backend)] for backend in backends}
    assert kinds["LeaderWorkerSet"] == ["LeaderWorkerSet", "PodDisruptionBudget"]
    assert set(kinds["StatefulSet"]) == {"Service", "StatefulSet", "PodDisruptionBudget"}


def test_leaderworkerset_groups_restart_together_and_only_the_leader_routes() -> None:
    dm = _dm()
    lws = leader_worker_set(dm, "decode")
    assert lws["apiVersion"] == LWS_API_VERSION and lws["kind"] == "LeaderWorkerSet"
    assert lws["metadata"]["name"] == "deepseek-v3-decode-lws"  # not the pool Service's name
    spec = lws["spec"]
    assert spec["replicas"] == 2
    tpl = spec["leaderWorkerTemplate"]
    assert tpl["size"] == 4 and tpl["restartPolicy"] == "RecreateGroupOnPodRestart"
    # workers are created with the leader: vLLM's leader turns Ready only once every engine joined
    assert spec["startupPolicy"] == "LeaderCreated"
    assert spec["rolloutStrategy"]["rollingUpdateConfiguration"] == {"maxSurge": 1, "maxUnavailable": 0}
    discovery = {c.LABEL_MODEL: "deepseek-v3", c.LABEL_ROLE: "decode"}
    assert _matches(discovery, tpl["leaderTemplate"]["metadata"]["labels"])
    assert not _matches(discovery, tpl["workerTemplate"]["metadata"]["labels"])
    for template in (tpl["leaderTemplate"], tpl["workerTemplate"]):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                      "template": template}, K8S, strict=True)
        [term] = template["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["matchLabelKeys"] == ["leaderworkerset.sigs.k8s.io/group-key"]


def _kubelet_expand(items: list[str], env: dict[str, str]) -> list[str]:
    """The kubelet's $(VAR) expansion of a container's command and args (variables of the container's env)."""
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in items]


@pytest.mark.parametrize("example,role", [("deepseek-wide-ep", "decode"), ("llama-405b-multinode", "prefill")])
def test_leaderworkerset_worker_runs_its_ranks_arguments_in_a_real_shell(tmp_path: Path, example: str,
                                                                          role: str) -> None:
    dm = _dm(example)
    fake = tmp_path / "vllm"  # stands in for `vllm`: prints the arguments it got
    fake.write_text('#!/bin/sh\nexec python3 -c \'import json,sys; print(json.dumps(sys.argv[1:]))\' "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    lws = leader_worker_set(dm, role)  # type: ignore[arg-type]
    tpl = lws["spec"]["leaderWorkerTemplate"]
    address = "leader-0.lws.serving"
    for index in range(layout(getattr(dm.spec, role)).nodes):
        template = tpl["leaderTemplate"] if index == 0 else tpl["workerTemplate"]
        ctr = _vllm(template)
        env = {LWS_LEADER_ADDRESS: address, LWS_WORKER_INDEX: str(index)}
        command = _kubelet_expand(ctr.get("command", ["vllm", "serve"]), env)
        args = _kubelet_expand(ctr["args"], env)
        if command[:2] == ["vllm", "serve"]:
            command = [str(fake), "serve", *command[2:]]
        out = subprocess.run([*command, *args], capture_output=True, text=True, check=True, timeout=30,
                             env={**os.environ, **env, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
        got = json.loads(out.stdout)
        assert got[0] == "serve"
        expected = rank_args(dm, role, index, address)  # type: ignore[arg-type]
        assert sorted(got[1:]) == sorted(expected), index
        assert got[1] == expected[0]  # the model stays the positional argument


def test_leaderworkerset_args_differ_from_a_rank_only_in_the_variables() -> None:
    dm = _dm("llama-405b-multinode")
    worker = lws_args(dm, "decode", leader=False)
    assert _flag(worker, "--node-rank") == f"$({LWS_WORKER_INDEX})"
    assert _flag(worker, "--master-addr") == f"$({LWS_LEADER_ADDRESS})"
    assert lws_args(dm, "decode", leader=True) == rank_args(dm, "decode", 0, f"$({LWS_LEADER_ADDRESS})")


# ------------------------------------------------------------------------------------- group decisions


def _pod(group: str, rank: int, *, ready: bool = True, restarts: int = 0, phase: str = "Running",
         created: str = "2026-11-30T10:00:00Z", started: str = "2026-11-30T10:00:05Z") -> dict[str, Any]:
    return {
        "metadata": {"name": f"{group}-n{rank}-0", "creationTimestamp": created,
                     "labels": {LABEL_GROUP: group, LABEL_NODE_RANK: str(rank), LABEL_POOL: "decode"}},
        "status": {"phase": phase,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                   "containerStatuses": [{"name": "vllm", "restartCount": restarts,
                                          "state": {"running": {"startedAt": started}}}]},
    }


def test_a_group_is_ready_only_when_all_its_pods_are() -> None:
    whole = [_pod("a", k) for k in range(4)]
    assert ready_groups(whole, 4) == 1
    assert ready_groups(whole[:3], 4) == 0  # a member is missing
    assert ready_groups([*whole[:3], _pod("a", 3, ready=False)], 4) == 0
    assert ready_groups([*whole, *(_pod("b", k) for k in range(4))], 4) == 2
    assert groups_to_restart(whole, 4) == {}


def test_a_failed_member_restarts_its_whole_group() -> None:
    group_b = [_pod("b", k) for k in range(2)]
    restarted = [_pod("a", 0), _pod("a", 1, restarts=1)]
    assert groups_to_restart([*restarted, *group_b], 2) == {"a": ["a-n0-0", "a-n1-0"]}
    assert ready_groups([*restarted, *group_b], 2) == 1
    failed = [_pod("a", 0), _pod("a", 1, phase="Failed", ready=False)]
    assert groups_to_restart(failed, 2) == {"a": ["a-n0-0", "a-n1-0"]}
    # a worker pod that replaced a lost one is newer than the leader's engine: the leader must start over too
    replaced = [_pod("a", 0, started="2026-11-30T10:00:05Z"), _pod("a", 1, created="2026-11-30T10:20:00Z")]
    assert groups_to_restart(replaced, 2) == {"a": ["a-n0-0", "a-n1-0"]}
    # the leader restarting is caught the same way (its restart count)
    assert groups_to_restart([_pod("a", 0, restarts=2), _pod("a", 1)], 2) == {"a": ["a-n0-0", "a-n1-0"]}


@pytest.mark.parametrize("args,field,says", [
    (["--data-parallel-address=10.0.0.1"], "spec.decode.extraArgs[0]", "spec.decode.nodesPerReplica"),
    (["--enforce-eager", "--master_port", "1234"], "spec.decode.extraArgs[1]", "spec.multiNode.masterPort"),
    (["-dpr", "8"], "spec.decode.extraArgs[0]", "vLLM reads it as --data-parallel-start-rank"),
    (["--node-r", "1"], "spec.decode.extraArgs[0]", "vLLM reads it as --node-rank"),
    (["--data-parallel-hybrid-lb"], "spec.decode.extraArgs[0]", "internal load balancing"),
])
def test_extra_args_cannot_set_a_ranks_flags(args: list[str], field: str, says: str) -> None:
    dm = _dm(decode={"extraArgs": args})
    error = refused(dm)
    assert error.startswith(f"{field}: ") and says in error
    body = example_body("deepseek-wide-ep", NS)
    body["spec"]["engine"] = {"extraArgs": ["-ep"]}
    assert re.search(r"spec\.engine\.extraArgs\[0\]: -ep \(vLLM reads it as --enable-expert-parallel\) is set by the "
                     r"operator from spec\.prefill\.parallelism\.expert", refused(parse_model(body)))


def test_the_docs_show_the_arguments_the_builder_renders() -> None:
    """docs/multinode.md's two command lines are what the StatefulSet back end renders for those ranks."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "multinode.md").read_text()
    blocks = re.findall(r"```\n(vllm serve .*?)```", text, re.S)
    assert len(blocks) == 2
    for block, (example, role, rank) in zip(blocks, [("deepseek-wide-ep", "decode", 2),
                                                     ("llama-405b-multinode", "prefill", 1)], strict=True):
        dm = _dm(example)
        group = group_name(dm, role, 0)  # type: ignore[arg-type]
        shown = block.replace("<g0>", group).split()
        assert shown == ["vllm", "serve", *rank_args(dm, role, rank, leader_address(dm, group))]  # type: ignore[arg-type]
