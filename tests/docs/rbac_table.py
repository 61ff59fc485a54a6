"""docs/install.md's RBAC table, generated from the chart as Helm renders it (tests/chart/render.py).

One row per rule of the operator's ClusterRole/Role, in template order, from two renders: the defaults
(``watch.scope: cluster``) and ``watch.scope: namespace``; a rule only one of them grants says which. The verbs and
resources come from the rendered chart; only the "why" is written here, per rule, so a rule the chart gains
without a reason here fails (``KeyError``) instead of going undocumented.

Regenerate the table in docs/install.md (between the ``rbac-table`` markers) with::

    .venv/bin/python -m tests.docs.rbac_table
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from tests.chart.render import documents, render
from tests.paths import REPO

INSTALL = REPO / "docs" / "install.md"
BEGIN = "<!-- rbac-table: generated from the rendered chart by `python -m tests.docs.rbac_table`; do not edit -->"
END = "<!-- /rbac-table -->"

SCOPES: dict[str, dict[str, Any]] = {
    "cluster": {},
    "namespace": {"watch": {"scope": "namespace", "namespaces": ["team-a"]}},
}

Rule = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]  # (apiGroups, resources, verbs)

# (apiGroups, resources) → why the operator needs the rule.
WHY: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {
    (("serving.disagg.dev",), ("disaggregatedmodels",)): "the API; kopf's finalizers and annotations (patch)",
    (("serving.disagg.dev",), ("disaggregatedmodels/status",)): "status, conditions",
    (("serving.disagg.dev",), ("disaggregatedmodels/finalizers",)):
        "children carry an owner reference with `blockOwnerDeletion`: the OwnerReferencesPermissionEnforcement "
        "admission plugin requires `update` on the owner's finalizers",
    (("apps",), ("deployments",)): "the worker pools and the router",
    (("apps",), ("statefulsets",)): "multi-node pools, StatefulSet back end ([multinode](multinode.md))",
    (("leaderworkerset.x-k8s.io",), ("leaderworkersets",)):
        "multi-node pools, LeaderWorkerSet back end (when its CRD is installed)",
    (("",), ("pods",)):
        "`delete`: a multi-node group whose member failed starts over: the operator deletes the group's pods "
        "(StatefulSet back end) and its StatefulSets recreate them; `patch`: before a scale-down the autoscaler "
        "sets each pool pod's `controller.kubernetes.io/pod-deletion-cost` (its in-flight requests), so the idlest "
        "pods go; it never creates pods",
    (("apps",), ("deployments/scale",)): "the autoscaler sets pool sizes through the scale subresource",
    (("",), ("namespaces",)):
        "reads the model's namespace's `pod-security.kubernetes.io/enforce` label (the `PodSecurity` condition)",
    (("",), ("services", "configmaps", "serviceaccounts")):
        "the pools' headless Services; the router's Service, ConfigMap and ServiceAccount",
    (("policy",), ("poddisruptionbudgets",)): "one PodDisruptionBudget per worker pool",
    (("rbac.authorization.k8s.io",), ("roles", "rolebindings")): "each router's Role and RoleBinding",
    (("",), ("pods", "endpoints")):
        "`pods`: listing and watching the pods of multi-node groups, and each router's Role grants pod reads, "
        "which the operator must hold to grant (RBAC escalation prevention; no `escalate`/`bind` verbs); "
        "`endpoints`: read only",
    (("discovery.k8s.io",), ("endpointslices",)):
        "each router's Role grants it, so the operator must hold it too",
    (("",), ("secrets",)):
        "the one Secret named by `spec.autoscaling.prometheus.authSecretRef`, read on demand; only with "
        "`rbac.readSecrets` (default `true`)",
    (("",), ("events",)): "Events on models (kopf posts core/v1 Events)",
    (("events.k8s.io",), ("events",)): "Events on models (events.k8s.io, for newer clients)",
    (("apiextensions.k8s.io",), ("customresourcedefinitions",)):
        "kopf's resource discovery (with `watch.scope: namespace`, a ClusterRole of its own: `rbac.crdRead`)",
    (("kopf.dev",), ("clusterkopfpeerings",)): "kopf's peering, cluster-wide",
    (("kopf.dev",), ("kopfpeerings",)): "kopf's peering, in each watched namespace",
}


def operator_rules(values: dict[str, Any]) -> list[Rule]:
    """Every rule the rendered chart grants the operator (its ClusterRoles and Roles), in template order, once."""
    out: list[Rule] = []
    for doc in documents(render(values)):
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in doc.get("rules") or []:
            key = (tuple(rule.get("apiGroups") or ()), tuple(rule.get("resources") or ()),
                   tuple(rule.get("verbs") or ()))
            if key not in out:
                out.append(key)
    return out


def granted(scopes: Iterable[str] = SCOPES) -> dict[Rule, list[str]]:
    """Rule → the watch scopes whose render grants it, in first-seen order."""
    out: dict[Rule, list[str]] = {}
    for scope in scopes:
        for rule in operator_rules(SCOPES[scope]):
            out.setdefault(rule, []).append(scope)
    return out


def _resources(groups: tuple[str, ...], resources: tuple[str, ...]) -> str:
    names = ", ".join(f"`{r}`" for r in resources)
    named = [g for g in groups if g]
    return f"{names} ({', '.join(named)})" if named else names


def table() -> str:
    """The markdown table, header included, one line per row, ending with a newline."""
    lines = ["| resources (API group) | verbs | why |", "| --- | --- | --- |"]
    for (groups, resources, verbs), scopes in granted().items():
        why = WHY.get((groups, resources))
        if why is None:
            raise KeyError(f"the chart grants {groups} {resources} {verbs}: add why to tests/docs/rbac_table.py WHY")
        if len(scopes) < len(SCOPES):
            why += f" (only with `watch.scope: {scopes[0]}`)"
        lines.append(f"| {_resources(groups, resources)} | {' '.join(verbs)} | {why} |")
    return "\n".join(lines) + "\n"


def documented(text: str) -> str:
    """What install.md holds between the markers."""
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "docs/install.md: the rbac-table markers are missing"
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def write() -> bool:
    """Rewrite the table in docs/install.md; True when it changed."""
    text = INSTALL.read_text()
    old = documented(text)
    new = table()
    if old == new:
        return False
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    INSTALL.write_text(f"{before}{BEGIN}\n{new}{END}{after}")
    return True


if __name__ == "__main__":
    print(f"{INSTALL}: {'rewritten' if write() else 'up to date'}")
    sys.exit(0)
