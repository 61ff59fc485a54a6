"""Multi-node replicas in the twin: a group of ``disagg sim`` processes, one per node, started with the arguments
the operator renders for each rank (builders/multinode.py), as vLLM 0.33.0 reads them (vllm_versions.MULTI_NODE).

- **Data-parallel layout**: ``--data-parallel-size D --data-parallel-size-local L --data-parallel-address A
  --data-parallel-rpc-port P``; node k > 0 adds ``--headless --data-parallel-start-rank k × L``.
- **Tensor/pipeline layout**: ``--nnodes N --node-rank k --master-addr A --master-port P``; node k > 0 ``--headless``.

The leader (node 0) serves HTTP; the workers serve nothing and join the leader over a small handshake on the
rendezvous port (P: the DP RPC port, or the master port): one TCP connection per worker, a JSON line each way, kept
open for the group's life. Like vLLM's head node, whose API server starts only after every engine's handshake, the
leader is unavailable until every node joined: its port answers 503 with the reason (which ranks are missing). A
group that lost a node is gone, as in vLLM (the DP group's collectives and the engines' handshake cannot take a rank
back): the leader exits 1 naming the lost node, and a worker whose leader went away exits 1 too. The orchestrator
(the StatefulSet back end's controller, or LeaderWorkerSet's RecreateGroupOnPodRestart) restarts the whole group.

Performance: the leader runs the replica's engines — every data-parallel rank, local or remote, as its own engine,
each timed by the roofline with tensor × pipeline of its rank — so a group serves what its layout serves. The side
channels of all ranks are the leader's (ports sideChannelPort + rank on the leader's host), a simplification: in
vLLM each node's engines listen on their own pod.

Waiting for the group follows vLLM's engine-ready timeout, VLLM_ENGINE_READY_TIMEOUT_S (default 600 s,
vllm/envs.py line 813, read in vllm/v1/engine/core_client.py line 762).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import logs
from ..poll import WaitTimeoutError, until
from ..vllm_versions import DEFAULT_DATA_PARALLEL_RPC_PORT, DEFAULT_MASTER_PORT
from .args import build_parser, fail, normalize_argv

log = logs.get("disagg.sim.group")

READY_TIMEOUT_ENV = "VLLM_ENGINE_READY_TIMEOUT_S"
DEFAULT_READY_TIMEOUT_S = 600.0
PROTOCOL = 1


@dataclass(frozen=True)
class Layout:
    """What every node of a group must agree on (sent in the handshake; a difference is refused, naming it)."""

    model: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    data_parallel_size_local: int
    nnodes: int
    enable_expert_parallel: bool


@dataclass(frozen=True)
class Group:
    """This process's place in a multi-node replica."""

    layout: Layout
    node_rank: int
    address: str  # the leader's rendezvous host
    port: int  # the leader's rendezvous port
    data_parallel: bool  # True: the nodes run data-parallel ranks; False: one tensor × pipeline engine spans them
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S

    @property
    def leader(self) -> bool:
        return self.node_rank == 0

    @property
    def nodes(self) -> int:
        return self.layout.nnodes

    @property
    def start_rank(self) -> int:
        return self.node_rank * self.layout.data_parallel_size_local if self.data_parallel else 0

    def describe(self, node_rank: int) -> str:
        if self.data_parallel:
            start = node_rank * self.layout.data_parallel_size_local
            return f"node {node_rank} (data-parallel ranks {start}-{start + self.layout.data_parallel_size_local - 1})"
        return f"node {node_rank}"


def _parse(argv: list[str]) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    parser = build_parser()
    norm, _, _ = normalize_argv(argv, parser)
    ns, _ = parser.parse_known_args(norm)
    return ns, parser


