"""Multi-node pools: a replica that spans several nodes is a *group* of pods (a leader and headless workers).

Pure functions, like the rest of ``builders``: ``DisaggregatedModel`` → manifests and pod facts → decisions; no I/O.
docs/multinode.md explains the design; the facts about vLLM's flags are in :mod:`disagg.vllm_versions` (``MULTI_NODE``,
each cited to the vLLM source).

A pool with ``nodesPerReplica`` N > 1 runs each replica as N pods, node ranks 0 … N-1; rank 0 is the leader:

- **data-parallel layout** (``parallelism.data`` D > 1, the wide-EP layout): every node runs L = D ÷ N data-parallel
  ranks of tensor × pipeline GPUs. All nodes get ``--data-parallel-size D --data-parallel-size-local L
  --data-parallel-address <leader> --data-parallel-rpc-port P``; node k > 0 adds ``--headless
  --data-parallel-start-rank k × L``. The leader gets no start rank: it is then vLLM's internal load balancing,
  its API server spreading requests over all D ranks (hybrid LB would serve only its own).
- **tensor/pipeline layout** (D = 1): one engine of tensor × pipeline GPUs across the nodes: ``--nnodes N
  --node-rank k --master-addr <leader> --master-port P``, node k > 0 ``--headless``.

Only the leader serves HTTP, so only the leader is routable: it alone carries the ``serving.disagg.dev/role`` label
the router's discovery selects on (router/discovery.py) and that the pool Service (``workers.worker_service``)
selects. Every pod of a group carries ``serving.disagg.dev/pool`` (the PodDisruptionBudget's selector), the group's
name and its node rank.

Two back ends (``spec.multiNode.backend``, :func:`resolve_backend`):

- **StatefulSet** (any cluster): per group, a headless Service that publishes not-ready addresses (the workers must
  resolve the leader while the group forms, before anything is Ready) and one StatefulSet of one pod per node rank,
  each with its rank's literal arguments. Group names carry a generation (a hash of what the pods run), so a group
  never mixes generations: a change makes new groups, and the operator removes the old ones as a whole.
- **LeaderWorkerSet** (``leaderworkerset.x-k8s.io/v1``, when its CRD is installed): one LeaderWorkerSet per pool,
  ``size`` N, ``restartPolicy: RecreateGroupOnPodRestart``, ``startupPolicy: LeaderCreated``, rolling updates by group.
  Its templates are shared by all groups, so the leader address comes from ``$(LWS_LEADER_ADDRESS)`` and a worker's
  rank from ``LWS_WORKER_INDEX`` (a ``sh -c`` computes the start rank in the data-parallel layout).

The groups' live health (a group is ready only when all its pods are; a failed member restarts the whole group) is
the controller's (controller/group_health.py), read from the labels written here.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..api import contract as c
from ..api.contract import LWS_API_VERSION as LWS_API_VERSION  # the LeaderWorkerSet API (api/contract.py)
from ..api.contract import LWS_CRD as LWS_CRD  # whose presence makes ``backend: Auto`` pick LeaderWorkerSet
from ..api.contract import LWS_GROUP as LWS_GROUP
from ..api.contract import LWS_KIND as LWS_KIND
from ..api.contract import LWS_PLURAL as LWS_PLURAL
from ..api.contract import LWS_VERSION as LWS_VERSION
from ..api.contract import Role
from ..api.models import DisaggregatedModel, PoolSpec
from ..api.semantics import Backend as Backend
from ..api.semantics import resolve_backend as resolve_backend  # the back end of spec.multiNode.backend
from .meta import model_name, namespace_of, object_meta, role_labels, short_hash
from .replicas import desired_replicas
from .transport import KV_ROLES
from .workers import worker_args, worker_pod_template

# Set by the LeaderWorkerSet controller in every pod of a group (kubernetes-sigs/lws, pkg/utils/pod/pod_utils.go
# and api/leaderworkerset/v1/leaderworkerset_types.go): the leader's
# address `<leader pod>.<lws>.<namespace>`, the pod's index in its group, 0 for the leader; and the group's key
# label, equal in every pod of one group.
LWS_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
LWS_WORKER_INDEX = "LWS_WORKER_INDEX"
LWS_GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"

LABEL_POOL = "serving.disagg.dev/pool"
"""On every pod of a multi-node pool (leader and workers): the pool's role. The PodDisruptionBudget selects it."""
LABEL_GROUP = "serving.disagg.dev/group"
"""The group (replica) a pod belongs to (StatefulSet back end)."""
LABEL_GROUP_ROLE = "serving.disagg.dev/group-role"
"""leader | worker."""
LABEL_NODE_RANK = "serving.disagg.dev/node-rank"
LABEL_GENERATION = "serving.disagg.dev/group-generation"
"""Hash of what a group's pods run: groups of one generation only (StatefulSet back end)."""
LEADER, WORKER = "leader", "worker"

