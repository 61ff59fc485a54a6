"""Worker pools: a Deployment, a headless Service and a PodDisruptionBudget per pool (prefill, decode, aggregated)."""

from __future__ import annotations

import copy
import posixpath
from collections.abc import Sequence
from typing import Any

from ..api import contract as c
from ..api.contract import Role
from ..api.flags import RESERVED_FLAGS as RESERVED_FLAGS  # the one table (api/flags.py), re-exported
from ..api.flags import RESERVED_SHORT_FLAGS as RESERVED_SHORT_FLAGS
from ..api.flags import option_name
from ..api.models import DisaggregatedModel, DisaggregatedModelSpec, PoolSpec
from ..api.semantics import WORKER_CONTAINER
from ..api.spec import priority_scheduling
from ..perf.costs import EngineCost, pool_chunk_budget
from .merge import strategic_merge
from .meta import (
    model_name,
    object_meta,
    role_labels,
    selector_labels,
    short_hash,
)
from .replicas import desired_replicas
from .security import NON_ROOT_UID, Level, container_security_context, level_for, pod_security_context, runs_as_root
from .tracing import worker_tracing_args, worker_tracing_env
from .transport import KV_ROLES, UCX_TLS, TransportParts, transport_parts
from .vllm import kv_events_args, kv_transfer_config_arg, per_request_metrics_args, shutdown_timeout_args

CONTAINER_NAME = WORKER_CONTAINER
MODEL_MOUNT = "/models"
SHM_VOLUME = "dshm"
MODEL_VOLUME = "model"
# A writable home for the HF, vLLM, Triton, FlashInfer and torch.compile caches, whatever user the image declares
# (vllm/vllm-openai runs as root with HOME=/root; the pods run as uid 10001). USER gives that uid a name:
# torch's inductor cache path calls getpass.getuser(), which fails for a uid without an /etc/passwd entry
# (pytorch/pytorch#140765).
HOME_VOLUME = "home"
HOME_DIR = "/home/vllm"
HOME_USER = "vllm"
# spec.model.cache: a volume that outlives the pod, mounted as the Hugging Face cache (HF_HOME; huggingface_hub's
# default is $HOME/.cache/huggingface, set explicitly so that the mount and the variable agree).
CACHE_VOLUME = "model-cache"
HF_CACHE_DIR = f"{HOME_DIR}/.cache/huggingface"
# A hostPath directory is created by the kubelet as root (0755): this init container hands it to the pod's uid.
CACHE_OWNER_CONTAINER = "model-cache-owner"
# Seconds added to vLLM's --shutdown-timeout for the pod's terminationGracePeriodSeconds, so Kubernetes does
# not SIGKILL a worker that is still draining.
GRACE_MARGIN_SECONDS = 30
# Model loading (download + weights + CUDA graphs) can take many minutes: the startup probe allows 30.
STARTUP_PROBE_PERIOD_SECONDS = 10
STARTUP_PROBE_FAILURES = 180

# `vllm serve` flags that change the KV-cache layout or the NIXL handshake (vLLM's own
# compute_nixl_compatibility_hash covers model, dtype, cache dtype, attention backend, hybrid KV manager,
# speculative config; block size is checked at handshake). A pool-level difference in one of these makes the
# pools' compatibility hashes differ, so the router never pairs them.
KV_LAYOUT_FLAGS = (
    "--dtype",
    "--kv-cache-dtype",
    "--block-size",
    "--quantization",
    "--attention-backend",
    "--speculative-config",
    "--revision",
    "--hf-overrides",
)
KV_LAYOUT_BOOL_FLAGS = ("--disable-hybrid-kv-cache-manager", "--no-disable-hybrid-kv-cache-manager")
# Short aliases of KV-layout flags (vllm 0.33.0, vllm/engine/arg_utils.py: `"--quantization", "-q"`).
KV_LAYOUT_SHORT_FLAGS = {"-q": "--quantization"}


