"""Drain on scale-down (issue 14): under streaming load of long outputs, the decode pool of a model with autoscaling
off is scaled from 2 to 1 (``spec.decode.replicas``: the operator owns replicas then, docs/operator.md "Replicas").
The ReplicaSet deletes a pod; the local runtime SIGTERMs it and waits its terminationGracePeriodSeconds as a kubelet
does; the router drops it (it has a deletionTimestamp).

- With the default image the operator renders ``--shutdown-timeout`` (``spec.engine.shutdownTimeoutSeconds``) and a
  grace period longer than it: every stream in flight on the removed pod ends with ``[DONE]`` and all the tokens it
  asked for (every request sets ``ignore_eos``), the process exits cleanly within the grace period and only after
  those streams ended, and the requests sent after the router dropped the pod go to the remaining one.
- The contrast: an image of vLLM 0.17.1, which has no ``--shutdown-timeout`` (vLLM then aborts in-flight requests
  on SIGTERM): the same scale-down cuts the streams on the removed pod short — so the first case's assertions
  are what the drain buys.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from disagg.load import loadgen
from disagg.load.workload import Mix, RequestClass, generate
from disagg.local.harness import REAL_TIME, ModelHarness, requests_running_at, router_workers_at, started_stack
from disagg.local.stack import pod_ip, pod_ready
from disagg.poll import wait_for

pytestmark = pytest.mark.e2e

NS = "drain"
DRAIN_S = 20  # spec.engine.shutdownTimeoutSeconds of the draining model; grace = DRAIN_S + 30
OLD_IMAGE = "vllm/vllm-openai:v0.17.1"  # the last release without --shutdown-timeout
# long streams, short prompts: decoded (and prefilled locally) on the decode pool
STREAMS = Mix("drain", "long streamed answers", (RequestClass("stream", 1.0, (64, 256), (300, 450), tenant="stream"),))
RATE, LOAD_S = 3.0, 12.0
IN_FLIGHT = 4  # streams running on each decode worker when the pool is scaled down

COMMON: dict[str, Any] = {
    "autoscaling": {"enabled": False},
    # every stream on the decode pool (the one scaled down): no whole requests on the prefill worker
    "routing": {"elasticFleet": False},
    "decode": {"replicas": 2, "minReplicas": 1, "maxReplicas": 3},
}
MODELS: dict[str, dict[str, Any]] = {
    "drain": {**COMMON, "engine": {"shutdownTimeoutSeconds": DRAIN_S}},
    "nodrain": {**COMMON, "engine": {"image": OLD_IMAGE}},
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ModelHarness]]:
    logs = tmp_path_factory.mktemp("drain-logs")
    with started_stack(NS, logs, sim_env=REAL_TIME) as stack:
        harnesses = {name: ModelHarness(stack, name=name) for name in MODELS}
        with ThreadPoolExecutor(len(MODELS)) as ex:  # both models start at once
            for f in [ex.submit(h.deploy, MODELS[name]) for name, h in harnesses.items()]:
                f.result()
        try:
            yield harnesses
        finally:
            for h in harnesses.values():
                h.stop()


@dataclass
class ScaleDown:
    results: list[loadgen.Result]
    router_log: dict[str, dict[str, Any]]  # request id → the router's request log line
    removed: str  # the deleted pod's name
    removed_url: str  # its worker URL, as the router's log names it
    remaining_url: str
    grace_s: float  # the pod's terminationGracePeriodSeconds
    deleted_at: float  # wall time the deletion was first seen
    dropped_at: float  # wall time the router was first seen with one decode worker
    exited_at: float  # wall time the removed pod's process was first seen exited
    exit_code: int | None

    def in_flight_on_removed(self) -> list[loadgen.Result]:
        """Streams whose decode leg was on the removed pod and that were still running when it was deleted."""
        return [r for r in self.results if r.sent_at < self.deleted_at < r.done_at
                and self.router_log.get(r.id, {}).get("decode_worker") == self.removed_url]

    def sent_after_drop(self) -> list[loadgen.Result]:
        return [r for r in self.results if r.sent_at > self.dropped_at]


def _name(pod: client.V1Pod) -> str:
    assert pod.metadata is not None
    return str(pod.metadata.name)


def _deleting(pod: client.V1Pod) -> bool:
    return pod.metadata is not None and pod.metadata.deletion_timestamp is not None


def _grace(pod: client.V1Pod) -> float:
    assert pod.spec is not None and pod.spec.termination_grace_period_seconds is not None
    return float(pod.spec.termination_grace_period_seconds)


def decode_args(h: ModelHarness) -> list[str]:
    """The decode container's arguments, as the operator rendered them."""
    spec = h.stack.pods(h.name, "decode")[0].spec
    assert spec is not None
    return list(spec.containers[0].args or [])


