"""Cluster discovery against the real kube-apiserver: ready pods by contract labels, paired by compat hash."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from disagg.api.contract import LABEL_COMPAT, LABEL_MODEL, LABEL_ROLE, RouterConfig
from disagg.local.procs import Processes
from disagg.poll import WaitTimeoutError, until, wait_for
from disagg.router.discovery import PodDiscovery, model_name_from_config

LONG = "The quick brown fox jumps over the lazy dog. " * 400


def make_pod(core: client.CoreV1Api, ns: str, name: str, role: str, compat: str, deadline: float) -> None:
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={LABEL_MODEL: "llama", LABEL_ROLE: role, LABEL_COMPAT: compat}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="w", image="vllm")],
                              automount_service_account_token=False),
    )

    def created() -> bool:
        try:
            core.create_namespaced_pod(ns, body)
        except ApiException as e:
            if e.status != 403:  # 403: the namespace's default ServiceAccount is not there yet (it comes shortly)
                raise
            return False
        return True

    wait_for(created, max(0.0, deadline - time.monotonic()), f"pod {name} created")


def set_ready(core: client.CoreV1Api, ns: str, name: str, ready: bool) -> None:
    core.patch_namespaced_pod_status(name, ns, {"status": {
        "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}})


@pytest.mark.apiserver
async def test_discovery_pairs_by_compat_hash(kube, namespace, fake_workers, router_factory, metric):
    p, d = await fake_workers("prefill"), await fake_workers("decode")
    pport, dport = int(p.url.rsplit(":", 1)[1]), int(d.url.rsplit(":", 1)[1])
    cfg = RouterConfig.model_validate({"pools": {"prefill": {"service": "llama-prefill", "port": pport},
                                                 "decode": {"service": "llama-decode", "port": dport}}})
    assert model_name_from_config(cfg) == "llama"
    r = await router_factory([], [], config=cfg)
    disc = PodDiscovery(r.router.workers, namespace, "llama", {"prefill": pport, "decode": dport},
                        asyncio.get_running_loop(), kube)
    disc.start()
    core = client.CoreV1Api(kube)
    try:
        deadline = time.monotonic() + 30
        await asyncio.to_thread(make_pod, core, namespace, "llama-prefill-a", "prefill", "old", deadline)
        await asyncio.to_thread(make_pod, core, namespace, "llama-decode-a", "decode", "new", deadline)
        await asyncio.to_thread(make_pod, core, namespace, "other-decode", "decode", "new", deadline)
        ws = r.router.workers
        # not Ready yet: nothing to wait for in the router, so a barrier shows that discovery has seen those pods.
        # A Ready pod created after them (its own compat hash) appears only once the watch has delivered their
        # events (one watch per role, in resourceVersion order); the pods above must still be absent then.
        for role in ("prefill", "decode"):
            await asyncio.to_thread(make_pod, core, namespace, f"llama-{role}-barrier", role, "barrier", deadline)
            await asyncio.to_thread(set_ready, core, namespace, f"llama-{role}-barrier", True)
        await until(lambda: [w.compat for w in ws.ready("prefill")] == ["barrier"]
                    and [w.compat for w in ws.ready("decode")] == ["barrier"], what="the barrier pods discovered")
        for role in ("prefill", "decode"):
            await asyncio.to_thread(core.delete_namespaced_pod, f"llama-{role}-barrier", namespace,
                                    grace_period_seconds=0)
        await until(lambda: not ws.ready("prefill") and not ws.ready("decode"), what="the barrier pods gone")
        await asyncio.to_thread(set_ready, core, namespace, "llama-prefill-a", True)
        await asyncio.to_thread(set_ready, core, namespace, "llama-decode-a", True)
        await until(lambda: len(ws.ready("prefill")) == 1 and len(ws.ready("decode")) == 1, what="both pods ready")
        assert ws.ready("decode")[0].url == d.url and ws.ready("decode")[0].compat == "new"

        body = {"prompt": LONG, "max_tokens": 200}
        assert (await r.post("/v1/completions", body))[0] == 200
        m = await r.metrics()
        assert metric(m, "disagg_routing_decisions_total", decision="local", reason="no_compatible_pair") == 1

        # the prefill pod moves to the decode pool's build: now they pair
        await asyncio.to_thread(core.patch_namespaced_pod, "llama-prefill-a", namespace,
                                {"metadata": {"labels": {LABEL_COMPAT: "new"}}})
        await until(lambda: ws.ready("prefill") and ws.ready("prefill")[0].compat == "new", what="the new compat hash")
        other = {"prompt": "A different long prompt about caches. " * 500, "max_tokens": 200}
        assert (await r.post("/v1/completions", other))[0] == 200
        assert len(p.requests) == 1 and "kv_transfer_params" in d.requests[-1]["body"]

        # not ready → gone from the pool
        await asyncio.to_thread(set_ready, core, namespace, "llama-prefill-a", False)
        await until(lambda: not ws.ready("prefill"), what="the prefill pod gone")
    finally:
        disc.stop()


@pytest.mark.apiserver
async def test_router_process_cluster_mode(kube, namespace, control_plane, fake_workers, tmp_path):
    """`disagg router` without worker flags discovers pods in $POD_NAMESPACE through the kubeconfig."""
    p, d = await fake_workers("prefill"), await fake_workers("decode")
    pport, dport = int(p.url.rsplit(":", 1)[1]), int(d.url.rsplit(":", 1)[1])
    conf = tmp_path / "router.yaml"
    conf.write_text(yaml.safe_dump({"pools": {"prefill": {"service": "llama-prefill", "port": pport},
                                              "decode": {"service": "llama-decode", "port": dport}}}))
    core = client.CoreV1Api(kube)
    deadline = time.monotonic() + 30
    for name, role in (("llama-prefill-0", "prefill"), ("llama-decode-0", "decode")):
        await asyncio.to_thread(make_pod, core, namespace, name, role, "h", deadline)
        await asyncio.to_thread(set_ready, core, namespace, name, True)
    with Processes(tmp_path / "procs") as procs:
        router = procs.router(conf, extra=["--kubeconfig", str(control_plane.kubeconfig), "--log-level", "INFO"],
                              env={"POD_NAMESPACE": namespace})
        url = router.url
        async with aiohttp.ClientSession() as s:
            async def both_pods_discovered() -> bool:
                assert router.alive(), router.log_tail()  # exited: fail at once
                async with s.get(url + "/health") as r:
                    return r.status == 200 and (await r.json())["workers"] == {"prefill": 1, "decode": 1,
                                                                                "aggregated": 0}

            try:
                # a new process imports the kubernetes client, loads the kubeconfig, lists and watches: on a loaded
                # 2-core machine that took over 20 s once (no discovery_listed line yet, no error)
                await until(both_pods_discovered, 60, "the router discovering both pods",
                            retry_on=(aiohttp.ClientError,))
            except WaitTimeoutError as e:
                raise AssertionError(f"{e}\n{router.log_tail()}") from e
            async with s.post(url + "/v1/completions", json={"prompt": LONG, "max_tokens": 200}) as r:
                assert r.status == 200
            assert len(p.requests) == 1 and len(d.requests) == 1
