"""Opt-in contract tier: what the operator renders is what vLLM's own `vllm serve` parser and EngineArgs read.

Needs ``vllm`` importable (installed ``--no-deps`` over torch, plus the pure-Python packages its argument parser
imports; see docs/development.md); every test here fails without it (marker ``vllm``, deselected by default).
Run: ``pytest -m vllm tests/builders/test_vllm_contract.py`` in such an environment. It targets the default
release (disagg.vllm_versions.DEFAULT_VERSION); to run it against another installed release (e.g. 0.11.2, the
oldest in the version table) set ``DISAGG_VLLM_TIER_ANY_VERSION=1``: the examples are then rendered for that
release, and the table's facts are checked against it.

A venv for it (what `make test-vllm` should create as .venv-vllm; done by hand on 2026-11-30, ~7 GB, Python 3.11;
the CUDA torch wheel from PyPI imports on a machine without a GPU)::

    python3.11 -m venv .venv-vllm
    .venv-vllm/bin/pip install torch==2.14.0                      # vLLM 0.33.0's pin (0.11.2: torch==2.9.0)
    .venv-vllm/bin/pip install --no-deps vllm==0.33.0
    .venv-vllm/bin/pip install "transformers>=5.16.1,<5.21" "huggingface_hub>=1.31" "tokenizers>=0.23.2" \
        "fastapi>=0.133,<0.137" "starlette>=1.0.1" "openai>=2.25" "oss-harmony>=0.0.11" xgrammar==0.2.8 \
        "llguidance>=1.7,<1.8" regex cachetools psutil sentencepiece numpy requests tqdm blake3 py-cpuinfo \
        prometheus_client prometheus-fastapi-instrumentator msgspec pyzmq cloudpickle partial-json-parser \
        pybase64 cbor2 ijson setproctitle einops aiohttp orjson pillow tiktoken jsonschema python-json-logger \
        watchfiles uvloop
    .venv-vllm/bin/pip install -e '.[test]'    # or PYTHONPATH=operator with the project's runtime pins
    VLLM_TARGET_DEVICE=cpu .venv-vllm/bin/pytest -p no:cacheprovider -m vllm tests/builders/test_vllm_contract.py

(0.11.2 additionally imports diskcache, lm-format-enforcer==0.11.3, outlines_core==0.2.11, lark==1.2.2 and
"transformers<5", "huggingface_hub<1.0".)

For every example and every transport, each pool's rendered arguments are parsed by `vllm serve`'s parser and
turned into EngineArgs; TP/PP/DP sizes, kv_role, connector, kv_load_failure_policy and the drain timeout must be
the operator's. The version table's flag and key facts are checked against the installed release's parser. Every rank
of a multi-node replica (docs/multinode.md: leader and headless workers, data-parallel and tensor/pipeline layouts)
is parsed too, and `vllm serve`'s own check of the parsed line (validate_parsed_serve_args) runs on it.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from disagg.api.models import DisaggregatedModel
from disagg.builders import parse_model, worker_args
from disagg.builders.transport import KV_ROLES
from disagg.builders.vllm import KV_EVENTS_PORT, KV_EVENTS_REPLAY_PORT, KV_EVENTS_SINCE
from disagg.builders.workers import worker_deployment, worker_roles
from disagg.vllm_versions import DEFAULT_VERSION, fmt, parse_version, profile

from .conftest import EXAMPLES, example_body

pytestmark = pytest.mark.vllm

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

TRANSPORTS = ("rdma", "nvlink", "tcp", "auto")


@dataclass(frozen=True)
class Vllm:
    """`vllm serve`'s argument parser and EngineArgs of the installed vLLM, and its version."""

    make: Callable[[], Any]  # a fresh parser per parse, as `vllm serve` builds one
    engine_args: Any  # vllm.engine.arg_utils.EngineArgs
    version: str

    def parse(self, args: list[str]) -> argparse.Namespace:
        ns: argparse.Namespace = self.make().parse_args(args)
        return ns

    def engine(self, args: list[str]) -> Any:
        return self.engine_args.from_cli_args(self.parse(args))

    def option_strings(self) -> set[str]:
        return {o for a in self.make()._actions for o in a.option_strings}


