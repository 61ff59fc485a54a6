"""`disagg router --workers N` in the rendered router Deployment: spec.router.workers, else the CPU request."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from disagg.api.crd import build_crd
from disagg.builders import BuildSettings
from disagg.builders.router import router_deployment, router_workers
from disagg.builders.settings import ENV_ROUTER_CPU_REQUEST, cpu_cores

from .conftest import model


def _container(dep: dict[str, Any]) -> dict[str, Any]:
    cont: dict[str, Any] = dep["spec"]["template"]["spec"]["containers"][0]
    return cont


def _workers_flag(command: list[str]) -> int:
    assert command.count("--workers") == 1
    return int(command[command.index("--workers") + 1])


@pytest.mark.parametrize(("quantity", "cores"), [
    ("250m", 0.25), ("1000m", 1.0), ("1", 1.0), ("2", 2.0), ("1.5", 1.5), ("3.999", 3.999), ("0", 0.0),
    ("2k", 2000.0), (" 4 ", 4.0),
])
def test_cpu_cores(quantity: str, cores: float) -> None:
    assert cpu_cores(quantity) == pytest.approx(cores)


@pytest.mark.parametrize("bad", ["", "m", "two", "-1", "1Gi", "nan", "inf"])
def test_cpu_cores_refuses_garbage(bad: str) -> None:
    with pytest.raises(ValueError, match="CPU quantity"):
        cpu_cores(bad)
    with pytest.raises(ValueError, match="CPU quantity"):  # at the operator's start, not at every reconcile
        BuildSettings.from_env({ENV_ROUTER_CPU_REQUEST: bad} if bad else {ENV_ROUTER_CPU_REQUEST: "x"})


@pytest.mark.parametrize(("request_cpu", "workers"), [
    ("250m", 1), ("999m", 1), ("1", 1), ("1500m", 1), ("2", 2), ("2000m", 2), ("3.9", 3), ("8", 8),
    ("0", 1), ("100m", 1), ("1000", 64),
])
def test_workers_from_cpu_request(request_cpu: str, workers: int) -> None:
    dep = router_deployment(model(), BuildSettings(router_cpu_request=request_cpu))
    cont = _container(dep)
    assert _workers_flag(cont["command"]) == workers
    assert cont["resources"]["requests"]["cpu"] == request_cpu
    assert cont["command"][:2] == ["disagg", "router"]


def test_default_is_one_worker_for_the_default_request() -> None:
    cont = _container(router_deployment(model(), BuildSettings()))
    assert cont["resources"]["requests"]["cpu"] == "250m"
    assert _workers_flag(cont["command"]) == 1


@pytest.mark.parametrize("request_cpu", ["250m", "4", "16"])
@pytest.mark.parametrize("n", [1, 2, 7, 64])
def test_spec_router_workers_overrides(request_cpu: str, n: int) -> None:
    dm = model(router={"workers": n})
    assert dm.spec.router.workers == n
    assert router_workers(dm.spec.router, request_cpu) == n
    cont = _container(router_deployment(dm, BuildSettings(router_cpu_request=request_cpu)))
    assert _workers_flag(cont["command"]) == n


@pytest.mark.parametrize("bad", [0, -1, 65, "two"])
def test_spec_router_workers_bounds(bad: Any) -> None:
    with pytest.raises(ValidationError):
        model(router={"workers": bad})


def test_spec_router_is_optional() -> None:
    assert model().spec.router.workers is None
    assert model(router={}).spec.router.workers is None


def test_cpu_request_from_env() -> None:
    assert BuildSettings.from_env({}).router_cpu_request == "250m"
    assert BuildSettings.from_env({ENV_ROUTER_CPU_REQUEST: "2"}).router_cpu_request == "2"
    cont = _container(router_deployment(model(), BuildSettings.from_env({ENV_ROUTER_CPU_REQUEST: "2"})))
    assert _workers_flag(cont["command"]) == 2


def test_crd_schema_has_router_workers() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    workers = schema["router"]["properties"]["workers"]
    assert workers["type"] == "integer" and workers["minimum"] == 1 and workers["maximum"] == 64
    assert "SO_REUSEPORT" in workers["description"] and "CPU request" in workers["description"]