def served_name(spec: DisaggregatedModelSpec) -> str:
    return spec.model.served_name or spec.model.name


def model_argument(spec: DisaggregatedModelSpec) -> str:
    """The positional model of `vllm serve`: the hub id, or the directory inside the mounted PVC."""
    pvc = spec.model.source.pvc
    if pvc is None:
        return spec.model.name
    return posixpath.normpath(posixpath.join(MODEL_MOUNT, pvc.path.lstrip("/")))


def gpu_count(pool: PoolSpec) -> int:
    p = pool.parallelism
    return pool.gpu.count if pool.gpu.count is not None else p.tensor * p.pipeline * p.data


def kv_layout_args(args: list[str]) -> list[str]:
    """The KV-layout-relevant flags of an argument list, in order, each as ``--canonical-name[.sub.keys][=value]``.

    Every spelling vLLM reads as the same flag counts the same (``option_name``: ``--kv_cache_dtype fp8``,
    ``--kv-cache-dtype=fp8``, ``-q fp8`` for ``--quantization fp8``), so that a spelling never splits (or hides) a
    KV-layout difference between the pools.
    """
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        option = option_name(arg)
        if option is None:
            continue
        written, name = option
        name = KV_LAYOUT_SHORT_FLAGS.get(name, name)
        if name not in KV_LAYOUT_FLAGS and name not in KV_LAYOUT_BOOL_FLAGS:
            continue
        _, dot, keys = written.partition(".")
        canonical = name + dot + keys
        if "=" in arg:
            out.append(f"{canonical}={arg.split('=', 1)[1]}")
        elif name in KV_LAYOUT_FLAGS and i < len(args) and option_name(args[i]) is None:
            out.append(f"{canonical}={args[i]}")
            i += 1
        else:
            out.append(canonical)
    return out


def compat_factors(spec: DisaggregatedModelSpec, role: Role) -> dict[str, Any]:
    """What goes into the compatibility hash (docs/operator.md, "Generation isolation")."""
    pool: PoolSpec | None = getattr(spec, role)
    kv = spec.kv_transfer
    return {
        "image": spec.engine.image,  # the vLLM + NIXL + UCX build
        "model": spec.model.name,
        "modelPath": model_argument(spec),
        "maxModelLen": spec.model.max_model_len,
        "engineArgs": list(spec.engine.extra_args),  # shared by every pool
        "engineEnv": spec.engine.env,  # e.g. VLLM_ATTENTION_BACKEND
        "poolKVArgs": kv_layout_args(pool.extra_args) if pool else [],
        "connector": kv.connector,
        "connectorExtraConfig": kv.extra_config,
        "ucxTLS": UCX_TLS[kv.transport],
    }


def compat_hash(spec: DisaggregatedModelSpec, role: Role) -> str:
    """Short hash of the settings prefill and decode must share; equal hashes may be paired by the router."""
    return short_hash(compat_factors(spec, role))


def engine_profile(spec: DisaggregatedModelSpec, role: Role) -> c.EngineProfile:
    """A pool's engines as the router's SLO placement prices them (perf/costs.py): GPU product, model,
    parallelism, batch limits and KV transport from the spec; what it does not say takes the defaults."""
    pool: PoolSpec = getattr(spec, role)
    p = pool.parallelism
    transport = spec.kv_transfer.transport
    return c.EngineProfile(
        gpu=pool.gpu.product or c.EngineProfile().gpu, model=spec.model.name, tensor_parallel_size=p.tensor,
        pipeline_parallel_size=p.pipeline, max_num_batched_tokens=chunk_budget(spec, role),
        max_num_seqs=pool.max_num_seqs, transport=transport if transport in ("rdma", "nvlink", "tcp") else "rdma")


