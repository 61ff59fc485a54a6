"""Shared fixtures.

``control_plane`` (session): a real etcd + kube-apiserver + kube-controller-manager on loopback, with the
DisaggregatedModel CRD installed; stopped at the end of the session, also on failure.
``namespace``: a fresh namespace per test, deleted afterwards.
``kube``: an ApiClient bound to the fixture's kubeconfig.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from disagg.api.crd import build_crd
from disagg.kube import api_client, install_crd
from disagg.local.controlplane import ControlPlane


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    cp = ControlPlane(with_controller_manager=True, log_to=tmp_path_factory.mktemp("control-plane-logs"))
    try:
        cp.start()
        install_crd(api_client(cp.kubeconfig), build_crd())
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane) -> client.ApiClient:
    return api_client(control_plane.kubeconfig)


@pytest.fixture
def namespace(kube: client.ApiClient) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(kube)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core.delete_namespace(name)


@pytest.fixture
def kubectl(control_plane: ControlPlane) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run kubectl against the fixture's apiserver; returns CompletedProcess (text)."""

    def run(*args: str, input: str | None = None, check: bool = False) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(control_plane.kubeconfig)}
        return subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True, env=env, check=check,
                              timeout=60)

    return run


def pytest_configure(config: pytest.Config) -> None:
    # A SIGTERM (a CI timeout, a kill) ends the session like Ctrl-C does: fixtures tear down, so no control plane,
    # simulator or Prometheus is left running (they run in their own sessions and would outlive pytest).
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "control_plane" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.apiserver)
