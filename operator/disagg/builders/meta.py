"""Names, labels, owner references and hashes shared by every child object."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from ..api import contract as c
from ..api.contract import Role
from ..api.models import API_VERSION, KIND, DisaggregatedModel

# Annotation on every child: hash of the manifest the operator applied. A child whose annotation differs from
# the freshly built manifest's is re-applied; that is how removed fields (which a live-vs-desired subset check
# cannot see) reach the cluster.
ANNOTATION_SPEC_HASH = "serving.disagg.dev/spec-hash"
# Annotation on a pool Deployment (its own metadata, not the pod template): hash of ``spec.template`` as the
# operator rendered it. The reconciler compares it to tell a change of what the pods run (a roll) from a change of
# the Deployment object alone, and holds template changes that come from a new operator version (no spec change)
# to roll one model at a time (docs/operator.md, "Operator upgrades").
ANNOTATION_TEMPLATE_HASH = "serving.disagg.dev/template-hash"

# Labels and annotations of a DisaggregatedModel are copied to its children (cost allocation, ownership and
# team labels, GitOps-independent tooling), as dask-kubernetes' operator does, except keys that belong to a tool:
# copying them would make that tool think it owns, tracks or prunes the children. A key is excluded when its
# prefix (before "/") is one of these domains or a subdomain of one ("meta.helm.sh" is under "helm.sh").
EXCLUDED_PREFIX_DOMAINS = (
    "kubernetes.io",  # reserved for Kubernetes components: kubectl.kubernetes.io/last-applied-configuration, …
    "k8s.io",  # reserved likewise (kustomize.config.k8s.io, …)
    "disagg.dev",  # the operator's own (serving.disagg.dev/*): it sets these itself
    "kopf.zalando.org",  # kopf's handler state (last-handled-configuration, progress)
    "kopf.dev",
    "helm.sh",  # helm.sh/chart, helm.sh/hook*, meta.helm.sh/release-name|namespace (Helm's ownership check)
    "argoproj.io",  # argocd.argoproj.io/tracking-id, sync options: Argo CD would prune children as its own
    "fluxcd.io",  # kustomize.toolkit.fluxcd.io/*, helm.toolkit.fluxcd.io/*: Flux garbage-collects by these
    "k14s.io",  # kapp.k14s.io/* (Carvel kapp's ownership labels)
    "cattle.io",  # objectset.rio.cattle.io/* (Rancher Fleet's apply ownership)
)
# Subdomains of an excluded domain that users may set: the recommended app.kubernetes.io/* labels (the
# operator's own name/instance/component/part-of still win on conflict).
ALLOWED_PREFIX_DOMAINS = ("app.kubernetes.io",)
# Single keys owned by a tool or controller: Helm's managed-by, the Deployment/StatefulSet controllers' hashes.
EXCLUDED_KEYS = frozenset({"app.kubernetes.io/managed-by", "pod-template-hash", "controller-revision-hash"})


def model_name(dm: DisaggregatedModel) -> str:
    """The model's name, which every child's name starts with. The builders assume a model the API admits
    (api/semantics.py ``model_errors``): named, and short enough for every child's name."""
    name = dm.metadata.get("name")
    assert name, "metadata.name: required (api/semantics.py name_errors)"
    return str(name)


def namespace_of(dm: DisaggregatedModel) -> str | None:
    ns = dm.metadata.get("namespace")
    return str(ns) if ns else None


def _under(domain: str, parent: str) -> bool:
    return domain == parent or domain.endswith("." + parent)


def propagates(key: str) -> bool:
    """Whether a label or annotation key of the DisaggregatedModel is copied to its children."""
    if key in EXCLUDED_KEYS:
        return False
    if "/" not in key:
        return True
    domain = key.split("/", 1)[0].lower()
    if any(_under(domain, d) for d in ALLOWED_PREFIX_DOMAINS):
        return True
    return not any(_under(domain, d) for d in EXCLUDED_PREFIX_DOMAINS)


def _propagated(dm: DisaggregatedModel, field: str) -> dict[str, str]:
    items = dm.metadata.get(field) or {}
    return {str(k): str(v) for k, v in sorted(items.items()) if propagates(str(k))}


def propagated_labels(dm: DisaggregatedModel) -> dict[str, str]:
    """The DisaggregatedModel's labels that its children (and their pod templates) carry too."""
    return _propagated(dm, "labels")


def propagated_annotations(dm: DisaggregatedModel) -> dict[str, str]:
    """The DisaggregatedModel's annotations that its children carry too (not their pod templates)."""
    return _propagated(dm, "annotations")


def with_model_labels(dm: DisaggregatedModel, labels: dict[str, str]) -> dict[str, str]:
    """``labels`` plus the model's propagated labels; the operator's own win on conflict."""
    return {**propagated_labels(dm), **labels}


def common_labels(model: str) -> dict[str, str]:
    return {
        c.LABEL_NAME: c.APP_NAME,
        c.LABEL_INSTANCE: model,
        c.LABEL_MANAGED_BY: c.MANAGED_BY,
        c.LABEL_PART_OF: c.APP_NAME,
        c.LABEL_MODEL: model,
    }


def role_labels(model: str, role: Role) -> dict[str, str]:
    return {**common_labels(model), c.LABEL_COMPONENT: role, c.LABEL_ROLE: role}


def selector_labels(model: str, role: Role) -> dict[str, str]:
    """Immutable Deployment selector and Service selector: model + role (never the compat hash, which changes)."""
    return {c.LABEL_MODEL: model, c.LABEL_ROLE: role}


def owner_references(dm: DisaggregatedModel) -> list[dict[str, Any]]:
    """The DisaggregatedModel as controller owner; empty when it has no uid yet (``disagg render``)."""
    uid = dm.metadata.get("uid")
    if not uid:
        return []
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": model_name(dm),
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def object_meta(dm: DisaggregatedModel, name: str, labels: dict[str, str],
                annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """metadata of a child: the operator's labels and annotations over the model's propagated ones."""
    meta: dict[str, Any] = {"name": name}
    ns = namespace_of(dm)
    if ns:
        meta["namespace"] = ns
    meta["labels"] = with_model_labels(dm, labels)
    merged_annotations = {**propagated_annotations(dm), **(annotations or {})}
    if merged_annotations:
        meta["annotations"] = merged_annotations
    owners = owner_references(dm)
    if owners:
        meta["ownerReferences"] = owners
    return meta


def short_hash(value: Any, length: int = 10) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def stamp_spec_hash(obj: dict[str, Any]) -> dict[str, Any]:
    """Add ANNOTATION_SPEC_HASH: the hash of the whole manifest without that annotation."""
    body = copy.deepcopy(obj)
    body.setdefault("metadata", {}).setdefault("annotations", {}).pop(ANNOTATION_SPEC_HASH, None)
    digest = short_hash(body, 16)
    obj.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION_SPEC_HASH] = digest
    return obj


def template_hash(obj: dict[str, Any]) -> str:
    """Hash of a workload's ``spec.template`` (what its pods run)."""
    return short_hash((obj.get("spec") or {}).get("template") or {}, 16)


def stamp_template_hash(obj: dict[str, Any]) -> dict[str, Any]:
    """Add ANNOTATION_TEMPLATE_HASH to a workload's metadata and re-stamp its spec hash (which then covers it)."""
    obj.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION_TEMPLATE_HASH] = template_hash(obj)
    return stamp_spec_hash(obj)