@pytest.fixture(scope="module")
def vllm() -> Vllm:
    try:
        import vllm as vllm_pkg
    except ImportError as e:  # a failure, not a skip: this tier was asked for
        pytest.fail(f"the vLLM tier needs vllm importable ({e}); see docs/development.md")
    _cpu_platform_without_gpu()
    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    from vllm.engine.arg_utils import EngineArgs

    return Vllm(lambda: make_arg_parser(FlexibleArgumentParser(prog="vllm serve")), EngineArgs,
                str(vllm_pkg.__version__))


def _cpu_platform_without_gpu() -> None:
    """PyPI's vLLM wheel is built for CUDA (VLLM_TARGET_DEVICE is a build-time setting), and building the parser
    needs a platform: without a GPU, select vLLM's CPU platform explicitly."""
    import torch
    import vllm.platforms as platforms

    if not torch.cuda.is_available():
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()


def _version(v: Vllm) -> tuple[int, int, int]:
    parsed = parse_version(v.version.split("+")[0])
    assert parsed is not None, v.version
    return parsed


def test_the_installed_vllm_is_the_default_release(vllm: Vllm) -> None:
    if os.environ.get("DISAGG_VLLM_TIER_ANY_VERSION") == "1":
        assert parse_version(vllm.version.split("+")[0]) is not None
        return
    assert _version(vllm) == DEFAULT_VERSION, (
        f"installed vLLM {vllm.version}, the operator's default is {fmt(DEFAULT_VERSION)}")


def _model(example: str, transport: str, version: str) -> DisaggregatedModel:
    body = example_body(example)
    body["spec"].setdefault("engine", {})["image"] = f"vllm/vllm-openai:v{version}"
    body["spec"].setdefault("kvTransfer", {})["transport"] = transport
    if transport == "rdma":
        body["spec"]["kvTransfer"].setdefault("rdma", {"resourceName": "rdma/ib", "count": 1})
    else:
        body["spec"]["kvTransfer"].pop("rdma", None)
    return parse_model(body)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_every_rendered_pool_means_the_same_to_vllm(vllm: Vllm, example: str, transport: str) -> None:
    dm = _model(example, transport, vllm.version.split("+")[0])
    p = profile(_version(vllm))
    for role in worker_roles(dm):
        args = worker_args(dm, role)
        ns = vllm.parse(args)
        assert ns.model_tag == args[0]
        assert ns.port == dm.spec.engine.port
        ea = vllm.engine(args)
        par = getattr(dm.spec, role).parallelism
        assert (ea.tensor_parallel_size, ea.pipeline_parallel_size, ea.data_parallel_size) == (
            par.tensor, par.pipeline, par.data), role
        kv = ea.kv_transfer_config
        if role in KV_ROLES:
            assert kv.kv_connector == dm.spec.kv_transfer.connector
            assert kv.kv_role == KV_ROLES[role]
            assert kv.is_kv_producer is (role == "prefill") and kv.is_kv_consumer is (role == "decode")
            if role == "decode" and p.kv_load_failure_policy:
                assert kv.kv_load_failure_policy == dm.spec.kv_transfer.load_failure_policy
        else:
            assert kv is None or kv.kv_connector is None, role
        # Drain: the release that has --shutdown-timeout gets the spec's value, and the pod outlives it.
        # Exact prefill phases: prefill workers return per-request metrics where the release has the flag.
        assert getattr(ns, "enable_per_request_metrics", False) is (role == "prefill" and p.per_request_metrics)
        drain = getattr(ea, "shutdown_timeout", getattr(ns, "shutdown_timeout", 0))
        assert drain == (dm.spec.engine.shutdown_timeout_seconds if p.shutdown_timeout else 0), role
        grace = worker_deployment(dm, role)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > dm.spec.engine.shutdown_timeout_seconds
        # KV cache events (issue 30): every pool publishes where the router subscribes (router/kvsub.py)
        ev = getattr(ea, "kv_events_config", None)
        if _version(vllm) >= KV_EVENTS_SINCE:
            assert ev is not None and ev.enable_kv_cache_events and ev.publisher == "zmq", role
            assert ev.endpoint == f"tcp://*:{KV_EVENTS_PORT}" and ev.replay_endpoint == f"tcp://*:{KV_EVENTS_REPLAY_PORT}"
            assert ns.enable_prompt_tokens_details, role  # the engine's reuse in usage, for the router's log line
        else:
            assert ev is None or not ev.enable_kv_cache_events, role