def scale_down_under_load(h: ModelHarness, seed: int) -> ScaleDown:
    stack = h.stack
    assert stack.runtime is not None
    pods = [p for p in stack.pods(h.name, "decode") if pod_ready(p) and not _deleting(p)]
    assert len(pods) == 2, [_name(p) for p in pods]
    ips = {_name(p): str(pod_ip(p)) for p in pods}
    procs = {name: stack.runtime.process(NS, name) for name in ips}
    grace = {_name(p): _grace(p) for p in pods}

    requests = generate(STREAMS, RATE, LOAD_S, h.served_name, seed=seed)
    results: list[loadgen.Result] = []
    load = threading.Thread(target=lambda: results.extend(h.send(requests, timeout_s=90)), name=f"load-{h.name}")
    load.start()
    try:
        # both decode workers stream answers; then the pool is scaled down, as a user edits the model
        wait_for(lambda: all(requests_running_at(ip) >= IN_FLIGHT for ip in ips.values()), 20,
                 f"{IN_FLIGHT} streams running on each decode worker", interval=0.1)
        stack.patch_spec(h.name, {"decode": {"replicas": 1}})

        def deleted() -> str | None:
            return next((_name(p) for p in stack.pods(h.name, "decode") if _name(p) in ips and _deleting(p)), None)

        removed = wait_for(deleted, 20, "the ReplicaSet to delete a decode pod", interval=0.1)
        deleted_at = time.time()
        wait_for(lambda: router_workers_at(stack.router_url(h.name) or "").get("decode") == 1, 10,
                 "the router to drop the terminating pod", interval=0.1)
        dropped_at = time.time()
        proc = procs[removed]
        assert proc is not None
        wait_for(lambda: proc.poll() is not None, grace[removed] + 10, "the removed pod's process to exit",
                 interval=0.1)
        exited_at = time.time()
    finally:
        load.join()
    remaining = next(n for n in ips if n != removed)
    return ScaleDown(results=results, router_log=h.request_log(), removed=removed,
                     removed_url=f"http://{ips[removed]}:8000", remaining_url=f"http://{ips[remaining]}:8000",
                     grace_s=grace[removed], deleted_at=deleted_at, dropped_at=dropped_at, exited_at=exited_at,
                     exit_code=proc.returncode)


def _report(name: str, s: ScaleDown, want: dict[str, int]) -> None:
    on = s.in_flight_on_removed()
    print(f"{name}: {len(s.results)} requests, {len(on)} in flight on {s.removed} when deleted "
          f"({sum(r.ok and r.output_tokens == want[r.id] for r in on)} complete), router dropped it after "
          f"{s.dropped_at - s.deleted_at:.1f}s, process exited (code {s.exit_code}) after "
          f"{s.exited_at - s.deleted_at:.1f}s (grace {s.grace_s:g}s), {len(s.sent_after_drop())} sent after the drop",
          file=sys.stderr)


def _brief(rs: list[loadgen.Result], want: dict[str, int]) -> list[tuple[str, bool, int, int, str]]:
    return [(r.id, r.ok, r.output_tokens, want[r.id], r.error) for r in rs]


def test_scale_down_drains_in_flight_streams(models: dict[str, ModelHarness]) -> None:
    h = models["drain"]
    args = decode_args(h)
    assert args[args.index("--shutdown-timeout") + 1] == str(DRAIN_S)

    s = scale_down_under_load(h, seed=1)
    want = {r.id: r.max_tokens for r in generate(STREAMS, RATE, LOAD_S, h.served_name, seed=1)}
    _report("drain", s, want)
    assert s.grace_s == DRAIN_S + 30
    on_removed = s.in_flight_on_removed()
    assert len(on_removed) >= IN_FLIGHT, (s.removed_url, len(s.results))  # streams were in flight there when it went
    # each finished with [DONE] and every token it asked for: no mid-stream loss
    assert [r for r in on_removed if not r.ok or r.output_tokens != want[r.id]] == [], _brief(on_removed, want)
    assert [r for r in s.results if not r.ok] == [], _brief([r for r in s.results if not r.ok], want)
    # the process drained (it exited after its last stream ended), cleanly, within the grace period
    assert s.exit_code == 0
    assert s.exited_at - s.deleted_at < s.grace_s
    assert s.exited_at >= max(r.done_at for r in on_removed)
    # requests sent once the router dropped the pod went to the remaining one
    after = s.sent_after_drop()
    assert len(after) >= 3, len(after)
    assert {s.router_log[r.id]["decode_worker"] for r in after} == {s.remaining_url}


def test_without_shutdown_timeout_streams_are_lost(models: dict[str, ModelHarness]) -> None:
    h = models["nodrain"]
    args = decode_args(h)
    assert "--shutdown-timeout" not in args  # vLLM 0.17.1 has no such flag

    s = scale_down_under_load(h, seed=2)
    want = {r.id: r.max_tokens for r in generate(STREAMS, RATE, LOAD_S, h.served_name, seed=2)}
    _report("no drain", s, want)
    on_removed = s.in_flight_on_removed()
    assert len(on_removed) >= IN_FLIGHT, (s.removed_url, len(s.results))
    # SIGTERM aborted them mid-stream: the client got tokens, then no [DONE]
    lost = [r for r in on_removed if r.streamed and (not r.ok or r.output_tokens < want[r.id])]
    assert lost, _brief(on_removed, want)
    # nothing else failed: the losses are the streams on the removed pod
    others = [r for r in s.results if not r.ok and r not in on_removed]
    assert others == [], _brief(others, want)
