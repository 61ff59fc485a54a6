"""`disagg render` and `disagg operator` through the real command line."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

import pytest
import yaml

from disagg.cli import main
from disagg.local.procs import free_ports, stop_group

from .conftest import EXAMPLES, load_example, wait_for


def test_render_prints_every_child(capsys):
    assert main(["render", str(EXAMPLES["llama-70b-rdma"]), "--router-image", "r:2"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service", "Service", "Service",
                            "PodDisruptionBudget", "PodDisruptionBudget", "PodDisruptionBudget",  # P, D, router
                            "Deployment", "Deployment", "Deployment"])
    assert all(d["metadata"]["namespace"] == "default" and "ownerReferences" not in d["metadata"] for d in docs)
    router = next(d for d in docs if d["metadata"]["name"] == "llama-70b-router" and d["kind"] == "Deployment")
    assert router["spec"]["template"]["spec"]["containers"][0]["image"] == "r:2"
    assert main(["render", "-f", str(EXAMPLES["llama-8b-nvlink"]), "-n", "prod"]) == 0
    assert {d["metadata"]["namespace"] for d in yaml.safe_load_all(capsys.readouterr().out)} == {"prod"}


def test_render_refuses_invalid_specs_naming_the_field(tmp_path, capsys):
    bad = load_example("llama-8b-nvlink")
    bad["spec"]["prefill"]["replicas"] = 20
    unsatisfiable = load_example("llama-8b-nvlink")
    unsatisfiable["metadata"]["name"] = "other"
    unsatisfiable["spec"]["engine"] = {"extraArgs": ["--kv-transfer-config", "{}"]}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump_all([bad, unsatisfiable]))
    assert main(["render", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "llama-8b: spec.prefill.replicas: replicas must be between minReplicas and maxReplicas" in captured.err
    # the CRD's own rule (the one flag table): the field and the spec field to use instead
    assert "other: spec.engine.extraArgs: extraArgs must not set a flag the operator owns" in captured.err
    assert "--kv-transfer-config: spec.kvTransfer" in captured.err


@pytest.mark.apiserver
def test_operator_command_runs_and_serves_liveness(control_plane, namespace, cluster, tmp_path):
    port, metrics_port = free_ports(2)
    log = (tmp_path / "operator.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "disagg.cli", "operator", "--kubeconfig", str(control_plane.kubeconfig),
         "-n", namespace, "--liveness", f"http://127.0.0.1:{port}/healthz", "--router-image", "r:cli",
         "--metrics-port", str(metrics_port)],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        cluster.create_model(load_example("llama-8b-nvlink"))
        router = wait_for(lambda: cluster.deployment("llama-8b-router"), 40, "router Deployment")
        assert router.spec.template.spec.containers[0].image == "r:cli"
        body = wait_for(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).read(), 20,
                        "liveness endpoint")
        assert b"models" in body
        wait_for(lambda: "disagg_operator_applies_total 13.0" in urllib.request.urlopen(
            f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode(), 10, "operator metrics")
    finally:
        stop_group(proc, grace=20, group=False)  # SIGTERM, SIGKILL after the grace period
        log.close()
    text = (tmp_path / "operator.log").read_text()
    assert '"event": "reconciled"' in text or '"event":"reconciled"' in text, text[-2000:]