def group_of(argv: list[str], env: Mapping[str, str] | None = None) -> Group | None:
    """The group this command line makes the process part of; None for a replica on one node. Exits 2 naming the
    flag when the multi-node flags do not make a group vLLM would run."""
    env = os.environ if env is None else env
    ns, parser = _parse(argv)
    model = ns.model_tag or ns.model or ""
    dp, local, start = ns.data_parallel_size, ns.data_parallel_size_local, ns.data_parallel_start_rank
    try:
        timeout = float(env.get(READY_TIMEOUT_ENV, DEFAULT_READY_TIMEOUT_S))
    except ValueError:
        fail(parser, f"environment {READY_TIMEOUT_ENV}: not a number")
    if ns.nnodes > 1 and dp > 1:
        fail(parser, "argument --nnodes: the simulator runs a data-parallel group with --data-parallel-size-local "
                     "and --data-parallel-start-rank, and a tensor × pipeline group with --nnodes; not both")
    if dp > 1 and local is not None and local < dp:
        if local < 1 or dp % local:
            fail(parser, f"argument --data-parallel-size-local/-dpl: {local} does not divide --data-parallel-size "
                         f"{dp} into nodes of equal size")
        rank = start or 0
        if rank % local or not 0 <= rank < dp:
            fail(parser, f"argument --data-parallel-start-rank/-dpr: {rank} is not the first rank of a node "
                         f"(a multiple of --data-parallel-size-local {local} below {dp})")
        node_rank = rank // local
        layout = Layout(model, ns.tensor_parallel_size, ns.pipeline_parallel_size, dp, local, dp // local,
                        ns.enable_expert_parallel)
        group = Group(layout, node_rank, ns.data_parallel_address or "127.0.0.1",
                      ns.data_parallel_rpc_port or DEFAULT_DATA_PARALLEL_RPC_PORT, True, timeout)
    elif ns.nnodes > 1:
        if not 0 <= ns.node_rank < ns.nnodes:
            fail(parser, f"argument --node-rank/-r: {ns.node_rank} is not between 0 and {ns.nnodes - 1}")
        layout = Layout(model, ns.tensor_parallel_size, ns.pipeline_parallel_size, 1, 1, ns.nnodes,
                        ns.enable_expert_parallel)
        group = Group(layout, ns.node_rank, ns.master_addr or "127.0.0.1", ns.master_port or DEFAULT_MASTER_PORT,
                      False, timeout)
    else:
        if ns.headless:
            fail(parser, "argument --headless: a headless node needs a group to join: --data-parallel-size-local "
                         "below --data-parallel-size with --data-parallel-start-rank, or --nnodes > 1 with "
                         "--node-rank")
        return None
    if group.leader and ns.headless:
        fail(parser, "argument --headless: node 0 is the group's leader, which serves the API; start it without "
                     "--headless")
    if not group.leader and not ns.headless:
        fail(parser, f"argument --headless: {group.describe(group.node_rank)} of the group serves no API "
                     "(the simulator runs no hybrid load balancing); add --headless")
    return group


