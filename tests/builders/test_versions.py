"""The version table (disagg.vllm_versions): where the vLLM release comes from, and what the builders render for it."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pydantic import ValidationError

from disagg.api.models import DEFAULT_VLLM_IMAGE, EngineSpec
from disagg.builders import parse_model, worker_args
from disagg.builders.vllm import vllm_version_condition
from disagg.builders.workers import worker_deployment
from disagg.vllm_versions import (
    CONNECTORS,
    DEFAULT_VERSION,
    KV_CONFIG_FORBIDS_UNKNOWN_KEYS,
    KV_LEASE_DURATION,
    KV_LOAD_FAILURE_POLICY,
    METRICS,
    NIXL_ABORT_REQUEST_TIMEOUT_ENV,
    NIXL_AT_LEAST_1_5,
    OLDEST_CHECKED,
    SHUTDOWN_TIMEOUT,
    Fact,
    VersionError,
    fmt,
    parse_version,
    profile,
    resolve_vllm_version,
    tag_version,
)

from .conftest import example_body, refused


def _dm(**engine: Any) -> Any:
    body = example_body("llama-8b-nvlink")
    body["spec"]["engine"] = {**body["spec"].get("engine", {}), **engine}
    return parse_model(body)


def _kv(args: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(args[args.index("--kv-transfer-config") + 1])
    return out


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


# ------------------------------------------------------------------------------------------- parsing

@pytest.mark.parametrize("text,version", [
    ("0.33.0", (0, 33, 0)), ("v0.11.2", (0, 11, 2)), ("0.18", (0, 18, 0)),
    ("latest", None), ("0.33.0rc1", None), ("0.33.0.1", None), ("", None), ("33", None),
])
def test_parse_version(text: str, version: tuple[int, int, int] | None) -> None:
    assert parse_version(text) == version


@pytest.mark.parametrize("image,version", [
    ("vllm/vllm-openai:v0.11.2", (0, 11, 2)),
    ("registry:5000/vllm/vllm-openai:0.33.1-cu129", (0, 33, 1)),
    ("vllm/vllm-openai:v0.18", (0, 18, 0)),
    ("vllm/vllm-openai:latest", None),
    ("vllm/vllm-openai", None),  # no tag: latest
    ("registry:5000/vllm", None),  # the port is not a tag
    ("vllm/vllm-openai@sha256:abcd", None),
    ("vllm/vllm-openai:v0.33.0@sha256:abcd", None),  # the digest decides what runs
    ("ghcr.io/me/vllm:nightly-0.34.0", None),
    ("ghcr.io/me/vllm:0.33.0nightly", None),
])
def test_tag_version(image: str, version: tuple[int, int, int] | None) -> None:
    assert tag_version(image) == version


# -------------------------------------------------------------------------------------- resolution

def test_the_image_tag_decides_when_it_names_a_release() -> None:
    r = resolve_vllm_version("vllm/vllm-openai:v0.18.1", None)
    assert (r.version, r.source, r.assumed) == ((0, 18, 1), "image", False)
    assert resolve_vllm_version("vllm/vllm-openai:v0.18.1", "0.18.1").source == "image"  # agreeing is fine


@pytest.mark.parametrize("image", ["vllm/vllm-openai:latest", "vllm/vllm-openai@sha256:abcd", "me/vllm:custom"])
def test_vllm_version_decides_when_the_tag_does_not(image: str) -> None:
    r = resolve_vllm_version(image, "v0.12.0")
    assert (r.version, r.source) == ((0, 12, 0), "spec")
    assert "spec.engine.vllmVersion" in r.message


def test_neither_tells_renders_for_the_default_and_says_so() -> None:
    r = resolve_vllm_version("vllm/vllm-openai:latest", None)
    assert (r.version, r.source, r.assumed) == (DEFAULT_VERSION, "default", True)
    cond = vllm_version_condition(EngineSpec(image="vllm/vllm-openai:latest"))
    assert cond["type"] == "VLLMVersionKnown" and cond["status"] == "False"
    assert cond["reason"] == "DefaultVersionAssumed"
    assert fmt(DEFAULT_VERSION) in cond["message"] and "spec.engine.vllmVersion" in cond["message"]


@pytest.mark.parametrize("engine,status,reason", [
    ({}, "True", "FromImageTag"),  # the default image names its release
    ({"image": "me/vllm@sha256:ab", "vllmVersion": "0.20.0"}, "True", "FromSpec"),
    ({"image": "vllm/vllm-openai:v0.20.0", "vllmVersion": "0.21.0"}, "False", "InvalidVersion"),
])
def test_version_condition(engine: dict[str, Any], status: str, reason: str) -> None:
    cond = vllm_version_condition(EngineSpec.model_validate(engine))
    assert (cond["status"], cond["reason"]) == (status, reason), cond


def test_a_vllm_version_that_contradicts_the_tag_is_refused_naming_the_field() -> None:
    with pytest.raises(VersionError, match=r"^spec\.engine\.vllmVersion: 0\.11\.2 disagrees with the image tag"):
        resolve_vllm_version("vllm/vllm-openai:v0.33.0", "0.11.2")
    assert re.search(r"spec\.engine\.vllmVersion: 0\.11\.2 disagrees",
                     refused(_dm(image="vllm/vllm-openai:v0.33.0", vllmVersion="0.11.2")))


@pytest.mark.parametrize("bad", ["latest", "0.33.0-rc1", "v", "0.x", "1.2.3.4", " 0.33.0"])
def test_a_malformed_vllm_version_is_refused_at_parse_naming_the_field(bad: str) -> None:
    with pytest.raises(ValidationError, match=r"spec\.engine\.vllmVersion"):
        _dm(vllmVersion=bad)


# ---------------------------------------------------------------------------------------- rendering

def test_the_default_image_is_the_default_release() -> None:
    assert f"vllm/vllm-openai:v{fmt(DEFAULT_VERSION)}" == DEFAULT_VLLM_IMAGE
    assert tag_version(DEFAULT_VLLM_IMAGE) == DEFAULT_VERSION


def test_the_default_image_drains_within_the_grace_period() -> None:
    dm = _dm(shutdownTimeoutSeconds=90)
    assert dm.spec.engine.image == DEFAULT_VLLM_IMAGE
    for role in ("prefill", "decode"):
        assert _flag(worker_args(dm, role), "--shutdown-timeout") == "90"
        grace = worker_deployment(dm, role)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > 90
    assert _kv(worker_args(dm, "decode"))["kv_load_failure_policy"] == dm.spec.kv_transfer.load_failure_policy


@pytest.mark.parametrize("engine,drain,policy_key", [
    ({"image": "vllm/vllm-openai:v0.11.2"}, False, False),
    ({"image": "vllm/vllm-openai:v0.12.0"}, False, False),
    ({"image": "vllm/vllm-openai:v0.13.0"}, False, True),
    ({"image": "vllm/vllm-openai:v0.17.1"}, False, True),
    ({"image": "vllm/vllm-openai:v0.18.0"}, True, True),
    ({"image": "vllm/vllm-openai:latest"}, True, True),  # the default release
    ({"image": "vllm/vllm-openai:latest", "vllmVersion": "0.17.1"}, False, True),
    ({"image": "vllm/vllm-openai@sha256:abcd", "vllmVersion": "0.12.0"}, False, False),
])
def test_rendered_flags_follow_the_release(engine: dict[str, Any], drain: bool, policy_key: bool) -> None:
    dm = _dm(shutdownTimeoutSeconds=45, **engine)
    decode, prefill = worker_args(dm, "decode"), worker_args(dm, "prefill")
    assert _flag(decode, "--shutdown-timeout") == ("45" if drain else None)
    assert _flag(prefill, "--shutdown-timeout") == ("45" if drain else None)
    assert ("kv_load_failure_policy" in _kv(decode)) is policy_key
    assert "kv_load_failure_policy" not in _kv(prefill)  # only the consumer loads KV
    assert _kv(decode)["kv_role"] == "kv_consumer" and _kv(prefill)["kv_role"] == "kv_producer"


def test_every_rendered_kv_key_is_a_field_of_the_release() -> None:
    for minor in range(11, 34):
        v = (0, minor, 2 if minor == 11 else 0)
        dm = _dm(image=f"vllm/vllm-openai:v{fmt(v)}")
        for role in ("prefill", "decode"):
            assert set(_kv(worker_args(dm, role))) <= profile(v).kv_transfer_fields, (v, role)


def test_fail_policy_on_a_release_without_it_is_refused_naming_the_field() -> None:
    body = example_body("llama-8b-nvlink")
    body["spec"]["engine"] = {"image": "vllm/vllm-openai:v0.12.0"}
    body["spec"]["kvTransfer"]["loadFailurePolicy"] = "fail"
    assert re.search(r"spec\.kvTransfer\.loadFailurePolicy: fail needs vLLM 0\.13\.0", refused(parse_model(body)))


# ------------------------------------------------------------------------------------------ the table

FACTS: list[Fact] = [SHUTDOWN_TIMEOUT, KV_LOAD_FAILURE_POLICY, KV_CONFIG_FORBIDS_UNKNOWN_KEYS, KV_LEASE_DURATION,
                     NIXL_ABORT_REQUEST_TIMEOUT_ENV, NIXL_AT_LEAST_1_5, *CONNECTORS, *METRICS]


@pytest.mark.parametrize("fact", FACTS, ids=lambda f: f.what)
def test_every_fact_is_cited_and_within_the_checked_range(fact: Fact) -> None:
    assert "vllm/" in fact.source and "(0." in fact.source
    for bound in (fact.since, fact.until):
        assert bound is None or bound == (0, 0, 0) or OLDEST_CHECKED <= bound <= DEFAULT_VERSION


def test_profiles_at_the_ends_of_the_table() -> None:
    old, new = profile(OLDEST_CHECKED), profile(DEFAULT_VERSION)
    assert not old.shutdown_timeout and new.shutdown_timeout
    assert not old.kv_load_failure_policy and new.kv_load_failure_policy
    assert old.default_kv_load_failure_policy == "recompute" and new.default_kv_load_failure_policy == "fail"
    assert not old.kv_config_forbids_unknown_keys and new.kv_config_forbids_unknown_keys
    assert (old.kv_lease_duration, old.default_unclaimed_kv_timeout_s) == (False, 480)
    assert (new.kv_lease_duration, new.default_unclaimed_kv_timeout_s) == (True, 30)
    assert old.connectors == {"NixlConnector"} and new.connectors == {"NixlConnector", "NixlPushConnector"}
    assert old.has_metric("vllm:time_per_output_token_seconds")
    assert not new.has_metric("vllm:time_per_output_token_seconds")
    for name in ("vllm:prompt_tokens_by_source", "vllm:num_requests_waiting_by_reason",
                 "vllm:nixl_num_kv_expired_reqs"):
        assert new.has_metric(name) and not old.has_metric(name), name
    assert "kv_ip" in old.kv_transfer_fields and "kv_ip" not in new.kv_transfer_fields
    assert old.min_nixl_version is None and new.min_nixl_version == "1.5.0"
