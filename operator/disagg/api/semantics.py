"""The operator's own checks of a spec that the apiserver admits (no CEL rule can say them).

``semantic_errors`` is what the operator refuses on top of the CRD, besides the builders' other ``BuildError`` cases:
``disagg validate`` reports these as the operator's, distinct from the apiserver's errors; the builders raise them
(``BuildError``), so the operator reports them as ``Ready=False`` reason ``InvalidSpec``.

A pool's ``podTemplate`` is a free-form object (``x-kubernetes-preserve-unknown-fields``), whose unknown fields CEL
cannot read: what it may not override is checked here.
"""

from __future__ import annotations

from typing import Any

from .spec import DisaggregatedModelSpec

WORKER_CONTAINER = "vllm"
"""The name of the container that runs `vllm serve` in every worker pod (builders/workers.py)."""
OPERATOR_OWNED_CONTAINER_FIELDS = ("command", "args")


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


def semantic_errors(spec: DisaggregatedModelSpec) -> list[str]:
    """What the operator refuses in a spec the apiserver accepts, each naming the field."""
    out: list[str] = []
    for role in ("prefill", "decode", "aggregated"):
        pool = getattr(spec, role)
        if pool is not None:
            out += pod_template_errors(f"spec.{role}.podTemplate", pool.pod_template)
    return out
