"""Multi-node replicas in the twin (issue 19): real ``disagg sim`` processes, one per node, started with the arguments
the operator renders for each rank. The leader is unavailable (503, with the reason) until every node joined, then
serves; a group that loses a node fails (the leader or the worker exits 1, naming what was lost)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from kubernetes import client

from disagg.local.procs import HOST, Proc, Processes, disagg_argv, free_port_block, free_ports
from disagg.poll import wait_for

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SIM = ["--time-scale", "0.05", "--gpu", "H100-SXM", "--model-preset", "Llama-3.1-8B"]


@dataclass
class Ports:
    http: int
    rendezvous: int
    side: int


@pytest.fixture
def procs(tmp_path) -> Iterator[Processes]:
    with Processes(tmp_path) as p:
        yield p


def _ports(ranks: int) -> Ports:
    http, rendezvous = free_ports(2)
    side = free_port_block(ranks)
    while side <= http < side + ranks or side <= rendezvous < side + ranks:
        side = free_port_block(ranks)
    return Ports(http, rendezvous, side)


def _get(url: str) -> tuple[int | None, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return None, b""


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, json.loads(r.read())


def _node(procs: Processes, name: str, ports: Ports, layout: list[str], rank_flags: list[str],
          leader: bool) -> Proc:
    argv = [*disagg_argv(), "sim", MODEL, *SIM, *layout, *rank_flags]
    if leader:
        argv += ["--host", HOST, "--port", str(ports.http)]
    env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": HOST, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(ports.side)}
    return procs.spawn(name, argv, f"http://{HOST}:{ports.http}", env)


def _dp_layout(ports: Ports, data: int, local: int, *extra: str) -> list[str]:
    return ["-dp", str(data), "--data-parallel-size-local", str(local), "--data-parallel-address", HOST,
            "--data-parallel-rpc-port", str(ports.rendezvous), *extra]


def _health(leader: Proc) -> tuple[int | None, str]:
    status, body = _get(leader.url + "/health")
    return status, body.decode(errors="replace")


def _health_when(leader: Proc, ok: Callable[[tuple[int | None, str]], bool], what: str) -> tuple[int | None, str]:
    """The leader's /health answer, once ``ok`` holds for it."""
    answers: list[tuple[int | None, str]] = []

    def check() -> bool:
        answers.append(_health(leader))
        return ok(answers[-1])

    wait_for(check, 30, what)
    return answers[-1]


def _exit_code(p: Proc, timeout: float = 30) -> int:
    wait_for(lambda: p.proc.poll() is not None, timeout, f"{p.name} to exit")
    return p.proc.returncode


def _events(p: Proc) -> list[dict]:
    out = []
    for line in p.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def _kill(p: Proc) -> None:
    os.killpg(p.proc.pid, signal.SIGKILL)  # a node lost at once: no goodbye


# ----------------------------------------------------------------------------------------------- forming


def test_the_leader_serves_only_once_every_node_joined(procs: Processes) -> None:
    ports = _ports(6)
    layout = _dp_layout(ports, 6, 2)  # 3 nodes of 2 data-parallel ranks
    leader = _node(procs, "leader", ports, layout, [], leader=True)
    status, body = _health_when(leader, lambda h: h[0] is not None, "the leader's port")
    assert status == 503
    assert "1 of 3 nodes joined" in body and "node 1 (data-parallel ranks 2-3)" in body and "node 2" in body
    _node(procs, "node-1", ports, layout, ["--headless", "--data-parallel-start-rank", "2"], leader=False)
    status, body = _health_when(leader, lambda h: "2 of 3" in h[1], "node 1 to join")
    assert status == 503 and "node 2 (data-parallel ranks 4-5)" in body and "node 1" not in body
    _node(procs, "node-2", ports, layout, ["--headless", "--data-parallel-start-rank", "4"], leader=False)
    wait_for(lambda: _health(leader)[0] == 200, 30, "the group to form")
    # the leader serves for the whole replica: one engine per data-parallel rank of every node
    state = json.loads(_get(leader.url + "/sim/state")[1])
    assert state["data_parallel_size"] == 6
    status, out = _post(leader.url + "/v1/completions", {"model": MODEL, "prompt": "hello there", "max_tokens": 4})
    assert status == 200 and out["usage"]["completion_tokens"] == 4
    assert leader.alive()


def test_the_leader_fails_when_a_node_dies(procs: Processes) -> None:
    ports = _ports(4)
    layout = _dp_layout(ports, 4, 2, "--enable-expert-parallel")
    leader = _node(procs, "leader", ports, layout, [], leader=True)
    worker = _node(procs, "node-1", ports, layout, ["--headless", "--data-parallel-start-rank", "2"], leader=False)
    wait_for(lambda: _health(leader)[0] == 200, 30, "the group to form")
    _kill(worker)
    assert _exit_code(leader) == 1
    lost = [e for e in _events(leader) if e["event"] == "group_member_lost"]
    assert lost and "node 1 (data-parallel ranks 2-3) left the group" in lost[0]["reason"]


