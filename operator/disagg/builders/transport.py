"""KV-cache transport (spec.kvTransfer): the vLLM connector config, NIXL side channel and UCX settings.

docs/kv-transport.md explains every variable and capability rendered here, with sources.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..api import contract as c
from ..api.contract import Role
from ..api.models import KVTransferSpec

# kv_role per pool (vLLM KVTransferConfig.kv_role: kv_producer | kv_consumer | kv_both). Not kv_both: vLLM 0.33.0
# deprecates it for the NixlConnector (distributed/kv_transfer/kv_connector/v1/nixl/connector.py, NixlBaseConnector
# __init__: "Please set kv_role='kv_producer' for prefill instances and kv_role='kv_consumer' for decode
# instances"), and it is not needed for one elastic fleet: the connector's per-request behaviour follows the request's
# kv_transfer_params, not the role (nixl/pull_scheduler.py get_num_new_matched_tokens / request_finished return early
# without them), so a prefill worker serves a whole request and a decode worker prefills locally as they are.
KV_ROLES: dict[str, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}

# UCX_TLS per transport. None: leave UCX_TLS unset, UCX picks among everything it finds ("all").
UCX_TLS: dict[str, str | None] = {
    # RC verbs (UD is added by UCX for bootstrap), GPU memory via cuda_copy, same-node peers via cuda_ipc.
    "rdma": "rc,cuda_copy,cuda_ipc",
    # CUDA IPC over NVLink between GPUs of one node / NVLink domain; tcp carries UCX wire-up and is the
    # fallback when CUDA IPC is not possible between the two pods.
    "nvlink": "cuda_ipc,cuda_copy,tcp",
    # Host-staged: GPU → host (cuda_copy) → TCP sockets. Works everywhere, slow for long prompts.
    "tcp": "tcp,cuda_copy",
    "auto": None,
}

HOSTNAME_TOPOLOGY_KEY = "kubernetes.io/hostname"


@dataclass
class TransportParts:
    """What a KV-connected worker container and pod get from spec.kvTransfer."""

    env: list[dict[str, Any]] = field(default_factory=list)
    ports: list[dict[str, Any]] = field(default_factory=list)
    limits: dict[str, str] = field(default_factory=dict)
    capabilities: list[str] = field(default_factory=list)
    pod_affinity_terms: list[dict[str, Any]] = field(default_factory=list)


def kv_transfer_config(kv: KVTransferSpec, role: Role) -> dict[str, Any]:
    """The ``--kv-transfer-config`` object for a prefill (producer) or decode (consumer) worker."""
    out: dict[str, Any] = {"kv_connector": kv.connector, "kv_role": KV_ROLES[role]}
    if role == "decode":
        # Only the consumer loads KV; the policy says what happens when that load fails.
        out["kv_load_failure_policy"] = kv.load_failure_policy
    if kv.extra_config:
        out["kv_connector_extra_config"] = kv.extra_config
    return out


def kv_transfer_config_json(kv: KVTransferSpec, role: Role) -> str:
    return json.dumps(kv_transfer_config(kv, role), separators=(",", ":"), sort_keys=False)


def transport_parts(kv: KVTransferSpec, model: str) -> TransportParts:
    parts = TransportParts()
    parts.env = [
        # NIXL's handshake (side channel): the address peers connect to, so it must be the pod IP, not the
        # default "localhost".
        {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(kv.side_channel_port)},
    ]
    parts.ports = [{"name": c.SIDE_CHANNEL_PORT_NAME, "containerPort": kv.side_channel_port, "protocol": "TCP"}]
    tls = UCX_TLS[kv.transport]
    if tls:
        parts.env.append({"name": "UCX_TLS", "value": tls})
    if kv.transport == "rdma":
        rdma = kv.rdma
        resource = rdma.resource_name if rdma else "rdma/ib"
        count = rdma.count if rdma else 1
        parts.limits[resource] = str(count)
        # Registering (pinning) GPU and host memory for RDMA needs locked memory beyond the default RLIMIT.
        parts.capabilities.append("IPC_LOCK")
        if rdma and rdma.devices:
            parts.env.append({"name": "UCX_NET_DEVICES", "value": ",".join(rdma.devices)})
    if kv.transport == "nvlink":
        # Keep every KV-connected worker of this model on one node (one NVLink domain). The term matches the
        # pods' own labels, so the first pod schedules anywhere and the others join it (no deadlock).
        parts.pod_affinity_terms.append(
            {
                "labelSelector": {
                    "matchExpressions": [
                        {"key": c.LABEL_MODEL, "operator": "In", "values": [model]},
                        {"key": c.LABEL_ROLE, "operator": "In", "values": ["prefill", "decode"]},
                    ]
                },
                "topologyKey": HOSTNAME_TOPOLOGY_KEY,
            }
        )
    return parts


def transport_summary(kv: KVTransferSpec) -> tuple[str, str]:
    """(reason, message) for the KVTransferHealthy condition when the operator configures the transport."""
    tls = UCX_TLS[kv.transport]
    if kv.transport == "tcp":
        return (
            "SlowTransportTCP",
            "KV cache moves over TCP (UCX_TLS=tcp,cuda_copy, staged through host memory): long prompts pay for "
            "it in TTFT. Use transport rdma (InfiniBand/RoCE) or nvlink (one node) for production.",
        )
    if kv.transport == "auto":
        return "TransportConfigured", "transport auto: UCX chooses among the transports it finds (UCX_TLS unset)."
    return "TransportConfigured", f"transport {kv.transport}: UCX_TLS={tls}."
