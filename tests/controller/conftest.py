"""Fixtures for controller tests: run the real operator (kopf.testing.KopfRunner) against the fixture apiserver."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import kopf
import pytest
import yaml
from kopf.testing import KopfRunner
from kubernetes import client

from disagg import poll
from disagg.api.contract import LABEL_MODEL
from disagg.api.models import GROUP, PLURAL, VERSION
from disagg.builders import BuildSettings
from disagg.controller.handlers import ControllerConfig, operator_settings, register
from disagg.controller.kubeio import KINDS, Kube
from disagg.controller.reconcile import Reconciler

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")
TEST_BUILD = BuildSettings(router_image="disagg:test")

EXAMPLES = {p.stem: p for p in sorted((REPO / "docs" / "examples").glob("*.yaml"))}


def wait_for(check: Callable[[], T | None], timeout: float = 30.0, what: str = "condition",
             interval: float = 0.2) -> T:
    """Poll until check() returns something truthy and return it (disagg.poll.wait_for: WaitTimeoutError with the
    last value at the deadline); an ApiException means "not yet" (the apiserver starting, an object not there)."""
    return poll.wait_for(check, timeout, what, interval=interval, retry_on=(client.ApiException,))


@contextlib.contextmanager
def running_operator(kubeconfig: str, namespace: str, autoscaler: bool = False, *,
                     reconciler: Reconciler | None = None, **config: Any) -> Iterator[Reconciler]:
    """The operator's kopf handlers running in this process; ``reconciler``: one of the test's own (a fake clock, a
    different rendering); ``config``: more ControllerConfig fields."""
    registry = kopf.OperatorRegistry()
    # By default the reconciler alone: the autoscaler daemon (which needs a Prometheus) has its own suite.
    rec = register(registry, ControllerConfig(kubeconfig=kubeconfig, build=TEST_BUILD, autoscaler=autoscaler, **config),
                   reconciler=reconciler)
    settings = operator_settings()
    settings.watching.server_timeout = 60
    with KopfRunner(["run", "--standalone", "--namespace", namespace], registry=registry, settings=settings,
                    timeout=30) as runner:
        yield rec
    assert runner.exception is None, runner.exception


@pytest.fixture
def operator(control_plane, namespace: str) -> Iterator[Reconciler]:
    with running_operator(str(control_plane.kubeconfig), namespace) as rec:
        yield rec


@pytest.fixture
def start_operator(control_plane, namespace: str):
    """For tests that stop and restart the operator: ``with start_operator(): ...``."""
    return lambda autoscaler=False: running_operator(str(control_plane.kubeconfig), namespace, autoscaler)


def listed_children(kube: Kube, ns: str, model: str,
                    kinds: Iterable[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """A model's children of ``kinds`` as the apiserver lists them now (the operator's watch cache, read directly)."""
    out = {}
    for kind in kinds:
        _, prefix, plural = KINDS[kind]
        listed = kube.request("GET", f"{prefix}/namespaces/{ns}/{plural}",
                              query=[("labelSelector", f"{LABEL_MODEL}={model}")]) or {}
        for obj in listed.get("items") or []:
            obj["kind"] = kind
            out[(kind, obj["metadata"]["name"])] = obj
    return out


def load_example(name: str) -> dict[str, Any]:
    return yaml.safe_load(EXAMPLES[name].read_text())


class Cluster:
    """Small typed helpers over the fixture's ApiClient for one namespace."""

    def __init__(self, api: client.ApiClient, namespace: str):
        self.api, self.ns = api, namespace
        self.custom = client.CustomObjectsApi(api)
        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)
        self.rbac = client.RbacAuthorizationV1Api(api)
        self.policy = client.PolicyV1Api(api)

    def create_model(self, body: dict[str, Any]) -> dict[str, Any]:
        return cast(dict[str, Any], self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, body))

    def model(self, name: str) -> dict[str, Any]:
        return cast(dict[str, Any], self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name))

    def patch_model(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return cast(dict[str, Any],
                    self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name, patch))

    def patch_model_status(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return cast(dict[str, Any], self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.ns, PLURAL, name, {"status": patch}))

    def delete_model(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def deployment(self, name: str) -> client.V1Deployment | None:
        try:
            return self.apps.read_namespaced_deployment(name, self.ns)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def children(self, model: str) -> dict[str, Any]:
        """Every child kind listed by the model label: {"Deployment/x": obj, ...}."""
        sel = f"serving.disagg.dev/model={model}"
        out: dict[str, Any] = {}
        for kind, items in (
            ("Deployment", self.apps.list_namespaced_deployment(self.ns, label_selector=sel).items),
            ("Service", self.core.list_namespaced_service(self.ns, label_selector=sel).items),
            ("ConfigMap", self.core.list_namespaced_config_map(self.ns, label_selector=sel).items),
            ("ServiceAccount", self.core.list_namespaced_service_account(self.ns, label_selector=sel).items),
            ("Role", self.rbac.list_namespaced_role(self.ns, label_selector=sel).items),
            ("RoleBinding", self.rbac.list_namespaced_role_binding(self.ns, label_selector=sel).items),
            ("PodDisruptionBudget",
             self.policy.list_namespaced_pod_disruption_budget(self.ns, label_selector=sel).items),
        ):
            for obj in items:
                assert obj.metadata is not None
                out[f"{kind}/{obj.metadata.name}"] = obj
        return out

    def events(self, name: str) -> list[client.CoreV1Event]:
        return [e for e in self.core.list_namespaced_event(self.ns).items if e.involved_object.name == name]


@pytest.fixture
def cluster(kube: client.ApiClient, namespace: str) -> Cluster:
    return Cluster(kube, namespace)


def step_result(body: dict[str, Any], decisions: dict[str, tuple[int, str]] | None = None) -> Any:
    """An autoscaler step outcome for ``body``: ``decisions`` maps a pool to (replicas, reason)."""
    from disagg.api.models import ActiveMode, ObservedStatus
    from disagg.autoscaling.loop import StepResult
    from disagg.autoscaling.mode import ModeState
    from disagg.autoscaling.policy import Decision

    pools = (body.get("status") or {}).get("pools") or {}
    out = {}
    for pool, (replicas, reason) in (decisions or {}).items():
        current = int((pools.get(pool) or {}).get("desiredReplicas", body["spec"][pool].get("replicas", 1)))
        out[pool] = Decision(pool, current, replicas, None, reason)  # type: ignore[arg-type]
    mode = ActiveMode((body.get("status") or {}).get("activeMode") or "Disaggregated")
    return StepResult(decisions=out, mode=ModeState(active=mode), mode_changed=False, observed=ObservedStatus(),
                      slo_met=("Unknown", "NoTraffic", "test"))


def scale(scaler: Any, cluster: Cluster, name: str, pool: str, replicas: int, reason: str) -> None:
    """One autoscaler decision, recorded and written exactly as the daemon's tick does it (Autoscaler.apply)."""
    from disagg.api.models import DisaggregatedModel

    body = cluster.model(name)
    dm = DisaggregatedModel.model_validate({k: v for k, v in body.items() if k != "status"})
    scaler.apply(body, dm, step_result(body, {pool: (replicas, reason)}), "2026-01-01T00:00:00Z")
