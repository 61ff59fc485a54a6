"""Opt-in contract tier: the rendered worker args parse with vLLM's own `vllm serve` parser.

Needs ``vllm`` importable (installed ``--no-deps`` over torch, plus the few pure-Python packages its argument
parser imports); skipped otherwise. Run: ``pytest -m vllm tests/builders/test_vllm_contract.py`` in such an
environment.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from disagg.api.contract import Role
from disagg.api.models import DisaggregatedModel
from disagg.builders import parse_model, worker_args

from .conftest import example_body

pytestmark = pytest.mark.vllm

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


@dataclass(frozen=True)
class VllmParser:
    """`vllm serve`'s argument parser, and the vLLM version it comes from."""

    make: Callable[[], Any]  # a fresh parser per parse, as `vllm serve` builds one
    version: str

    def __call__(self, args: list[str]) -> argparse.Namespace:
        ns: argparse.Namespace = self.make().parse_args(args)
        return ns


@pytest.fixture(scope="module")
def vllm_parser() -> VllmParser:
    vllm = pytest.importorskip("vllm")
    _cpu_platform_without_gpu()
    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser

    return VllmParser(lambda: make_arg_parser(FlexibleArgumentParser(prog="vllm serve")), str(vllm.__version__))


def _cpu_platform_without_gpu() -> None:
    """PyPI's vLLM wheel is built for CUDA (VLLM_TARGET_DEVICE is a build-time setting), and building the parser
    needs a platform: without a GPU, select vLLM's CPU platform explicitly."""
    import torch
    import vllm.platforms as platforms

    if not torch.cuda.is_available():
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()


def _model(example: str, version: str) -> DisaggregatedModel:
    body = example_body(example)
    # Render for the vLLM build under test, so version-dependent flags match what it knows.
    body["spec"].setdefault("engine", {})["image"] = f"vllm/vllm-openai:v{version}"
    return parse_model(body)


@pytest.mark.parametrize("example", ["llama-70b-rdma", "llama-8b-nvlink", "aggregated-rollback"])
@pytest.mark.parametrize("role,kv_role", [("prefill", "kv_producer"), ("decode", "kv_consumer")])
def test_rendered_args_parse_with_vllm(vllm_parser: VllmParser, example: str, role: Role, kv_role: str) -> None:
    dm = _model(example, vllm_parser.version)
    args = worker_args(dm, role)
    ns = vllm_parser(args)
    assert ns.model_tag == args[0]
    assert ns.port == 8000
    assert ns.tensor_parallel_size == getattr(dm.spec, role).parallelism.tensor
    kv = ns.kv_transfer_config
    assert kv.kv_connector == "NixlConnector" and kv.kv_role == kv_role
    assert kv.is_kv_producer is (role == "prefill") and kv.is_kv_consumer is (role == "decode")
    if role == "decode" and hasattr(kv, "kv_load_failure_policy"):  # vLLM builds that know the key
        assert kv.kv_load_failure_policy == dm.spec.kv_transfer.load_failure_policy
    if "--shutdown-timeout" in args:  # rendered only for vLLM >= 0.18.0, which must then accept it
        assert ns.shutdown_timeout == dm.spec.engine.shutdown_timeout_seconds


def test_wrong_kv_role_is_rejected_by_vllm(vllm_parser: VllmParser) -> None:
    args = worker_args(_model("llama-8b-nvlink", vllm_parser.version), "prefill")
    i = args.index("--kv-transfer-config") + 1
    args[i] = json.dumps({**json.loads(args[i]), "kv_role": "producer"})
    with pytest.raises(SystemExit):
        vllm_parser(args)