def chunk_budget(spec: DisaggregatedModelSpec, role: Role) -> int | None:
    """``--max-num-batched-tokens`` of a pool: the spec's, else for the decode pool the largest budget whose one
    prefill chunk fits in spec.slo.tpotP95Ms (perf/costs.py ``tpot_chunk_budget``: it bounds what a prefill does to
    the streams running beside it), for the prefill pool of an elastic fleet the same but never below the prefill
    plateau (``prefill_chunk_budget``), else None (vLLM's default).

    Streams run on decode workers, and on prefill workers when the fleet is elastic (spec.routing.elasticFleet: a
    prefill worker serves whole requests). A prefill pool that only prefills keeps vLLM's default, and so does the
    aggregated pool (often an existing deployment kept as the fallback path: its spec says what it runs). Past a
    few thousand tokens a larger chunk buys no prefill throughput (docs/router.md "The pools' chunk budget")."""
    pool: PoolSpec = getattr(spec, role)
    if pool.max_num_batched_tokens:
        return pool.max_num_batched_tokens
    if pool.parallelism.expert or pool.parallelism.data > 1:
        return None  # expert / data parallel: the all-to-all back end sets its own token limits per rank
    prof = c.EngineProfile(gpu=pool.gpu.product or c.EngineProfile().gpu, model=spec.model.name,
                           tensor_parallel_size=pool.parallelism.tensor,
                           pipeline_parallel_size=pool.parallelism.pipeline, max_num_seqs=pool.max_num_seqs)
    cost = EngineCost.from_profile(prof)
    return pool_chunk_budget(cost, role, spec.slo.tpot_p95_ms / 1000.0, spec.routing.elastic_fleet,
                             pool.max_num_seqs or cost.max_num_seqs)


def worker_args(dm: DisaggregatedModel, role: Role, rank_args: Sequence[str] = ()) -> list[str]:
    """``vllm serve``'s arguments for a pool's workers; ``rank_args``: the flags of one rank of a multi-node replica
    (builders/multinode.py ``rank_flags``), placed after the operator's flags and before the user's extraArgs."""
    spec = dm.spec
    pool: PoolSpec = getattr(spec, role)
    p = pool.parallelism
    args = [
        model_argument(spec),
        "--port", str(spec.engine.port),
        "--served-model-name", served_name(spec),
        "--tensor-parallel-size", str(p.tensor),
    ]
    if p.pipeline > 1:
        args += ["--pipeline-parallel-size", str(p.pipeline)]
    if p.data > 1:
        args += ["--data-parallel-size", str(p.data)]
    if p.expert:
        args += ["--enable-expert-parallel"]
    if spec.model.max_model_len:
        args += ["--max-model-len", str(spec.model.max_model_len)]
    if pool.max_num_seqs:
        args += ["--max-num-seqs", str(pool.max_num_seqs)]
    budget = chunk_budget(spec, role)
    if budget:
        args += ["--max-num-batched-tokens", str(budget)]
    if role in KV_ROLES:
        args += ["--kv-transfer-config", kv_transfer_config_arg(spec, role)]
    if priority_scheduling(spec.routing):
        # tenant priorities reach the engine: vllm/engine/arg_utils.py `--scheduling-policy`
        # (SchedulerConfig.policy, fcfs | priority) and the request's `priority` field, both in 0.11.2 and 0.33.0
        args += ["--scheduling-policy", "priority"]
    args += shutdown_timeout_args(spec)  # drain on SIGTERM, where the release has the flag
    args += per_request_metrics_args(spec, role)  # exact prefill phases in the router, where the release has it
    args += kv_events_args(spec)  # the engine's KV cache events for the router's exact prefix index (issue 30)
    args += worker_tracing_args(spec)  # spec.observability.tracing
    args += list(rank_args)
    return args + list(spec.engine.extra_args) + list(pool.extra_args)


