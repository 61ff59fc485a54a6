"""Workers publish their KV cache events (issue 30): every pool of every example renders ``--kv-events-config`` for
the releases that have it, and no data-parallel rank's event ports meet another port of the pod."""

from __future__ import annotations

import json

import pytest

from disagg.builders import parse_model, worker_args
from disagg.builders.vllm import KV_EVENTS_PORT, KV_EVENTS_REPLAY_PORT, KV_EVENTS_SINCE
from disagg.builders.workers import worker_roles
from disagg.vllm_versions import fmt

from .conftest import EXAMPLES, example_body


def _config(args: list[str]) -> dict[str, object] | None:
    if "--kv-events-config" not in args:
        return None
    cfg: dict[str, object] = json.loads(args[args.index("--kv-events-config") + 1])
    return cfg


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_every_pool_publishes_on_ports_no_rank_shares(example: str) -> None:
    dm = parse_model(example_body(example))
    for role in worker_roles(dm):
        args = worker_args(dm, role)
        cfg = _config(args)
        assert cfg == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{KV_EVENTS_PORT}",
                       "replay_endpoint": f"tcp://*:{KV_EVENTS_REPLAY_PORT}", "topic": "kv-events"}, role
        assert "--enable-prompt-tokens-details" in args
        par = getattr(dm.spec, role).parallelism
        ranks = range(max(1, par.data))  # vLLM: rank r publishes on each port + r
        side = dm.spec.kv_transfer.side_channel_port
        groups = [{KV_EVENTS_PORT + r for r in ranks}, {KV_EVENTS_REPLAY_PORT + r for r in ranks},
                  {side + r for r in ranks}, {dm.spec.engine.port}]
        assert sum(len(g) for g in groups) == len(set().union(*groups)), (role, par.data)


@pytest.mark.parametrize("version", ["0.31.0", fmt(KV_EVENTS_SINCE)])
def test_releases_before_the_checked_ones_get_no_events_flag(version: str) -> None:
    body = example_body("llama-8b-nvlink")
    body["spec"].setdefault("engine", {})["image"] = f"vllm/vllm-openai:v{version}"
    args = worker_args(parse_model(body), "decode")
    has = version == fmt(KV_EVENTS_SINCE)
    assert (_config(args) is not None) is has
    assert ("--enable-prompt-tokens-details" in args) is has
