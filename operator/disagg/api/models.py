"""The DisaggregatedModel API (serving.disagg.dev/v1alpha1), defined once: the resource, and the public surface.

The API is split by concern:

- ``spec.py``: the spec models (what the user asks for) and their single-field constraints;
- ``status.py``: the status models (what the operator observed and decided);
- ``rules.py``: the cross-field rules, one table from which both the CRD's CEL ``x-kubernetes-validations``
  and the Python check ``spec_errors`` are generated (rules.py reads spec.py, never the other way);
- ``semantics.py``: what only the operator refuses (no CEL rule can say it); ``validate.py``: all of it offline;
- this module: the resource's names and the ``DisaggregatedModel`` object itself, which checks the cross-field
  rules when parsed (as the apiserver does on create), ``parse_model``, and the names the rest of the code imports
  (``from disagg.api.models import …``), re-exported.

The CRD in crds/ is generated from these models (``disagg crds``, crd.py); a test fails when they drift.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import Field, ValidationError, model_validator

from .base import ApiModel
from .rules import RULES, Rule, rules_for, spec_errors
from .spec import (
    DEFAULT_VLLM_IMAGE,
    DNS_LABEL,
    FREEFORM,
    FREEFORM_ITEMS,
    AutoscalingSpec,
    CachePVC,
    CanarySpec,
    CircuitBreakerSpec,
    DisaggregatedModelSpec,
    EngineSpec,
    FallbackPolicy,
    GPUSpec,
    HubSource,
    KVTransferSpec,
    LocalPrefillOverride,
    LocalPrefillPolicy,
    Mode,
    ModelCacheSpec,
    ModelSourceSpec,
    ModelSpec,
    ModePolicySpec,
    ModeProbeSpec,
    ParallelismSpec,
    PoolSpec,
    PrometheusSpec,
    PromptBucket,
    PVCSource,
    RatioBounds,
    RDMASpec,
    RemotePrefillOverride,
    RemotePrefillPolicy,
    RollingUpdateSpec,
    RolloutSpec,
    RoutingSpec,
    SecretKeyRef,
    SLOSpec,
    TenantMatch,
    TenantPolicy,
)
from .status import (
    ActiveMode,
    Condition,
    DisaggregatedModelStatus,
    ObservedStatus,
    PoolsStatus,
    PoolStatus,
    RoleMoves,
    ScaleEvent,
)

GROUP: Final = "serving.disagg.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = "serving.disagg.dev/v1alpha1"  # GROUP/VERSION, spelled out: it is also a Literal type below
KIND: Final = "DisaggregatedModel"
PLURAL: Final = "disaggregatedmodels"
SINGULAR: Final = "disaggregatedmodel"
SHORT_NAMES: Final = ["dm"]


class DisaggregatedModel(ApiModel):
    api_version: Literal["serving.disagg.dev/v1alpha1"] = Field(default=API_VERSION, description="API version.")
    kind: Literal["DisaggregatedModel"] = Field(default=KIND, description="Kind.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: DisaggregatedModelSpec = Field(description="Desired state.")
    status: DisaggregatedModelStatus | None = Field(default=None, description="Observed state.")

    @model_validator(mode="after")
    def _cross_field(self) -> DisaggregatedModel:
        """The rules that relate several fields of the spec (rules.py), checked as the apiserver's CEL checks them."""
        for err in spec_errors(self.spec):
            raise ValueError(err)
        return self


def parse_model(body: Mapping[str, Any]) -> DisaggregatedModel:
    """A DisaggregatedModel from a raw object: the spec strictly (pydantic errors propagate, the cross-field rules
    included), the status leniently (a status another writer left in an unexpected shape is dropped rather than
    blocking reconciliation)."""
    raw = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
    dm = DisaggregatedModel.model_validate(raw)
    status = body.get("status")
    if status:
        try:
            dm.status = DisaggregatedModelStatus.model_validate(
                {k: v for k, v in status.items() if k in DisaggregatedModelStatus.model_fields
                 or k in {f.alias for f in DisaggregatedModelStatus.model_fields.values()}}
            )
        except ValidationError:
            dm.status = None
    return dm


__all__ = [
    "API_VERSION",
    "DEFAULT_VLLM_IMAGE",
    "DNS_LABEL",
    "FREEFORM",
    "FREEFORM_ITEMS",
    "GROUP",
    "KIND",
    "PLURAL",
    "RULES",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "ActiveMode",
    "AutoscalingSpec",
    "CachePVC",
    "CanarySpec",
    "CircuitBreakerSpec",
    "Condition",
    "DisaggregatedModel",
    "DisaggregatedModelSpec",
    "DisaggregatedModelStatus",
    "EngineSpec",
    "FallbackPolicy",
    "GPUSpec",
    "HubSource",
    "KVTransferSpec",
    "LocalPrefillOverride",
    "LocalPrefillPolicy",
    "Mode",
    "ModePolicySpec",
    "ModeProbeSpec",
    "ModelCacheSpec",
    "ModelSourceSpec",
    "ModelSpec",
    "ObservedStatus",
    "PVCSource",
    "ParallelismSpec",
    "PoolSpec",
    "PoolStatus",
    "PoolsStatus",
    "PrometheusSpec",
    "PromptBucket",
    "RDMASpec",
    "RatioBounds",
    "RemotePrefillOverride",
    "RemotePrefillPolicy",
    "RoleMoves",
    "RollingUpdateSpec",
    "RolloutSpec",
    "RoutingSpec",
    "Rule",
    "SLOSpec",
    "ScaleEvent",
    "SecretKeyRef",
    "TenantMatch",
    "TenantPolicy",
    "parse_model",
    "rules_for",
    "spec_errors",
]