RPC_PORT_NAME = "dp-rpc"
MASTER_PORT_NAME = "dist-master"
MAX_STATEFULSET_NAME = c.MAX_STATEFULSET_NAME  # (api/contract.py: the pods' controller-revision-hash label)


# ---------------------------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Layout:
    """How one replica of a pool spreads over its nodes."""

    nodes: int
    tensor: int
    pipeline: int
    data: int
    expert: bool

    @property
    def data_local(self) -> int:
        """Data-parallel ranks per node (--data-parallel-size-local)."""
        return self.data // self.nodes if self.data > 1 else 1

    @property
    def data_parallel(self) -> bool:
        """True: the nodes run data-parallel ranks (wide EP); False: one tensor × pipeline engine spans them."""
        return self.data > 1

    @property
    def gpus(self) -> int:
        """GPUs of the whole replica."""
        return self.tensor * self.pipeline * self.data

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes

    @property
    def expert_parallel_size(self) -> int:
        """EP size of the MoE layers with --enable-expert-parallel: tensor × data (1 without it)."""
        return self.tensor * self.data if self.expert else 1

    def start_rank(self, node_rank: int) -> int:
        """The first data-parallel rank on node ``node_rank`` (0 in the tensor/pipeline layout)."""
        return node_rank * self.data_local if self.data_parallel else 0

    def dp_ranks(self, node_rank: int) -> list[int]:
        """The global data-parallel ranks node ``node_rank`` runs."""
        start = self.start_rank(node_rank)
        return list(range(start, start + self.data_local))

    def side_channel_ports(self, base: int, node_rank: int) -> list[int]:
        """The NIXL side-channel ports node ``node_rank`` listens on: base + each of its DP ranks
        (vllm_versions.NIXL_PORT_PER_DP_RANK)."""
        return [base + r for r in self.dp_ranks(node_rank)]


def layout(pool: PoolSpec) -> Layout:
    p = pool.parallelism
    return Layout(nodes=pool.nodes_per_replica, tensor=p.tensor, pipeline=p.pipeline, data=p.data, expert=p.expert)


def is_multinode(pool: PoolSpec | None) -> bool:
    return pool is not None and pool.nodes_per_replica > 1


def multinode_roles(dm: DisaggregatedModel) -> list[Role]:
    """The worker pools of ``dm`` whose replicas span several nodes."""
    roles: list[Role] = ["prefill", "decode", "aggregated"]
    return [r for r in roles if is_multinode(getattr(dm.spec, r))]


def valid_layout(pool: PoolSpec) -> Layout:
    """The pool's layout, which the CRD's rules (rules.py: pool-multinode-*) guarantee can be run: every node gets
    the same GPUs, and a data-parallel rank is not split across nodes."""
    lay = layout(pool)
    assert lay.gpus % lay.nodes == 0 and (not lay.data_parallel or lay.data % lay.nodes == 0), (
        f"layout {lay} cannot be run (api/rules.py refuses it)")
    return lay


# ------------------------------------------------------------------------------------------------ names


