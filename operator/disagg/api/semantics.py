"""The operator's own checks of a spec that the apiserver admits (no CEL rule says them).

``semantic_errors`` is what the operator refuses on top of the CRD, besides the builders' ``BuildError`` cases:
``disagg validate`` reports these as the operator's, distinct from the apiserver's errors.
"""

from __future__ import annotations

from .spec import DisaggregatedModelSpec

RDMA_BLOCK_REQUIRED = (
    "spec.kvTransfer.rdma: transport rdma needs an rdma block naming the RDMA device plugin's resource "
    "(spec.kvTransfer.rdma.resourceName, e.g. rdma/hca_shared_devices_a); without one every KV-connected pod would "
    "silently request rdma/ib, and stay Pending where the cluster advertises another name. Write `rdma: {}` to "
    "take rdma/ib × 1 explicitly"
)


def semantic_errors(spec: DisaggregatedModelSpec) -> list[str]:
    """What the operator refuses in a spec the apiserver accepts, each naming the field."""
    out: list[str] = []
    kv = spec.kv_transfer
    if kv.transport == "rdma" and kv.rdma is None:
        out.append(RDMA_BLOCK_REQUIRED)
    return out