def test_a_misspelt_kv_events_key_is_refused_by_vllm(vllm: Vllm) -> None:
    """The check above could not pass on a config vLLM ignores: its parser refuses unknown keys (0.32.0's says
    ``1 validation error for KVEventsConfig ... Unexpected keyword argument``)."""
    with pytest.raises(SystemExit):
        vllm.parse(["m", "--kv-events-config", '{"enable_kv_cache_events":true,"topik":"x"}'])


def test_the_sims_kv_events_decode_with_vllms_own_classes() -> None:
    """The simulator's event stream (sim/kvevents.py, from its real block pool) decoded by vLLM's msgspec classes
    (vllm/distributed/kv_events.py KVEventBatch), as a vLLM consumer would."""
    import msgspec
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

    from disagg.sim import kvevents as sim_events
    from disagg.sim.kv import BlockPool, block_hashes

    pool = BlockPool(4, 4)
    pool.kv_events = []
    ids = list(range(100, 112))
    hashes = block_hashes(ids, 4)
    blocks = pool.allocate(3)
    assert blocks is not None
    pool.commit(blocks, hashes, 3)
    pool.release(blocks)
    assert pool.allocate(4) is not None  # evicts all three
    payload = sim_events.pack(sim_events.encode_batch(12.5, [*pool.take_events(), sim_events.all_blocks_cleared()]))
    batch = msgspec.msgpack.Decoder(type=KVEventBatch).decode(payload)
    assert batch.ts == 12.5 and batch.data_parallel_rank == 0
    stored, *removed, cleared = batch.events
    assert isinstance(stored, BlockStored) and stored.block_hashes == list(hashes)
    assert stored.token_ids == ids and stored.block_size == 4 and stored.parent_block_hash is None
    assert all(isinstance(r, BlockRemoved) for r in removed)
    assert [h for r in removed for h in r.block_hashes] == list(reversed(hashes))
    assert isinstance(cleared, AllBlocksCleared)


# ------------------------------------------------------------------------- the table, against the parser

def test_table_shutdown_timeout_matches_the_parser(vllm: Vllm) -> None:
    assert profile(_version(vllm)).shutdown_timeout is ("--shutdown-timeout" in vllm.option_strings())


def test_table_per_request_metrics_matches_the_parser(vllm: Vllm) -> None:
    """The table renders --enable-per-request-metrics (exact prefill phases) only where the parser knows it."""
    assert profile(_version(vllm)).per_request_metrics is ("--enable-per-request-metrics" in vllm.option_strings())


def test_table_kv_load_failure_policy_matches_the_parser(vllm: Vllm) -> None:
    kv = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_consumer", "kv_load_failure_policy": "fail"})
    p = profile(_version(vllm))
    if not p.kv_config_forbids_unknown_keys:
        cfg = vllm.parse(["m", "--kv-transfer-config", kv]).kv_transfer_config
        assert hasattr(cfg, "kv_load_failure_policy") is p.kv_load_failure_policy
    else:
        assert p.kv_load_failure_policy
        assert vllm.parse(["m", "--kv-transfer-config", kv]).kv_transfer_config.kv_load_failure_policy == "fail"
    bare = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_consumer"})
    cfg = vllm.parse(["m", "--kv-transfer-config", bare]).kv_transfer_config
    if p.kv_load_failure_policy:
        assert cfg.kv_load_failure_policy == p.default_kv_load_failure_policy


def test_table_unknown_kv_transfer_keys_match_the_parser(vllm: Vllm) -> None:
    kv = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_producer", "no_such_key": 1})
    if profile(_version(vllm)).kv_config_forbids_unknown_keys:
        with pytest.raises(SystemExit):
            vllm.parse(["m", "--kv-transfer-config", kv])
    else:
        assert vllm.parse(["m", "--kv-transfer-config", kv]).kv_transfer_config.kv_role == "kv_producer"


