"""Multi-node pools on the local stack (issue 19, docs/multinode.md): a model whose decode pool is 2 groups × 2 nodes
and whose prefill pool is 1 group × 2 nodes, on the StatefulSet back end (the real kube-controller-manager runs the
StatefulSets; the local runtime runs their pods as ``disagg sim`` processes, the workers finding their leader
through the apiserver).

- requests route through it: prefill leader → decode leader, KV over TCP (the remote path);
- one worker pod of a decode group is deleted: its leader loses a member and exits, the operator restarts the whole
  group (both pods recreated), the router drops the group's leader meanwhile and requests fall back to the other
  group: no client error; the measured restart time (deletion → group serving again) is printed;
- ``spec.decode.replicas`` 2 → 3 (autoscaling off): a third group forms and serves.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from disagg.builders import multinode as mn
from disagg.load import loadgen
from disagg.load.workload import Mix, RequestClass, generate
from disagg.local.harness import ModelHarness, requests_running_at, router_workers_at, serving, started_stack
from disagg.local.stack import pod_ip, pod_ready

pytestmark = pytest.mark.e2e

NS = "multinode"
NAME = "mn"
POOL: dict[str, Any] = {"minReplicas": 1, "maxReplicas": 3, "nodesPerReplica": 2,
                        "gpu": {"count": 1, "product": "NVIDIA-L40S"}, "parallelism": {"data": 2}}
OVERRIDES: dict[str, Any] = {
    "autoscaling": {"enabled": False},
    "prefill": {**POOL, "replicas": 1},
    "decode": {**POOL, "replicas": 2},
}
# prompts above routing.remotePrefill.minInputTokens (2048), answers of at least minExpectedOutputTokens (64) (in
# docs/examples/local-demo.yaml): the remote path;
# whole answers (not streamed), so that a decode leg lost with its group is retried before a byte reaches the client
LONG = Mix("mn", "long prompts, short whole answers",
           (RequestClass("rag", 1.0, (2200, 2600), (64, 80), tenant="rag", stream=False),))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelHarness]:
    with (started_stack(NS, tmp_path_factory.mktemp("multinode-logs")) as stack,
          serving(stack, OVERRIDES, timeout=90, name=NAME) as h):
        yield h


def pool_pods(h: ModelHarness, role: str) -> list[client.V1Pod]:
    return client.CoreV1Api(h.stack.api).list_namespaced_pod(
        NS, label_selector=f"serving.disagg.dev/model={NAME},{mn.LABEL_POOL}={role}").items


def _labels(p: client.V1Pod) -> dict[str, str]:
    assert p.metadata is not None
    return dict(p.metadata.labels or {})


def _name(p: client.V1Pod) -> str:
    assert p.metadata is not None
    return str(p.metadata.name)


def _uid(p: client.V1Pod) -> str:
    assert p.metadata is not None
    return str(p.metadata.uid)


def groups_of(h: ModelHarness, role: str) -> dict[str, dict[str, client.V1Pod]]:
    """group → {pod name: pod}, pods being deleted left out."""
    out: dict[str, dict[str, client.V1Pod]] = {}
    for p in pool_pods(h, role):
        if p.metadata is not None and not p.metadata.deletion_timestamp:
            out.setdefault(_labels(p)[mn.LABEL_GROUP], {})[_name(p)] = p
    return out


def ready_groups(h: ModelHarness, role: str) -> set[str]:
    return {g for g, ps in groups_of(h, role).items() if len(ps) == 2 and all(pod_ready(p) for p in ps.values())}


def pool_status(h: ModelHarness, role: str) -> dict[str, Any]:
    return dict(((h.stack.model(NAME).get("status") or {}).get("pools") or {}).get(role) or {})


def send(h: ModelHarness, n: int, rate: float, seed: int, stop: threading.Event | None = None,
         ) -> list[loadgen.Result]:
    requests = generate(LONG, rate, n / rate, h.served_name, seed=seed)
    return h.send(requests, timeout_s=60, stop=(stop.is_set if stop else None))


def _errors(results: list[loadgen.Result]) -> list[tuple[str, int, str]]:
    return [(r.id, r.status, r.error) for r in results if not r.ok]


def test_groups_are_rendered_and_route(model: ModelHarness) -> None:
    h = model
    assert set(ready_groups(h, "decode")) == set(groups_of(h, "decode")) and len(groups_of(h, "decode")) == 2
    assert len(groups_of(h, "prefill")) == 1 and ready_groups(h, "prefill")
    # only leaders are routable: the router knows one worker per group
    workers = router_workers_at(h.stack.router_url(NAME) or "")
    assert (workers.get("prefill"), workers.get("decode")) == (1, 2), workers
    children = h.stack.children(NAME)
    assert not [k for k in children if k.startswith("Deployment/") and not k.endswith("/router")], children
    assert pool_status(h, "decode")["readyReplicas"] == 2
    results = send(h, 8, 4.0, seed=1)
    assert _errors(results) == []
    assert {r.path for r in results} == {"remote"}, [(r.id, r.path, r.reason) for r in results]


def test_a_lost_worker_restarts_its_group_without_client_errors(model: ModelHarness) -> None:
    h = model
    before = groups_of(h, "decode")
    group = sorted(before)[0]
    worker = next(p for p in before[group].values() if _labels(p)[mn.LABEL_NODE_RANK] == "1")
    uids = {_name(p): _uid(p) for p in before[group].values()}
    other = next(g for g in before if g != group)

    stop = threading.Event()
    results: list[loadgen.Result] = []
    load = threading.Thread(target=lambda: results.extend(send(h, 800, 8.0, seed=2, stop=stop)), name="load")
    load.start()
    try:
        # the group's leader has requests in flight when its worker goes: they must fall back, not fail
        leader = next(p for p in before[group].values() if _labels(p)[mn.LABEL_NODE_RANK] == "0")
        h.stack.wait_for(lambda: requests_running_at(str(pod_ip(leader))) >= 1, 20,
                         f"requests running on {group}'s leader")
        killed_at = time.monotonic()
        client.CoreV1Api(h.stack.api).delete_namespaced_pod(_name(worker), NS)

        def restarted() -> bool:
            now = groups_of(h, "decode").get(group, {})
            # every pod of the group is new (the leader too: the group started over), and the group is ready
            return (set(now) == set(uids) and all(_uid(p) != uids[n] for n, p in now.items())
                    and group in ready_groups(h, "decode"))

        h.stack.wait_for(restarted, 60, f"group {group} to restart as a whole")
        h.stack.wait_for(lambda: router_workers_at(h.stack.router_url(NAME) or "").get("decode") == 2, 30,
                         "the router to route to the restarted group again")
        restart_s = time.monotonic() - killed_at
        assert other in ready_groups(h, "decode")  # the other group was never touched
    finally:
        stop.set()
        load.join()
    events = [e for e in h.stack.events(NAME) if e.reason == "GroupRestarted"]
    print(f"group {group}: worker {_name(worker)} deleted → group serving again after {restart_s:.1f}s; "
          f"{len(results)} requests during it, {sum(r.path == 'fallback' for r in results)} fell back, "
          f"{len(_errors(results))} errors; events: {[e.message for e in events]}", file=sys.stderr)
    assert results and _errors(results) == [], _errors(results)
    assert sum(r.path == "fallback" for r in results) >= 1  # the ones in flight on the lost group
    assert len(events) == 1 and group in (events[0].message or ""), [e.message for e in events]  # one restart, whole
    assert pool_status(h, "decode")["readyReplicas"] == 2


def test_scaling_adds_a_whole_group(model: ModelHarness) -> None:
    h = model
    before = set(groups_of(h, "decode"))
    h.stack.patch_spec(NAME, {"decode": {"replicas": 3}})
    h.stack.wait_for(lambda: len(ready_groups(h, "decode")) == 3, 60, "a third decode group to be ready")
    h.stack.wait_for(lambda: router_workers_at(h.stack.router_url(NAME) or "").get("decode") == 3, 30,
                     "the router to know three decode leaders")
    (new,) = set(groups_of(h, "decode")) - before
    assert len(groups_of(h, "decode")[new]) == 2  # a whole group: its leader and its worker
    h.stack.wait_for(lambda: pool_status(h, "decode").get("readyReplicas") == 3, 30, "status: 3/3 decode ready")
    # the new group serves: its leader answers a completion (its engines include the worker's)
    leader = next(p for p in groups_of(h, "decode")[new].values() if _labels(p)[mn.LABEL_NODE_RANK] == "0")
    body = json.dumps({"model": h.served_name, "prompt": "hello", "max_tokens": 4}).encode()
    req = urllib.request.Request(f"http://{pod_ip(leader)}:8000/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200 and json.loads(r.read())["choices"]
    assert _errors(send(h, 6, 4.0, seed=3)) == []