def merge_env(operator: list[dict[str, Any]], user: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operator's variables, then spec.engine.env's, one entry per name: a variable the user sets replaces the
    operator's (and a name the user lists twice keeps its last entry), since a container with a name twice is
    refused by server-side apply (env is a list map keyed by name). The user's entries come last, so that their
    ``$(VAR)`` references can use the operator's variables."""
    last = {e.get("name"): e for e in user}
    users = [copy.deepcopy(e) for e in user if last[e.get("name")] is e]
    return [e for e in operator if e.get("name") not in last] + users


def _cache_owner(image: str, pull_policy: str) -> dict[str, Any]:
    """Init container that gives a hostPath cache (created by the kubelet as root) to the worker's uid: root with
    only CAP_CHOWN, no privilege escalation. Pods that run as root (RDMA) need none."""
    return {
        "name": CACHE_OWNER_CONTAINER,
        "image": image,
        "imagePullPolicy": pull_policy,
        "command": ["chown", "-R", f"{NON_ROOT_UID}:{NON_ROOT_UID}", HF_CACHE_DIR],
        "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": HF_CACHE_DIR}],
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            **container_security_context(["CHOWN"]),
        },
    }


def _probe(path: str, period: int, failures: int, initial: int = 0) -> dict[str, Any]:
    probe: dict[str, Any] = {
        "httpGet": {"path": path, "port": c.WORKER_PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }
    if initial:
        probe["initialDelaySeconds"] = initial
    return probe


def _merge_affinity(user: dict[str, Any], terms: list[dict[str, Any]]) -> dict[str, Any]:
    affinity = copy.deepcopy(user)
    if terms:
        pod_aff = affinity.setdefault("podAffinity", {})
        required = pod_aff.setdefault("requiredDuringSchedulingIgnoredDuringExecution", [])
        required.extend(copy.deepcopy(terms))
    return affinity


def _worker_env(spec: DisaggregatedModelSpec, name: str, parts: TransportParts | None) -> list[dict[str, Any]]:
    """The vllm container's environment: the home directory, the KV transport's variables, the hub token, the
    Hugging Face cache, tracing, then the user's ``spec.engine.env`` over all of them."""
    env: list[dict[str, Any]] = [{"name": "HOME", "value": HOME_DIR}, {"name": "USER", "value": HOME_USER}]
    if parts:
        env += parts.env
    hub = spec.model.source.hub
    if hub is not None and hub.token_secret_ref is not None:
        env.append(
            {
                "name": "HF_TOKEN",
                "valueFrom": {
                    "secretKeyRef": {"name": hub.token_secret_ref.name, "key": hub.token_secret_ref.key}
                },
            }
        )
    if spec.model.cache is not None:
        env.append({"name": "HF_HOME", "value": HF_CACHE_DIR})
    env += worker_tracing_env(spec, name)
    return merge_env(env, spec.engine.env)


def _worker_storage(spec: DisaggregatedModelSpec, capabilities: list[str]
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes, the vllm container's mounts and the init containers they need: shared memory, a
    writable home, the model's PVC (read-only), the Hugging Face cache (a PVC, or a host path whose owner an
    init container sets when the engine does not run as root)."""
    volumes: list[dict[str, Any]] = [
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
        {"name": HOME_VOLUME, "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
        {"name": HOME_VOLUME, "mountPath": HOME_DIR},
    ]
    pvc = spec.model.source.pvc
    if pvc is not None:
        volumes.append({"name": MODEL_VOLUME, "persistentVolumeClaim": {"claimName": pvc.claim_name, "readOnly": True}})
        mounts.append({"name": MODEL_VOLUME, "mountPath": MODEL_MOUNT, "readOnly": True})
    init_containers: list[dict[str, Any]] = []
    cache = spec.model.cache
    if cache is not None:
        mounts.append({"name": CACHE_VOLUME, "mountPath": HF_CACHE_DIR})
        if cache.pvc is not None:
            volumes.append({"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": cache.pvc.claim_name}})
        elif cache.host_path is not None:
            volumes.append({"name": CACHE_VOLUME, "hostPath": {"path": cache.host_path, "type": "DirectoryOrCreate"}})
            if not runs_as_root(capabilities):
                init_containers.append(_cache_owner(spec.engine.image, spec.engine.image_pull_policy))
    return volumes, mounts, init_containers


def _worker_container(dm: DisaggregatedModel, role: Role, parts: TransportParts | None,
                      mounts: list[dict[str, Any]], capabilities: list[str]) -> dict[str, Any]:
    """The vllm container: ``vllm serve`` with the pool's arguments, its ports (HTTP and the KV transport's),
    GPUs and the transport's devices in its limits, health probes."""
    spec = dm.spec
    pool: PoolSpec = getattr(spec, role)
    # (the spec's podTemplate leaves the vllm container's command and args alone, and vLLM's side-channel ports,
    # sideChannelPort + each data-parallel rank, miss the HTTP port: api/semantics.py)
    ports = [{"name": c.WORKER_PORT_NAME, "containerPort": spec.engine.port, "protocol": "TCP"}]
    resources = copy.deepcopy(pool.resources)
    resources.setdefault("limits", {})
    resources["limits"][pool.gpu.resource_name] = str(gpu_count(pool))
    if parts:
        ports += parts.ports
        resources["limits"].update(parts.limits)
    return {
        "name": CONTAINER_NAME,
        "image": spec.engine.image,
        "imagePullPolicy": spec.engine.image_pull_policy,
        "command": ["vllm", "serve"],
        "args": worker_args(dm, role),
        "ports": ports,
        "env": _worker_env(spec, c.pool_name(model_name(dm), role), parts),
        "resources": resources,
        "volumeMounts": mounts,
        "startupProbe": _probe("/health", STARTUP_PROBE_PERIOD_SECONDS, STARTUP_PROBE_FAILURES),
        "readinessProbe": _probe("/health", 5, 3),
        "livenessProbe": _probe("/health", 10, 6),
        "securityContext": container_security_context(capabilities),
    }