def test_table_connectors_match_vllm(vllm: Vllm) -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    registered = set(KVConnectorFactory._registry)
    for name in ("NixlConnector", "NixlPushConnector"):
        assert (name in profile(_version(vllm)).connectors) is (name in registered), name


def test_wrong_kv_role_is_rejected_by_vllm(vllm: Vllm) -> None:
    args = worker_args(_model("llama-8b-nvlink", "nvlink", vllm.version.split("+")[0]), "prefill")
    i = args.index("--kv-transfer-config") + 1
    args[i] = json.dumps({**json.loads(args[i]), "kv_role": "producer"})
    with pytest.raises(SystemExit):
        vllm.parse(args)



def test_table_kv_transfer_fields_match_vllm(vllm: Vllm) -> None:
    import dataclasses

    from vllm.config.kv_transfer import KVTransferConfig

    fields = {f.name for f in dataclasses.fields(KVTransferConfig)}
    assert profile(_version(vllm)).kv_transfer_fields == fields


# ------------------------------------------------------------------------- multi-node replicas (issue 19)

MULTINODE_FLAGS = ("--data-parallel-size-local", "--data-parallel-start-rank", "--data-parallel-address",
                   "--data-parallel-rpc-port", "--headless", "--nnodes", "--node-rank", "--master-addr",
                   "--master-port", "--enable-expert-parallel")


def test_table_multi_node_flags_match_the_parser(vllm: Vllm) -> None:
    options = vllm.option_strings()
    assert profile(_version(vllm)).multi_node is all(f in options for f in MULTINODE_FLAGS), (
        [f for f in MULTINODE_FLAGS if f not in options])


def _validate_serve_args(ns: argparse.Namespace) -> None:
    """`vllm serve`'s own check of a parsed command line (ServeSubcommand.validate)."""
    try:
        from vllm.entrypoints.common.cli_args import validate_parsed_serve_args
    except ImportError:
        from vllm.entrypoints.openai.cli_args import validate_parsed_serve_args
    validate_parsed_serve_args(ns)


@pytest.mark.parametrize("example", ["deepseek-wide-ep", "llama-405b-multinode"])
def test_every_rank_of_a_multi_node_replica_means_the_same_to_vllm(vllm: Vllm, example: str) -> None:
    from disagg.builders.multinode import group_name, layout, leader_address, multinode_roles, rank_args

    dm = _model(example, "rdma", vllm.version.split("+")[0])
    roles = multinode_roles(dm)
    assert roles == ["prefill", "decode"]
    for role in roles:
        pool = getattr(dm.spec, role)
        lay = layout(pool)
        address = leader_address(dm, group_name(dm, role, 0))
        for rank in range(lay.nodes):
            args = rank_args(dm, role, rank, address)
            ns = vllm.parse(args)
            _validate_serve_args(ns)
            ea = vllm.engine(args)
            where = f"{example} {role} rank {rank}"
            assert ns.headless is (rank > 0), where
            assert (ea.tensor_parallel_size, ea.pipeline_parallel_size, ea.data_parallel_size) == (
                lay.tensor, lay.pipeline, lay.data), where
            assert ea.enable_expert_parallel is lay.expert, where
            # never an external or hybrid load-balancing mode: the leader's API server balances over every rank
            assert ns.data_parallel_rank is None and not ns.data_parallel_external_lb, where
            assert not ns.data_parallel_hybrid_lb, where
            if lay.data_parallel:
                assert ea.data_parallel_size_local == lay.data_local, where
                assert ea.data_parallel_address == address and ea.data_parallel_rpc_port == 29550, where
                # the leader has no start rank (vLLM would infer hybrid LB from one, serve.py); node k starts at k × L
                assert ea.data_parallel_start_rank == (lay.start_rank(rank) if rank else None), where
                assert ea.nnodes == 1, where
            else:
                assert (ea.nnodes, ea.node_rank, ea.master_addr, ea.master_port) == (
                    lay.nodes, rank, address, 29501), where
                assert ea.data_parallel_size_local is None and ea.data_parallel_address is None, where
            kv = ea.kv_transfer_config
            assert kv.kv_role == KV_ROLES[role], where  # every rank's engines move KV, not only the leader's
