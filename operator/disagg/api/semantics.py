"""The operator's own checks of a spec that the apiserver admits (no schema constraint or CEL rule can say them).

Validation has one home, this package: the schema's single-field constraints (spec.py), the cross-field rules
(rules.py, the CRD's CEL), and here what only the operator refuses. ``model_errors`` is all of the last, each error
naming its field; ``disagg validate`` reports them as the operator's (api/validate.py), and the operator refuses a
model that has any with ``Ready=False`` reason ``InvalidSpec`` before it builds anything (controller/reconcile.py).
The builders may then assume a valid model.

What is checked here, and why CEL cannot:

- **extraArgs**: argparse's abbreviations of the flags the operator owns (``--tensor-parallel``, ``-t``), items vLLM
  cannot read as one option, and in a multi-node pool the flags of its ranks (api/flags.py: the CEL rule's pattern
  covers full names only, within the apiserver's cost budget);
- **podTemplate**: a free-form object (``x-kubernetes-preserve-unknown-fields``), whose unknown fields CEL cannot
  read: the vllm container's command and args are the operator's;
- **ports** that collide (the NIXL side channel, one port per data-parallel rank, and a multi-node pool's
  rendezvous port against the HTTP port);
- **the vLLM release** (the image tag, else spec.engine.vllmVersion: disagg.vllm_versions) and what it supports;
- **multi-node pools**: nvlink (one node) for a KV-connected pool spanning nodes, and a LeaderWorkerSet back end
  on a cluster without its CRD (``lws_installed``: only the operator knows; offline, as on a cluster without it);
- **metadata.name**: every child's name must be a valid name for its kind (Services: DNS-1035 labels of at most
  63 characters; a multi-node group's StatefulSets: at most 52).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from ..vllm_versions import VersionError, fmt, resolve_vllm_version
from .contract import (
    GROUP_GENERATION_CHARS,
    LWS_CRD,
    MAX_STATEFULSET_NAME,
    WORKER_ROLES,
    Role,
    group_name,
    member_name,
    pool_name,
    router_name,
)
from .flags import extra_args_item_errors, rank_flag_item_errors
from .spec import DisaggregatedModelSpec, PoolSpec

Backend = Literal["LeaderWorkerSet", "StatefulSet"]

WORKER_CONTAINER = "vllm"
"""The name of the container that runs `vllm serve` in every worker pod (builders/workers.py)."""
OPERATOR_OWNED_CONTAINER_FIELDS = ("command", "args")
KV_CONNECTED: tuple[Role, ...] = ("prefill", "decode")
"""The pools that carry a KV connector (builders/transport.py KV_ROLES)."""
MAX_SERVICE_NAME = 63
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


# ------------------------------------------------------------------------------------------ the pools


def pools(spec: DisaggregatedModelSpec) -> list[tuple[Role, PoolSpec]]:
    """The worker pools of ``spec`` that exist (prefill, decode, and the aggregated pool when set)."""
    return [(role, pool) for role in WORKER_ROLES if (pool := getattr(spec, role)) is not None]


def multinode_pools(spec: DisaggregatedModelSpec) -> list[tuple[Role, PoolSpec]]:
    """The worker pools whose replicas span several nodes (nodesPerReplica > 1)."""
    return [(role, pool) for role, pool in pools(spec) if pool.nodes_per_replica > 1]


def resolve_backend(spec: DisaggregatedModelSpec, lws_installed: bool) -> Backend:
    """The back end of the model's multi-node pools: spec.multiNode.backend, Auto → LeaderWorkerSet only when the
    caller found its CRD (``contract.LWS_CRD``) installed. (A LeaderWorkerSet asked for on a cluster without it is
    refused by ``semantic_errors``.)"""
    wanted = spec.multi_node.backend
    if wanted == "Auto":
        return "LeaderWorkerSet" if lws_installed else "StatefulSet"
    return wanted


def most_groups(spec: DisaggregatedModelSpec, role: Role) -> int:
    """The most replicas pool ``role`` can have: its spec's, or with autoscaling (prefill and decode) its
    maxReplicas (the autoscaler's decisions are clamped to it)."""
    pool: PoolSpec = getattr(spec, role)
    return pool.max_replicas if spec.autoscaling.enabled and role in KV_CONNECTED else pool.replicas


# ---------------------------------------------------------------------------------------------- checks


def pod_template_errors(field: str, pod_template: dict[str, Any]) -> list[str]:
    """What a pool's podTemplate (at ``field``, e.g. ``spec.prefill.podTemplate``) may not override: the vllm
    container's command and args, which carry every flag the operator owns (an override would bypass them all)."""
    spec = pod_template.get("spec")
    containers = spec.get("containers") if isinstance(spec, dict) else None
    if not isinstance(containers, list):
        return []
    out: list[str] = []
    for i, container in enumerate(containers):
        if not isinstance(container, dict) or container.get("name") != WORKER_CONTAINER:
            continue
        for key in OPERATOR_OWNED_CONTAINER_FIELDS:
            if key in container:
                out.append(
                    f"{field}.spec.containers[{i}].{key}: the {WORKER_CONTAINER} container's {key} belongs to the "
                    "operator (rendered from the spec, with every flag it owns, which an override would bypass): "
                    "remove it and put extra `vllm serve` flags in extraArgs"
                )
    return out


def all_extra_args_errors(spec: DisaggregatedModelSpec) -> list[str]:
    """Every extraArgs item (spec.engine and each pool) that sets a flag the operator owns, in any spelling vLLM
    reads, or that vLLM cannot read as one option; in a multi-node pool, also the flags of its ranks. One error per
    item."""
    lists = [("spec.engine.extraArgs", spec.engine.extra_args),
             *((f"spec.{role}.extraArgs", pool.extra_args) for role, pool in pools(spec))]
    errors: dict[str, str] = {}
    for field, args in lists:
        for i, error in extra_args_item_errors(field, list(args)):
            errors.setdefault(f"{field}[{i}]", error)
    for role, pool in multinode_pools(spec):
        for field, args in (("spec.engine.extraArgs", spec.engine.extra_args), (f"spec.{role}.extraArgs",
                                                                                 pool.extra_args)):
            for i, error in rank_flag_item_errors(field, list(args), role, pool.nodes_per_replica):
                errors.setdefault(f"{field}[{i}]", error)
    return list(errors.values())


def port_errors(spec: DisaggregatedModelSpec) -> list[str]:
    """Ports that collide in a pool's pods: the NIXL side channel (spec.kvTransfer.sideChannelPort + each
    data-parallel rank) with the HTTP port, and a multi-node pool's rendezvous port with either. One error per
    field, for the first pool it happens in."""
    out: list[str] = []
    side, http = spec.kv_transfer.side_channel_port, spec.engine.port
    for role in KV_CONNECTED:
        data = getattr(spec, role).parallelism.data
        if side <= http < side + data:
            out.append(f"spec.kvTransfer.sideChannelPort: the NIXL side channel uses ports {side}"
                       f"{'' if data == 1 else f'-{side + data - 1}'} in the {role} pool, which includes "
                       f"spec.engine.port {http}; pick another port")
            break
    mn = spec.multi_node
    reported: set[str] = set()
    for role, pool in multinode_pools(spec):
        data_parallel = pool.parallelism.data > 1
        port = mn.data_parallel_rpc_port if data_parallel else mn.master_port
        flag = "dataParallelRpcPort" if data_parallel else "masterPort"
        taken = {http: "spec.engine.port"}
        if role in KV_CONNECTED:
            taken.update({p: "spec.kvTransfer.sideChannelPort (+ data-parallel rank)"
                          for p in range(side, side + pool.parallelism.data)})
        if port in taken and flag not in reported:
            reported.add(flag)
            out.append(f"spec.multiNode.{flag}: port {port} is also {taken[port]} in the {role} pool; pick another")
    return out


def version_errors(spec: DisaggregatedModelSpec) -> list[str]:
    """The vLLM release the pools are rendered for (the image tag, spec.engine.vllmVersion, the default) must be
    known, and have what spec.kvTransfer asks of it."""
    try:
        r = resolve_vllm_version(spec.engine.image, spec.engine.vllm_version)
    except VersionError as e:
        return [str(e)]
    p, kv = r.profile, spec.kv_transfer
    out: list[str] = []
    if kv.connector not in p.connectors:
        out.append(f"spec.kvTransfer.connector: {kv.connector} is not in vLLM {fmt(r.version)} ({r.message})")
    # the decode pool's kv_load_failure_policy: releases without the key always recompute a failed load
    if not p.kv_load_failure_policy and kv.load_failure_policy == "fail":
        out.append(f"spec.kvTransfer.loadFailurePolicy: fail needs vLLM 0.13.0 or later (kv_load_failure_policy); "
                   f"{r.message}, which always recomputes a failed KV load; use recompute")
    return out


def multinode_errors(spec: DisaggregatedModelSpec, *, lws_installed: bool) -> list[str]:
    """What a multi-node pool needs besides its layout (whose rules are the CRD's, rules.py): a transport that
    reaches across nodes, and the back end it asks for."""
    out: list[str] = []
    multi = multinode_pools(spec)
    for role, pool in multi:
        if role in KV_CONNECTED and spec.kv_transfer.transport == "nvlink":
            out.append(f"spec.kvTransfer.transport: nvlink keeps every KV-connected pod on one node, which a {role} "
                       f"replica of spec.{role}.nodesPerReplica {pool.nodes_per_replica} nodes cannot do; use rdma")
            break
    if multi and spec.multi_node.backend == "LeaderWorkerSet" and not lws_installed:
        out.append(f"spec.multiNode.backend: LeaderWorkerSet needs the {LWS_CRD} CRD (and the LeaderWorkerSet "
                   "controller) installed in the cluster; install it, or use StatefulSet or Auto")
    return out


def name_errors(name: str | None, spec: DisaggregatedModelSpec, *, lws_installed: bool = False) -> list[str]:
    """Whether model ``name`` can name its children: Services (so every pool and the router) need DNS-1035 labels of
    at most 63 characters, starting with a letter; a multi-node pool's StatefulSets (StatefulSet back end) at most
    52 characters. The apiserver accepts longer DisaggregatedModel names (DNS subdomains)."""
    if not name:
        return ["metadata.name: required"]
    children: dict[str, str] = {role: pool_name(name, role) for role, _ in pools(spec)}
    children["router"] = router_name(name)
    for role, child in children.items():
        if len(child) > MAX_SERVICE_NAME:
            longest = MAX_SERVICE_NAME - (len(child) - len(name))
            return [f"metadata.name: {name!r} is too long: the {role} Service would be named {child!r} "
                    f"({len(child)} characters; Kubernetes allows {MAX_SERVICE_NAME}). Use at most {longest} "
                    "characters."]
        if not _DNS1035.match(child):
            return [f"metadata.name: {name!r} cannot name a Service ({child!r}): use lowercase letters, digits and "
                    "'-', starting with a letter (DNS-1035 label)."]
    if resolve_backend(spec, lws_installed) != "StatefulSet":
        return []
    out: list[str] = []
    for role, pool in multinode_pools(spec):
        groups = most_groups(spec, role)
        if not groups:
            continue
        # the longest StatefulSet of the pool: its last group's last node rank
        group, rank = groups - 1, pool.nodes_per_replica - 1
        length = len(member_name(group_name(name, role, "x" * GROUP_GENERATION_CHARS, group), rank))
        if length > MAX_STATEFULSET_NAME:
            shown = member_name(group_name(name, role, "<generation>", group), rank)
            out.append(f"metadata.name: {name!r} is too long for a multi-node {role} pool: StatefulSet {shown!r} "
                       f"has {length} characters (at most {MAX_STATEFULSET_NAME}; <generation> is "
                       f"{GROUP_GENERATION_CHARS}); use at most {len(name) - (length - MAX_STATEFULSET_NAME)} "
                       "characters")
    return out


# ------------------------------------------------------------------------------------------------ entry


def semantic_errors(spec: DisaggregatedModelSpec, *, lws_installed: bool = False) -> list[str]:
    """What the operator refuses in a spec the apiserver accepts, each naming the field. ``lws_installed``: is the
    LeaderWorkerSet CRD installed in the cluster (the operator knows; offline, as on a cluster without it)."""
    out = all_extra_args_errors(spec)
    for role, pool in pools(spec):
        out += pod_template_errors(f"spec.{role}.podTemplate", pool.pod_template)
    out += port_errors(spec)
    out += version_errors(spec)
    out += multinode_errors(spec, lws_installed=lws_installed)
    return out


def model_errors(metadata: Mapping[str, Any], spec: DisaggregatedModelSpec, *, lws_installed: bool = False,
                 ) -> list[str]:
    """Everything the operator refuses in a DisaggregatedModel (its ``metadata`` and ``spec``) that the apiserver
    admits: ``name_errors``, then ``semantic_errors``. Empty: the builders can render it."""
    name = metadata.get("name")
    return [*name_errors(str(name) if name else None, spec, lws_installed=lws_installed),
            *semantic_errors(spec, lws_installed=lws_installed)]