def worker_pod_template(dm: DisaggregatedModel, role: Role) -> dict[str, Any]:
    """The pool's pod template: the vllm container, its storage, scheduling (GPU product, node selector,
    tolerations, the transport's affinity), security, Prometheus annotations, and ``spec.<pool>.podTemplate``
    merged over it (the selector labels kept). The Deployment's (:func:`worker_deployment`), and the base of a
    multi-node pool's per-rank templates (multinode.py)."""
    spec = dm.spec
    pool: PoolSpec = getattr(spec, role)
    model = model_name(dm)
    chash = compat_hash(spec, role)
    # The model's own labels stay off the pod template: a label edit on the model must not roll a GPU pool
    # (it would drop prefix caches and long streams). Pod labels are set explicitly in spec.<pool>.podTemplate.
    pod_labels = {**role_labels(model, role), c.LABEL_COMPAT: chash}
    parts = transport_parts(spec.kv_transfer, model) if role in KV_ROLES else None
    capabilities = list(parts.capabilities) if parts else []
    volumes, mounts, init_containers = _worker_storage(spec, capabilities)

    node_selector = dict(pool.node_selector)
    if pool.gpu.product:
        node_selector[pool.gpu.product_label] = pool.gpu.product
    pod_spec: dict[str, Any] = {
        **({"initContainers": init_containers} if init_containers else {}),
        "containers": [_worker_container(dm, role, parts, mounts, capabilities)],
        "volumes": volumes,
        # vLLM reads VLLM_* variables; service links would inject e.g. VLLM_PORT for a Service named "vllm".
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": spec.engine.shutdown_timeout_seconds + GRACE_MARGIN_SECONDS,
        "securityContext": pod_security_context(capabilities),
    }
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if pool.tolerations:
        pod_spec["tolerations"] = copy.deepcopy(pool.tolerations)
    affinity = _merge_affinity(pool.affinity, parts.pod_affinity_terms if parts else [])
    if affinity:
        pod_spec["affinity"] = affinity
    if spec.engine.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in spec.engine.image_pull_secrets]

    template: dict[str, Any] = {
        "metadata": {
            "labels": pod_labels,
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(spec.engine.port),
                "prometheus.io/path": "/metrics",
            },
        },
        "spec": pod_spec,
    }
    if pool.pod_template:
        template = strategic_merge(template, pool.pod_template)
        # The selector labels must survive any override, or the Deployment would not own its pods.
        template.setdefault("metadata", {}).setdefault("labels", {}).update(
            {**selector_labels(model, role), c.LABEL_COMPAT: chash}
        )
    return template