def layout_difference(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> str | None:
    """The first setting two nodes disagree on, as a flag, or None."""
    for key, value in mine.items():
        if theirs.get(key) != value:
            flag = "--" + ("model" if key == "model" else key.replace("_", "-"))
            return f"{flag} is {theirs.get(key)!r} on the joining node and {value!r} on the leader"
    return None


# ------------------------------------------------------------------------------------------------- leader


@dataclass
class _Members:
    group: Group
    joined: dict[int, asyncio.StreamWriter] = field(default_factory=dict)
    formed: asyncio.Event = field(default_factory=asyncio.Event)
    lost: asyncio.Future[str] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def missing(self) -> list[int]:
        return [k for k in range(1, self.group.nodes) if k not in self.joined]

    def reason(self) -> str:
        missing = self.missing()
        return (f"group forming: {self.group.nodes - len(missing)} of {self.group.nodes} nodes joined; waiting for "
                + ", ".join(self.group.describe(k) for k in missing))


async def _read_line(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    line = await reader.readline()
    if not line:
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


async def _send(writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
    writer.write(json.dumps(obj).encode() + b"\n")
    await writer.drain()


def _handler(members: _Members) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    group = members.group
    mine = asdict(group.layout)

    async def refuse(writer: asyncio.StreamWriter, reason: str, peer: Any) -> None:
        log.warning("group_join_refused", peer=str(peer), reason=reason)
        with contextlib.suppress(ConnectionError):
            await _send(writer, {"protocol": PROTOCOL, "ok": False, "error": reason})
        writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        hello = await _read_line(reader)
        if hello is None or hello.get("protocol") != PROTOCOL:
            await refuse(writer, "not a disagg sim group handshake", peer)
            return
        rank = hello.get("node_rank")
        diff = layout_difference(mine, hello.get("layout") or {})
        if diff:
            await refuse(writer, f"layout differs: {diff}", peer)
            return
        if not isinstance(rank, int) or not 0 < rank < group.nodes:
            await refuse(writer, f"node rank {rank!r} is not a worker rank of a {group.nodes}-node group", peer)
            return
        if members.formed.is_set():
            # vLLM cannot take a rank back into a running group: the group must restart as a whole
            await refuse(writer, f"the group is already formed; {group.describe(rank)} cannot rejoin a running "
                                 "group (restart the whole group)", peer)
            return
        if rank in members.joined:
            await refuse(writer, f"{group.describe(rank)} has already joined", peer)
            return
        members.joined[rank] = writer
        await _send(writer, {"protocol": PROTOCOL, "ok": True, "nodes": group.nodes})
        log.info("group_member_joined", node_rank=rank, member=group.describe(rank), joined=len(members.joined) + 1,
                 nodes=group.nodes)
        if not members.missing():
            members.formed.set()
        await reader.read()  # until the member's connection ends: it is gone
        if members.joined.get(rank) is writer:
            del members.joined[rank]
            why = f"{group.describe(rank)} left the group (connection from {peer} closed)"
            if members.formed.is_set() and not members.lost.done():
                members.lost.set_result(why)
            else:
                log.warning("group_member_left", node_rank=rank, reason=why)
        writer.close()

    return handle


async def _forming_app(members: _Members, host: str | None, port: int) -> Any:
    """What the leader's port answers while the group forms: 503 with the reason, for every path."""
    from aiohttp import web

    async def unavailable(_: web.Request) -> web.Response:
        return web.json_response({"status": "unavailable", "reason": members.reason()}, status=503)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", unavailable)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_address=True).start()
    return runner


async def _stopped() -> None:
    """Until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def run_leader(group: Group, port: int, host: str | None, serve: Callable[[], Awaitable[int]]) -> int:
    """Node 0: accept the workers on the rendezvous port, answer 503 on ``port`` until all joined, then ``serve``
    (the normal API server); exit 1 when a node is lost."""
    members = _Members(group)
    server = await asyncio.start_server(_handler(members), host or None, group.port, reuse_address=True)
    log.info("group_forming", nodes=group.nodes, rendezvous=f"{host or '*'}:{group.port}",
             data_parallel=group.data_parallel, layout=asdict(group.layout))
    forming = await _forming_app(members, host, port)
    stop = asyncio.ensure_future(_stopped())
    try:
        formed = asyncio.ensure_future(members.formed.wait())
        done, _ = await asyncio.wait({formed, stop}, timeout=group.ready_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        formed.cancel()
        if stop in done:
            return 0
        if formed not in done:
            log.error("group_not_formed", reason=members.reason(), timeout_s=group.ready_timeout_s,
                      note=f"{READY_TIMEOUT_ENV} bounds the wait")
            return 1
    finally:
        await forming.cleanup()
    stop.cancel()  # serve() handles the signals from here on
    with contextlib.suppress(asyncio.CancelledError):
        await stop
    log.info("group_formed", nodes=group.nodes)
    serving: asyncio.Future[int] = asyncio.ensure_future(serve())
    watched: set[asyncio.Future[Any]] = {serving, members.lost}
    try:
        finished, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        if members.lost in finished:
            log.error("group_member_lost", reason=members.lost.result(),
                      note="the group's other ranks cannot go on without it; the whole group must restart")
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
            return 1
        return serving.result()
    finally:
        server.close()
        for writer in list(members.joined.values()):
            writer.close()


# ------------------------------------------------------------------------------------------------- worker


# A pod's DNS name under a headless Service: <pod>.<service>.<namespace>.svc[.<cluster domain>] (the leader address
# the operator renders, builders/multinode.py leader_address).
_POD_DNS = re.compile(r"^(?P<pod>[a-z0-9]([-a-z0-9]*[a-z0-9])?)\.[a-z0-9-]+\.(?P<ns>[a-z0-9-]+)\.svc(\..+)?$")


def _pod_ip(namespace: str, pod: str) -> str:
    """The pod's IP from the apiserver of $KUBECONFIG; OSError while it has none (so the join retries)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from ..kube import api_client

    try:
        status = client.CoreV1Api(api_client(os.environ["KUBECONFIG"])).read_namespaced_pod(pod, namespace).status
    except ApiException as e:
        raise OSError(f"pod {namespace}/{pod}: {e.reason}") from None
    if status is None or not status.pod_ip:
        raise OSError(f"pod {namespace}/{pod} has no IP yet")
    return str(status.pod_ip)


async def leader_host(address: str) -> str:
    """Where to reach the leader: its address as given when it resolves (cluster DNS); else, for a pod's DNS name
    where no cluster DNS answers but a KUBECONFIG is set (the local runtime, disagg.local.runtime, which gives pods
    loopback IPs and no DNS), the pod's IP read from the apiserver. Raises OSError (retried) otherwise."""
    try:
        await asyncio.get_running_loop().getaddrinfo(address, None)
        return address
    except socket.gaierror:
        m = _POD_DNS.match(address)
        if m is None or not os.environ.get("KUBECONFIG"):
            raise
        return await asyncio.to_thread(_pod_ip, m["ns"], m["pod"])


async def run_worker(group: Group) -> int:
    """Node k > 0 (``--headless``): join the leader, then stay while it does; exit 1 when it goes away."""
    me = group.describe(group.node_rank)

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(await leader_host(group.address), group.port)

    try:
        reader, writer = await until(connect, group.ready_timeout_s, f"the leader at {group.address}:{group.port}",
                                     interval=0.2, retry_on=(OSError,))
    except WaitTimeoutError as e:
        log.error("group_join_failed", member=me, reason=str(e))
        return 1
    await _send(writer, {"protocol": PROTOCOL, "node_rank": group.node_rank, "layout": asdict(group.layout)})
    reply = await _read_line(reader)
    if not reply or not reply.get("ok"):
        log.error("group_join_refused", member=me, reason=(reply or {}).get("error", "the leader closed"))
        writer.close()
        return 1
    log.info("group_joined", member=me, leader=f"{group.address}:{group.port}", nodes=group.nodes)
    gone = asyncio.ensure_future(reader.read())
    stop = asyncio.ensure_future(_stopped())
    done, _ = await asyncio.wait({gone, stop}, return_when=asyncio.FIRST_COMPLETED)
    for task in (gone, stop):
        task.cancel()
    writer.close()
    if stop in done:
        log.info("group_worker_stopped", member=me)
        return 0
    log.error("group_leader_lost", member=me, leader=f"{group.address}:{group.port}",
              note="a headless node cannot serve without its leader; the whole group must restart")
    return 1


# ------------------------------------------------------------------------------------------------ the hook


async def serve_in_group(argv: list[str], cfg: Any, serve: Callable[[Any], Awaitable[int]]) -> int:
    """``disagg sim``'s entry (sim/main.py): ``serve(cfg)`` for a one-node replica; the leader's or a worker's part
    of a group otherwise."""
    group = group_of(argv)
    if group is None:
        return await serve(cfg)
    if not group.leader:
        return await run_worker(group)
    return await run_leader(group, cfg.port, cfg.host, lambda: serve(cfg))