def test_a_worker_fails_when_its_leader_dies(procs: Processes) -> None:
    ports = _ports(1)
    layout = ["-tp", "8", "-pp", "2", "--nnodes", "2", "--master-addr", HOST, "--master-port", str(ports.rendezvous)]
    leader = _node(procs, "leader", ports, layout, ["--node-rank", "0"], leader=True)
    worker = _node(procs, "node-1", ports, layout, ["--node-rank", "1", "--headless"], leader=False)
    wait_for(lambda: _health(leader)[0] == 200, 30, "the group to form")
    # one tensor × pipeline engine spans the nodes: the leader times its steps for tp 8, pp 2
    ready = next(e for e in _events(leader) if e["event"] == "engine_ready")
    assert (ready["tp"], ready["pp"], ready["data_parallel_size"]) == (8, 2, 1)
    _kill(leader)
    assert _exit_code(worker) == 1
    assert any(e["event"] == "group_leader_lost" for e in _events(worker))


def test_a_node_of_another_layout_is_refused_naming_the_flag(procs: Processes) -> None:
    ports = _ports(4)
    leader = _node(procs, "leader", ports, _dp_layout(ports, 4, 2), [], leader=True)
    wait_for(lambda: _health(leader)[0] == 503, 30, "the leader's port")
    odd = _node(procs, "odd", ports, _dp_layout(ports, 4, 2, "-tp", "2"),
                ["--headless", "--data-parallel-start-rank", "2"], leader=False)
    assert _exit_code(odd) == 1
    refused = next(e for e in _events(odd) if e["event"] == "group_join_refused")
    assert "--tensor-parallel-size is 2 on the joining node and 1 on the leader" in refused["reason"]
    assert _health(leader)[0] == 503 and leader.alive()  # still forming, waiting for a node that fits


def test_a_running_group_takes_no_node_back(procs: Processes) -> None:
    ports = _ports(4)
    layout = _dp_layout(ports, 4, 2)
    leader = _node(procs, "leader", ports, layout, [], leader=True)
    _node(procs, "node-1", ports, layout, ["--headless", "--data-parallel-start-rank", "2"], leader=False)
    wait_for(lambda: _health(leader)[0] == 200, 30, "the group to form")
    again = _node(procs, "again", ports, layout, ["--headless", "--data-parallel-start-rank", "2"], leader=False)
    assert _exit_code(again) == 1
    refused = next(e for e in _events(again) if e["event"] == "group_join_refused")
    assert "already formed" in refused["reason"] and "restart the whole group" in refused["reason"]
    assert _health(leader)[0] == 200


def test_a_worker_finds_its_leader_by_pod_name_where_no_cluster_dns_answers(procs: Processes, control_plane,
                                                                            kube, namespace: str) -> None:
    # the local runtime (disagg.local.runtime): pods get loopback IPs and a KUBECONFIG, and no DNS answers for the
    # leader's name <pod>.<group Service>.<namespace>.svc; the pod's IP is in its status
    core = client.CoreV1Api(kube)
    pod = "m-decode-abcde-g0-n0-0"
    core.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name=pod),
        spec=client.V1PodSpec(containers=[client.V1Container(name="vllm", image="vllm")])))
    ports = _ports(4)
    address = f"{pod}.m-decode-abcde-g0.{namespace}.svc"
    layout = ["-dp", "4", "--data-parallel-size-local", "2", "--data-parallel-address", address,
              "--data-parallel-rpc-port", str(ports.rendezvous)]
    leader = _node(procs, "leader", ports, layout, [], leader=True)
    argv = [*disagg_argv(), "sim", MODEL, *SIM, *layout, "--headless", "--data-parallel-start-rank", "2"]
    worker = procs.spawn("node-1", argv, leader.url, {"KUBECONFIG": str(control_plane.kubeconfig)})
    assert _health_when(leader, lambda h: h[0] is not None, "the leader's port")[0] == 503
    assert worker.alive()  # the pod has no IP yet: the worker keeps trying
    core.patch_namespaced_pod_status(pod, namespace, {"status": {"podIP": HOST, "podIPs": [{"ip": HOST}]}})
    wait_for(lambda: _health(leader)[0] == 200, 30, "the worker to find the leader and the group to form")
    joined = next(e for e in _events(worker) if e["event"] == "group_joined")
    assert joined["leader"] == f"{address}:{ports.rendezvous}"


# ------------------------------------------------------------------------------------------- bad flags


@pytest.mark.parametrize("flags,named", [
    (["--headless"], "argument --headless"),
    (["-dp", "4", "--data-parallel-size-local", "3"], "argument --data-parallel-size-local/-dpl"),
    (["-dp", "4", "-dpl", "2", "--data-parallel-start-rank", "1", "--headless"],
     "argument --data-parallel-start-rank/-dpr"),
    (["-dp", "4", "-dpl", "2", "--data-parallel-start-rank", "2"], "argument --headless"),
    (["--nnodes", "2", "--headless"], "argument --headless: node 0 is the group's leader"),
    (["--nnodes", "2", "--node-rank", "2", "--headless"], "argument --node-rank/-r"),
    (["--nnodes", "2", "-dp", "2", "-dpl", "1"], "argument --nnodes"),
])
def test_group_flags_that_make_no_group_exit_2_naming_the_flag(flags: list[str], named: str) -> None:
    r = subprocess.run([*disagg_argv(), "sim", MODEL, *SIM, "--port", "0", *flags], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stderr
    assert named in r.stderr, r.stderr