def worker_deployment(dm: DisaggregatedModel, role: Role) -> dict[str, Any]:
    """The pool's Deployment (a single-node pool): :func:`worker_pod_template`, its replicas and rollout."""
    pool: PoolSpec = getattr(dm.spec, role)
    model = model_name(dm)
    labels = {**role_labels(model, role), c.LABEL_COMPAT: compat_hash(dm.spec, role)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(dm, c.pool_name(model, role), labels),
        "spec": {
            "replicas": desired_replicas(dm, role),
            "selector": {"matchLabels": selector_labels(model, role)},
            # spec.<pool>.rollingUpdate; the default keeps serving capacity (one extra worker at a time, none taken
            # away early) and needs a spare replica's GPUs (docs/production-checklist.md, "Rollouts").
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {
                "maxSurge": pool.rolling_update.max_surge, "maxUnavailable": pool.rolling_update.max_unavailable}},
            "progressDeadlineSeconds": STARTUP_PROBE_PERIOD_SECONDS * STARTUP_PROBE_FAILURES + 600,
            "revisionHistoryLimit": 5,
            "template": worker_pod_template(dm, role),
        },
    }


def pool_security_level(dm: DisaggregatedModel, role: Role) -> Level:
    """The strictest Pod Security Standard the pool's pods meet as rendered (before podTemplate overrides):
    ``restricted``, except KV-connected pods of transport rdma (IPC_LOCK) and every pool with a hostPath model
    cache (spec.model.cache.hostPath): ``privileged``."""
    if dm.spec.model.cache is not None and dm.spec.model.cache.host_path is not None:
        return "privileged"  # hostPath volumes: refused by baseline and restricted
    if role not in KV_ROLES:
        return level_for(())
    return level_for(transport_parts(dm.spec.kv_transfer, model_name(dm)).capabilities)


def worker_service(dm: DisaggregatedModel, role: Role) -> dict[str, Any]:
    """Headless Service of a pool: the router discovers worker pod IPs through its EndpointSlices."""
    spec = dm.spec
    model = model_name(dm)
    ports = [{"name": c.WORKER_PORT_NAME, "port": spec.engine.port, "targetPort": c.WORKER_PORT_NAME,
              "protocol": "TCP"}]
    if role in KV_ROLES:
        kv_port = spec.kv_transfer.side_channel_port
        ports.append({"name": c.SIDE_CHANNEL_PORT_NAME, "port": kv_port, "targetPort": c.SIDE_CHANNEL_PORT_NAME,
                      "protocol": "TCP"})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(dm, c.pool_name(model, role), role_labels(model, role)),
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(model, role),
            "ports": ports,
        },
    }


def worker_pdb(dm: DisaggregatedModel, role: Role) -> dict[str, Any]:
    """Voluntary disruptions (node drains) take at most one worker of a pool at a time."""
    model = model_name(dm)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(dm, c.pool_name(model, role), role_labels(model, role)),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(model, role)}},
    }


def worker_roles(dm: DisaggregatedModel) -> list[Role]:
    roles: list[Role] = ["prefill", "decode"]
    if dm.spec.aggregated is not None:
        roles.append("aggregated")
    return roles