def generation(dm: DisaggregatedModel, role: Role) -> str:
    """Hash of what a group's pods run (the pool's pod template, the layout and the rendezvous ports): part of the
    StatefulSet back end's group names, so that a group never mixes pods of two generations."""
    spec = dm.spec
    pool: PoolSpec = getattr(spec, role)
    template = worker_pod_template(dm, role)
    return short_hash({"template": template, "layout": layout(pool).__dict__,
                       "ports": [spec.multi_node.data_parallel_rpc_port, spec.multi_node.master_port]},
                      c.GROUP_GENERATION_CHARS)


def group_name(dm: DisaggregatedModel, role: Role, index: int, gen: str | None = None) -> str:
    """``<model>-<role>-<generation>-g<index>``: the group's headless Service, and the prefix of its StatefulSets."""
    return c.group_name(model_name(dm), role, gen or generation(dm, role), index)


member_name = c.member_name


def member_pod(group: str, node_rank: int) -> str:
    return f"{member_name(group, node_rank)}-0"


def leader_address(dm: DisaggregatedModel, group: str) -> str:
    """The leader's stable DNS name (StatefulSet back end): ``<pod>.<group Service>[.<namespace>.svc]``."""
    ns = namespace_of(dm)
    return f"{member_pod(group, 0)}.{group}" + (f".{ns}.svc" if ns else "")


def lws_name(dm: DisaggregatedModel, role: Role) -> str:
    """The pool's LeaderWorkerSet, ``<model>-<role>-lws``: not the pool Service's name, which the LeaderWorkerSet
    controller would take for the headless Service it creates under the LeaderWorkerSet's own name."""
    return f"{c.pool_name(model_name(dm), role)}-lws"


# ------------------------------------------------------------------------------------------------- args


def rank_flags(dm: DisaggregatedModel, role: Role, node_rank: int, address: str) -> list[str]:
    """The flags that make a pod node ``node_rank`` of a replica whose leader is reachable at ``address``
    (vllm_versions.MULTI_NODE)."""
    pool: PoolSpec = getattr(dm.spec, role)
    lay = layout(pool)
    mn = dm.spec.multi_node
    if lay.data_parallel:
        flags = ["--data-parallel-size-local", str(lay.data_local), "--data-parallel-address", address,
                 "--data-parallel-rpc-port", str(mn.data_parallel_rpc_port)]
        if node_rank:
            flags += ["--headless", "--data-parallel-start-rank", str(lay.start_rank(node_rank))]
        return flags
    flags = ["--nnodes", str(lay.nodes), "--node-rank", str(node_rank), "--master-addr", address,
             "--master-port", str(mn.master_port)]
    return flags + (["--headless"] if node_rank else [])


def rank_args(dm: DisaggregatedModel, role: Role, node_rank: int, address: str) -> list[str]:
    """``vllm serve``'s full argument list for node ``node_rank`` of a replica (leader: 0)."""
    pool: PoolSpec = getattr(dm.spec, role)
    valid_layout(pool)
    if not 0 <= node_rank < pool.nodes_per_replica:
        raise ValueError(f"node rank {node_rank} outside 0..{pool.nodes_per_replica - 1}")
    return worker_args(dm, role, rank_flags(dm, role, node_rank, address))


# -------------------------------------------------------------------------------------------- templates


def _check(dm: DisaggregatedModel, role: Role) -> Layout:
    """The layout of multi-node pool ``role``. (What else such a pool needs, the API checks: no rank flag in
    extraArgs, a transport across nodes, rendezvous ports of their own, names that fit: api/semantics.py.)"""
    return valid_layout(getattr(dm.spec, role))


