"""The version-dependent parts of ``vllm serve``'s command line, rendered from the version table.

Which vLLM release a model runs comes from :func:`disagg.vllm_versions.resolve_vllm_version`: the image tag, else
``spec.engine.vllmVersion`` (for ``latest``, a digest or a custom tag), else the default release. What that
release accepts (``--shutdown-timeout``, the ``--kv-transfer-config`` keys, the connectors) comes from the table in
:mod:`disagg.vllm_versions`, where each fact cites the vLLM source.
"""

from __future__ import annotations

import json
from typing import Any

from ..api.contract import Role
from ..api.models import DisaggregatedModelSpec, EngineSpec
from ..vllm_versions import (
    KV_CACHE_EVENTS,
    Version,
    VersionError,
    VersionResolution,
    resolve_vllm_version,
    tag_version,
)
from .transport import kv_transfer_config

# Status condition the controller can set from :func:`vllm_version_condition`.
VERSION_CONDITION = "VLLMVersionKnown"

# KV cache events (issue 30): every worker publishes its engine's block pool changes on these ports (PUB and the
# replay ROUTER), and the router subscribes (router/kvsub.py). vLLM's default endpoint is ``tcp://*:5557``
# (KVEventsConfig.endpoint, vllm/config/kv_events.py, 0.33.0); the replay endpoint has no default there.
# vLLM offsets both by the data-parallel rank (ZmqEventPublisher.offset_endpoint_port: port + rank), so the replay
# base sits 300 above the PUB base: ranks 0…299 of one pod never share a port (tests/builders/test_kv_events.py
# checks them against the side-channel ports too).
KV_EVENTS_PORT = 5557
KV_EVENTS_REPLAY_PORT = 5857
KV_EVENTS_TOPIC = "kv-events"
# ``--kv-events-config``: the version table's fact (vllm_versions.KV_CACHE_EVENTS, its sources there); parsed by
# vLLM's own parser in tests/builders/test_vllm_contract.py. ``vllm serve`` refuses what it does not know, so it is
# rendered only for releases that have it.
KV_EVENTS_SINCE: Version = KV_CACHE_EVENTS.since


def engine_version(engine: EngineSpec) -> VersionResolution:
    """The vLLM release the pools are rendered for. (A spec.engine.vllmVersion that is no release, or disagrees
    with the image tag, is refused before: api/semantics.py ``version_errors``.)"""
    return resolve_vllm_version(engine.image, engine.vllm_version)


def vllm_version_condition(engine: EngineSpec) -> dict[str, str]:
    """A status condition (type, status, reason, message) saying which vLLM release the operator renders for.

    Pure. ``status`` is "False" with reason ``DefaultVersionAssumed`` when neither the image tag nor
    spec.engine.vllmVersion tells (the operator renders for the default release), ``InvalidVersion`` when
    spec.engine.vllmVersion is not usable; "True" with ``FromImageTag`` or ``FromSpec`` otherwise.
    """
    try:
        r = resolve_vllm_version(engine.image, engine.vllm_version)
    except VersionError as e:
        return {"type": VERSION_CONDITION, "status": "False", "reason": "InvalidVersion", "message": str(e)}
    if r.assumed:
        return {"type": VERSION_CONDITION, "status": "False", "reason": "DefaultVersionAssumed",
                "message": r.message}
    reason = "FromImageTag" if r.source == "image" else "FromSpec"
    return {"type": VERSION_CONDITION, "status": "True", "reason": reason, "message": r.message}


def shutdown_timeout_args(spec: DisaggregatedModelSpec) -> list[str]:
    """``--shutdown-timeout N`` (drain on SIGTERM) for releases that have the flag; nothing for older ones,
    which refuse it (they abort in-flight requests on SIGTERM)."""
    if not engine_version(spec.engine).profile.shutdown_timeout:
        return []
    return ["--shutdown-timeout", str(spec.engine.shutdown_timeout_seconds)]


def per_request_metrics_args(spec: DisaggregatedModelSpec, role: Role) -> list[str]:
    """``--enable-per-request-metrics`` on prefill workers whose release has it: the prefill leg's response then
    carries the request's own queue and prefill times, so the router's prefill phases are exact, not averages."""
    if role != "prefill" or not engine_version(spec.engine).profile.per_request_metrics:
        return []
    return ["--enable-per-request-metrics"]


def kv_events_config(spec: DisaggregatedModelSpec) -> dict[str, Any] | None:
    """The ``--kv-events-config`` object of every pool (None for releases it is not rendered for): the zmq
    publisher on :data:`KV_EVENTS_PORT` with a replay socket on :data:`KV_EVENTS_REPLAY_PORT` (vLLM 0.33.0's
    KVEventsConfig defaults ``publisher`` to zmq once enabled, 0.32.0's too; it is written out all the same)."""
    if engine_version(spec.engine).version < KV_EVENTS_SINCE:
        return None
    return {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{KV_EVENTS_PORT}",
            "replay_endpoint": f"tcp://*:{KV_EVENTS_REPLAY_PORT}", "topic": KV_EVENTS_TOPIC}


def kv_events_args(spec: DisaggregatedModelSpec) -> list[str]:
    """``--kv-events-config`` and ``--enable-prompt-tokens-details`` (usage.prompt_tokens_details.cached_tokens:
    what the engine reused, for the router's log line beside what it expected; FrontendArgs in
    vllm/entrypoints/common/cli_args.py, 0.33.0, and vllm/entrypoints/launchers/cli_args.py, 0.32.0)."""
    cfg = kv_events_config(spec)
    if cfg is None:
        return []
    return ["--kv-events-config", json.dumps(cfg, separators=(",", ":")), "--enable-prompt-tokens-details"]


def kv_transfer_config_for(spec: DisaggregatedModelSpec, role: Role) -> dict[str, Any]:
    """The ``--kv-transfer-config`` object of a pool, with only the keys its vLLM release reads.

    ``kv_load_failure_policy`` is left out for releases without it: from 0.16.0 vLLM refuses unknown keys, and
    before that it silently ignored them (the request is then recomputed on a failed load, as the spec's
    ``recompute`` asks; a ``fail`` policy cannot be honoured there and is refused by api/semantics.py
    ``version_errors``, as is a connector the release lacks).
    """
    p = engine_version(spec.engine).profile
    kv = spec.kv_transfer
    assert kv.connector in p.connectors, f"{kv.connector} is not in this vLLM release (api/semantics.py refuses it)"
    full = kv_transfer_config(kv, role)
    return {k: full[k] for k in p.kv_transfer_keys(list(full))}


def kv_transfer_config_arg(spec: DisaggregatedModelSpec, role: Role) -> str:
    return json.dumps(kv_transfer_config_for(spec, role), separators=(",", ":"), sort_keys=False)


# Kept for callers of the first version of this module.
def image_version(image: str) -> Version | None:
    """``vllm/vllm-openai:v0.11.2`` → (0, 11, 2); None when the tag is not a version."""
    return tag_version(image)


def supports_shutdown_timeout(image: str, vllm_version: str | None = None) -> bool:
    """Whether the release an image runs (resolved as the builders do) has ``--shutdown-timeout``."""
    return resolve_vllm_version(image, vllm_version).profile.shutdown_timeout
