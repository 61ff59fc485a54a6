"""Operator convergence for N models: time until every model's status is written and every Deployment settled,
and the writes in a steady-state window (should be zero: a no-op reconcile writes nothing).

Runs the real operator (kopf, in process via KopfRunner) against the real local control plane.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from ..api import GROUP, PLURAL, VERSION
from ..local.controlplane import REPO_ROOT
from ..poll import wait_for

EXAMPLE = REPO_ROOT / "docs" / "examples" / "llama-8b-nvlink.yaml"


@dataclass
class OperatorBench:
    models: int
    created_s: float
    status_written_s: float
    deployments_settled_s: float
    applies: int
    steady_window_s: float
    steady_state_writes: int


def run(models: int, steady_window_s: float = 30.0, timeout: float = 600.0) -> OperatorBench:
    import kopf
    from kopf.testing import KopfRunner
    from kubernetes import client

    from ..api.crd import build_crd
    from ..controller.handlers import ControllerConfig, operator_settings, register
    from ..kube import api_client, install_crd
    from ..local.controlplane import ControlPlane

    with ControlPlane(with_controller_manager=True) as cp:
        api = api_client(cp.kubeconfig)
        install_crd(api, build_crd())
        client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="bench")))
        base = yaml.safe_load(EXAMPLE.read_text())
        registry = kopf.OperatorRegistry()
        rec = register(registry, ControllerConfig(kubeconfig=str(cp.kubeconfig)))
        co, apps = client.CustomObjectsApi(api), client.AppsV1Api(api)
        with KopfRunner(["run", "--standalone", "-n", "bench"], registry=registry, settings=operator_settings(),
                        timeout=60):
            t0 = time.monotonic()
            for i in range(models):
                body = copy.deepcopy(base)
                body["metadata"]["name"] = f"m{i}"
                co.create_namespaced_custom_object(GROUP, VERSION, "bench", PLURAL, body)
            created = time.monotonic() - t0

            def all_status() -> bool:
                got = co.list_namespaced_custom_object(GROUP, VERSION, "bench", PLURAL)
                assert isinstance(got, dict)
                written = sum((m.get("status") or {}).get("observedGeneration") == 1 for m in got["items"])
                return bool(written == models)

            wait_for(all_status, timeout, "every model's status", interval=0.5)
            status_written = time.monotonic() - t0

            def settled() -> bool:
                deps = apps.list_namespaced_deployment("bench").items
                return len(deps) == 3 * models and all(
                    ((d.status.replicas if d.status else None) or 0) == (d.spec.replicas if d.spec else None)
                    for d in deps)

            wait_for(settled, timeout, "every Deployment to report its replicas", interval=0.5)
            deployments = time.monotonic() - t0
            time.sleep(5)  # let the last status events drain before the quiet window starts
            w0 = rec.kube.writes
            time.sleep(steady_window_s)  # the measurement itself: writes during a window with no change
            writes = rec.kube.writes - w0
            applies = int(rec.counters["applies"])
    return OperatorBench(models, round(created, 2), round(status_written, 2), round(deployments, 2), applies,
                         steady_window_s, writes)


def main(models: list[int], out: Path | None, steady_window_s: float) -> int:
    results = []
    window = f"writes/{int(steady_window_s)}s"
    print(f"{'models':>7} {'created':>9} {'status':>9} {'settled':>9} {'applies':>8} {window:>10}")
    for n in models:
        r = run(n, steady_window_s)
        results.append(asdict(r))
        print(f"{r.models:>7} {r.created_s:>8.1f}s {r.status_written_s:>8.1f}s {r.deployments_settled_s:>8.1f}s "
              f"{r.applies:>8} {r.steady_state_writes:>10}")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1))
    return 0