def _pod_template(dm: DisaggregatedModel, role: Role, node_rank: int, args: list[str],
                  labels: Mapping[str, str], lay: Layout) -> dict[str, Any]:
    """The pool's pod template (workers.worker_pod_template: env, volumes, security, podTemplate overrides) turned
    into node ``node_rank`` of a group: its arguments, its GPUs, its side-channel ports, leader-only HTTP."""
    spec = dm.spec
    pool: PoolSpec = getattr(spec, role)
    template: dict[str, Any] = copy.deepcopy(worker_pod_template(dm, role))
    pod_spec = template["spec"]
    containers = pod_spec["containers"]
    i = next(i for i, ctr in enumerate(containers) if ctr["name"] == "vllm")
    ctr = containers[i]
    ctr["args"] = args
    ctr.setdefault("resources", {}).setdefault("limits", {})[pool.gpu.resource_name] = str(lay.gpus_per_node)
    ports = [p for p in ctr.get("ports", []) if p.get("name") != c.SIDE_CHANNEL_PORT_NAME]
    if role in KV_ROLES:
        for j, port in enumerate(lay.side_channel_ports(spec.kv_transfer.side_channel_port, node_rank)):
            ports.append({"name": c.SIDE_CHANNEL_PORT_NAME if j == 0 else f"{c.SIDE_CHANNEL_PORT_NAME}-{j}",
                          "containerPort": port, "protocol": "TCP"})
    mn = spec.multi_node
    if node_rank == 0:
        rendezvous = ((RPC_PORT_NAME, mn.data_parallel_rpc_port) if lay.data_parallel
                      else (MASTER_PORT_NAME, mn.master_port))
        ports.append({"name": rendezvous[0], "containerPort": rendezvous[1], "protocol": "TCP"})
    else:
        # a headless worker serves no HTTP: no HTTP port, no probes, no scrape (its engines report through the
        # leader's API server, vllm/entrypoints/cli/serve.py run_headless)
        ports = [p for p in ports if p.get("name") != c.WORKER_PORT_NAME]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            ctr.pop(probe, None)
        template.get("metadata", {}).pop("annotations", None)
    ctr["ports"] = ports
    meta = template.setdefault("metadata", {})
    pod_labels = dict(meta.get("labels", {}))
    if node_rank:
        pod_labels.pop(c.LABEL_ROLE, None)  # only the leader is routable (router/discovery.py selects on it)
    pod_labels.update(labels)
    meta["labels"] = pod_labels
    return template


def _group_labels(model: str, role: Role, node_rank: int) -> dict[str, str]:
    return {c.LABEL_MODEL: model, LABEL_POOL: role, LABEL_GROUP_ROLE: LEADER if node_rank == 0 else WORKER,
            LABEL_NODE_RANK: str(node_rank)}


def _anti_affinity(template: dict[str, Any], selector: dict[str, Any], label_keys: list[str] | None = None) -> None:
    """One pod of a group per node (a replica spans nodesPerReplica nodes). ``label_keys``: pod labels whose
    values the scheduler adds to the selector (matchLabelKeys), for a template shared by several groups."""
    affinity = template["spec"].setdefault("affinity", {})
    terms = affinity.setdefault("podAntiAffinity", {}).setdefault("requiredDuringSchedulingIgnoredDuringExecution", [])
    term: dict[str, Any] = {"labelSelector": selector, "topologyKey": "kubernetes.io/hostname"}
    if label_keys:
        term["matchLabelKeys"] = list(label_keys)
    terms.append(term)


# ------------------------------------------------------------------------------------------ StatefulSet


def group_service(dm: DisaggregatedModel, role: Role, group: str, gen: str, lay: Layout) -> dict[str, Any]:
    """Headless Service of one group: stable DNS names for its pods, published before they are Ready (the workers
    reach the leader while the group forms)."""
    spec = dm.spec
    model = model_name(dm)
    mn = spec.multi_node
    rendezvous = ((RPC_PORT_NAME, mn.data_parallel_rpc_port) if lay.data_parallel
                  else (MASTER_PORT_NAME, mn.master_port))
    labels = {**role_labels(model, role), LABEL_POOL: role, LABEL_GROUP: group, LABEL_GENERATION: gen}
    labels.pop(c.LABEL_ROLE)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(dm, group, labels),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {c.LABEL_MODEL: model, LABEL_GROUP: group},
            "ports": [
                {"name": c.WORKER_PORT_NAME, "port": spec.engine.port, "targetPort": spec.engine.port,
                 "protocol": "TCP"},
                {"name": rendezvous[0], "port": rendezvous[1], "targetPort": rendezvous[1], "protocol": "TCP"},
            ],
        },
    }


def group_statefulsets(dm: DisaggregatedModel, role: Role, index: int, gen: str | None = None) -> list[dict[str, Any]]:
    """The StatefulSets of group ``index``: one per node rank, one pod each, with that rank's literal arguments."""
    lay = _check(dm, role)
    model = model_name(dm)
    gen = gen or generation(dm, role)
    group = group_name(dm, role, index, gen)
    address = leader_address(dm, group)
    out = []
    for rank in range(lay.nodes):
        name = member_name(group, rank)  # at most MAX_STATEFULSET_NAME characters (api/semantics.py name_errors)
        labels = {**_group_labels(model, role, rank), LABEL_GROUP: group, LABEL_GENERATION: gen}
        template = _pod_template(dm, role, rank, rank_args(dm, role, rank, address), labels, lay)
        _anti_affinity(template, {"matchLabels": {c.LABEL_MODEL: model, LABEL_GROUP: group}})
        selector = {c.LABEL_MODEL: model, LABEL_GROUP: group, LABEL_NODE_RANK: str(rank)}
        obj_labels = {**role_labels(model, role), **labels}
        if rank:
            obj_labels.pop(c.LABEL_ROLE)
        out.append({
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": object_meta(dm, name, obj_labels),
            "spec": {
                "serviceName": group,
                "replicas": 1,
                "podManagementPolicy": "Parallel",
                # the operator replaces whole groups (a new generation is a new group): never a pod on its own
                "updateStrategy": {"type": "OnDelete"},
                "selector": {"matchLabels": selector},
                "template": template,
            },
        })
    return out


def pool_pdb(dm: DisaggregatedModel, role: Role) -> dict[str, Any]:
    """Voluntary disruptions take at most one pod of the pool at a time. A disrupted pod breaks its whole group
    (which then restarts and is unavailable, every pod of it), so no second pod of the pool is evicted until that
    group is whole again: the budget treats a group as one unit. Replaces workers.worker_pdb for this pool (same
    name), selecting every pod of the pool rather than the leaders alone."""
    model = model_name(dm)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(dm, c.pool_name(model, role), role_labels(model, role)),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {c.LABEL_MODEL: model, LABEL_POOL: role}}},
    }


def statefulset_objects(dm: DisaggregatedModel, role: Role, groups: int | None = None) -> list[dict[str, Any]]:
    """Every object of a multi-node pool on the StatefulSet back end, for ``groups`` groups (default: the pool's
    desired replicas): per group its headless Service and StatefulSets, then the pool's PDB."""
    lay = _check(dm, role)
    gen = generation(dm, role)
    count = desired_replicas(dm, role) if groups is None else groups
    out: list[dict[str, Any]] = []
    for g in range(count):
        out.append(group_service(dm, role, group_name(dm, role, g, gen), gen, lay))
        out += group_statefulsets(dm, role, g, gen)
    out.append(pool_pdb(dm, role))
    return out


# -------------------------------------------------------------------------------------- LeaderWorkerSet

LWS_START_RANK_SCRIPT = 'exec vllm serve "$@" --data-parallel-start-rank "$(({index} * {local}))"'
"""A data-parallel worker's start rank (LWS_WORKER_INDEX × dataParallelSizeLocal) is arithmetic, which a
Kubernetes ``$(VAR)`` reference cannot do: the worker template runs ``sh -c`` with this script, the rest of the
arguments passed through ``"$@"`` untouched (no quoting)."""


def lws_worker_command(lay: Layout) -> list[str] | None:
    """The worker template's command in the data-parallel layout (``sh -c``), None when ``vllm serve`` is run
    directly (the tensor/pipeline layout: ``--node-rank $(LWS_WORKER_INDEX)`` needs no arithmetic)."""
    if not lay.data_parallel:
        return None
    script = LWS_START_RANK_SCRIPT.format(index="${" + LWS_WORKER_INDEX + "}", local=lay.data_local)
    return ["/bin/sh", "-c", script, "vllm-serve"]


def lws_args(dm: DisaggregatedModel, role: Role, leader: bool) -> list[str]:
    """The argument list of the LeaderWorkerSet's leader or worker template: the rank flags with the
    LeaderWorkerSet's variables (expanded by the kubelet) where the StatefulSet back end has literals."""
    pool: PoolSpec = getattr(dm.spec, role)
    lay = layout(pool)
    address = f"$({LWS_LEADER_ADDRESS})"
    if leader:
        return rank_args(dm, role, 0, address)
    if lay.data_parallel:
        # everything but the start rank, which the worker command appends (LWS_START_RANK_SCRIPT)
        flags = rank_flags(dm, role, 1, address)
        flags = flags[: flags.index("--data-parallel-start-rank")]
    else:
        flags = rank_flags(dm, role, 1, address)
        flags[flags.index("--node-rank") + 1] = f"$({LWS_WORKER_INDEX})"
    return worker_args(dm, role, flags)


def leader_worker_set(dm: DisaggregatedModel, role: Role, groups: int | None = None) -> dict[str, Any]:
    """The pool's LeaderWorkerSet: ``groups`` groups (default: the pool's desired replicas) of nodesPerReplica
    pods; a restarted pod recreates its whole group (RecreateGroupOnPodRestart); rolling updates replace whole groups.

    startupPolicy is LeaderCreated (workers are created with the leader), not LeaderReady: vLLM's leader answers
    /health, hence turns Ready, only once every engine of the group has joined (its API server starts after the
    engines' handshake, vllm/entrypoints/cli/serve.py), so with LeaderReady the workers would never be created."""
    spec = dm.spec
    pool: PoolSpec = getattr(spec, role)
    lay = _check(dm, role)
    model = model_name(dm)
    leader = _pod_template(dm, role, 0, lws_args(dm, role, True), _group_labels(model, role, 0), lay)
    worker = _pod_template(dm, role, 1, lws_args(dm, role, False), _group_labels(model, role, 1), lay)
    # node rank is per pod, LWS_WORKER_INDEX: not a label of the shared worker template
    worker["metadata"]["labels"].pop(LABEL_NODE_RANK)
    command = lws_worker_command(lay)
    if command:
        ctr = next(ctr for ctr in worker["spec"]["containers"] if ctr["name"] == "vllm")
        ctr["command"] = command
    for template in (leader, worker):
        _anti_affinity(template, {"matchLabels": {c.LABEL_MODEL: model, LABEL_POOL: role}}, [LWS_GROUP_KEY_LABEL])
    obj_labels = {**role_labels(model, role), LABEL_POOL: role}
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": object_meta(dm, lws_name(dm, role), obj_labels),
        "spec": {
            "replicas": desired_replicas(dm, role) if groups is None else groups,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": lay.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": {
                "maxSurge": pool.rolling_update.max_surge, "maxUnavailable": pool.rolling_update.max_unavailable}},
            "networkConfig": {"subdomainPolicy": "Shared"},
        },
    }


def lws_objects(dm: DisaggregatedModel, role: Role, groups: int | None = None) -> list[dict[str, Any]]:
    return [leader_worker_set(dm, role, groups), pool_pdb(dm, role)]


def pool_objects(dm: DisaggregatedModel, role: Role, backend: Backend, groups: int | None = None,
                 ) -> list[dict[str, Any]]:
    """Every object of multi-node pool ``role`` on ``backend`` (:func:`resolve_backend`), instead of
    workers.worker_deployment and workers.worker_pdb; workers.worker_service (the pool Service, leaders only)
    stays."""
    if backend == "LeaderWorkerSet":
        return lws_objects(dm, role, groups)
    return statefulset_objects(dm, role, groups)
