"""``disagg sim --emulate-version``: the twin follows the version table (disagg.vllm_versions) for the release it
emulates: which flags and kv-transfer-config keys exist, the KV-load-failure policy, where the unclaimed-KV lease
comes from, and which metric families are exported. Default: the operator's default release (0.33.0)."""

from __future__ import annotations

import json
import signal
import threading
import uuid
from typing import Any

import pytest
from simtest_util import MODEL, kv_config, prompt_of

from disagg.poll import wait_for
from disagg.sim.args import VLLM_VERSION
from disagg.sim.config import parse
from disagg.sim.metrics import Metrics
from disagg.vllm_versions import DEFAULT_VERSION, fmt, profile

CONSUMER = {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}


def _kv(**cfg: object) -> list[str]:
    return ["--kv-transfer-config", json.dumps({**CONSUMER, **cfg})]


def test_the_default_release_is_the_operators_default() -> None:
    cfg = parse(["m"], env={})
    assert VLLM_VERSION == fmt(DEFAULT_VERSION) == cfg.vllm_version
    assert cfg.release == profile(DEFAULT_VERSION)


def test_default_release_kv_semantics() -> None:
    cfg = parse(["m", *_kv(), "--shutdown-timeout", "30"], env={"VLLM_NIXL_ABORT_REQUEST_TIMEOUT": "7"})
    assert cfg.kv_transfer is not None
    assert cfg.kv_transfer.load_failure_policy == "fail"  # vLLM >= 0.17.0's default
    assert cfg.kv_transfer.lease_s == 30  # kv_lease_duration's default; the old variable is not read any more
    assert cfg.shutdown_timeout == 30
    leased = parse(["m", *_kv(kv_connector_extra_config={"kv_lease_duration": 12})], env={})
    assert leased.kv_transfer is not None and leased.kv_transfer.lease_s == 12


def test_default_release_refuses_unknown_kv_transfer_keys(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse(["m", *_kv(kv_lease_duration=5)], env={})  # belongs in kv_connector_extra_config
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --kv-transfer-config: 1 validation error for KVTransferConfig\nkv_lease_duration" in err


def test_0_11_2_has_no_policy_and_always_recomputes() -> None:
    cfg = parse(["m", "--emulate-version", "0.11.2", *_kv(kv_load_failure_policy="fail")], env={})
    assert cfg.vllm_version == "0.11.2"
    assert cfg.kv_transfer is not None and cfg.kv_transfer.load_failure_policy == "recompute"
    assert any("kv_load_failure_policy" in f and "0.11.2" in f for f in cfg.ignored_flags)


def test_0_11_2_lease_is_the_abort_request_timeout() -> None:
    env = {"VLLM_NIXL_ABORT_REQUEST_TIMEOUT": "7"}
    cfg = parse(["m", "--emulate-version", "0.11.2", *_kv(kv_connector_extra_config={"kv_lease_duration": 99})],
                env=env)
    assert cfg.kv_transfer is not None and cfg.kv_transfer.lease_s == 7
    cfg = parse(["m", "--emulate-version", "0.11.2", *_kv()], env={})
    assert cfg.kv_transfer is not None and cfg.kv_transfer.lease_s == 480


def test_0_13_to_0_16_default_policy_is_recompute() -> None:
    for v in ("0.13.0", "0.16.0"):
        cfg = parse(["m", "--emulate-version", v, *_kv()], env={})
        assert cfg.kv_transfer is not None and cfg.kv_transfer.load_failure_policy == "recompute", v
    cfg = parse(["m", "--emulate-version", "0.17.0", *_kv()], env={})
    assert cfg.kv_transfer is not None and cfg.kv_transfer.load_failure_policy == "fail"


@pytest.mark.parametrize("version", ["0.11.2", "0.17.1"])
def test_releases_before_0_18_refuse_shutdown_timeout(version: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse(["m", "--emulate-version", version, "--shutdown-timeout=30"], env={})
    assert e.value.code == 2
    assert "unrecognized arguments: --shutdown-timeout" in capsys.readouterr().err
    assert parse(["m", "--emulate-version", "0.18.0", "--shutdown-timeout", "30"], env={}).shutdown_timeout == 30


@pytest.mark.parametrize("bad", ["latest", "0.10.0", "0.99.0"])
def test_emulate_version_must_be_a_release_of_the_table(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(["m", "--emulate-version", bad], env={})
    assert "--emulate-version" in capsys.readouterr().err


def test_emulate_version_from_the_environment_and_advertised_version() -> None:
    cfg = parse(["m"], env={"DISAGG_SIM_EMULATE_VERSION": "0.20.1"})
    assert cfg.release == profile((0, 20, 1)) and cfg.vllm_version == "0.20.1"
    cfg = parse(["m", "--sim-vllm-version", "0.20.1+local"], env={"DISAGG_SIM_EMULATE_VERSION": "0.20.1"})
    assert cfg.vllm_version == "0.20.1+local"


def _families(version: tuple[int, int, int]) -> set[str]:
    text = Metrics("m", 4096, nixl=True, release=profile(version)).render().decode()
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    return {n.removesuffix("_created").removesuffix("_total") for n in names}


def test_metric_families_follow_the_release() -> None:
    old, new = _families((0, 11, 2)), _families(DEFAULT_VERSION)
    assert "vllm:time_per_output_token_seconds" in old and "vllm:time_per_output_token_seconds" not in new
    for name in ("vllm:prompt_tokens_by_source", "vllm:prompt_tokens_cached", "vllm:num_requests_waiting_by_reason",
                 "vllm:nixl_num_kv_expired_reqs", "vllm:nixl_num_notifications_after_expiry"):
        assert name in new and name not in old, name
    for name in ("vllm:kv_cache_usage_perc", "vllm:nixl_xfer_time_seconds", "vllm:nixl_num_failed_transfers",
                 "vllm:inter_token_latency_seconds"):
        assert name in new and name in old, name
    assert "vllm:nixl_num_notifications_after_expiry" not in _families((0, 31, 0))


def test_0_11_2_twin_recomputes_a_failed_pull_that_0_33_fails(sims) -> None:
    """End to end: the same decode worker config ('fail') answers normally when emulating 0.11.2."""
    p = sims.start("--kv-transfer-config", kv_config("kv_producer"))
    old = sims.start("--emulate-version", "0.11.2", "--kv-transfer-config", kv_config("kv_consumer", "fail"),
                     "--fault-kv-transfer-fail-rate", "1.0")
    new = sims.start("--kv-transfer-config", kv_config("kv_consumer", "fail"), "--fault-kv-transfer-fail-rate", "1.0")
    assert json.loads(old.get("/version")[1])["version"] == "0.11.2"
    for d, ok in ((old, True), (new, False)):
        body = {"prompt": prompt_of(400, uuid.uuid4().hex), "max_tokens": 4}
        leg = {**body, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}
        status, resp = p.post("/v1/completions", leg)
        assert status == 200, resp
        status, _, raw = d.post_raw("/v1/completions", {**body, "kv_transfer_params": resp["kv_transfer_params"]})
        assert (status == 200) is ok, raw
        if ok:
            assert json.loads(raw)["usage"]["completion_tokens"] == 4
            assert d.state()["kv_transfer"]["recomputed"] >= 1
        assert d.metrics()["vllm:nixl_num_failed_transfers_total"] >= 1


def _rendered_drain_flags(image: str) -> list[str]:
    """The version-dependent drain flag the operator renders for a decode pool running ``image``."""
    from disagg.builders import parse_model, worker_args

    body = {"apiVersion": "serving.disagg.dev/v1alpha1", "kind": "DisaggregatedModel",
            "metadata": {"name": "m", "namespace": "ns", "uid": "00000000-0000-4000-8000-000000000001"},
            "spec": {"model": {"name": MODEL}, "engine": {"image": image, "shutdownTimeoutSeconds": 20}}}
    args = worker_args(parse_model(body), "decode")
    i = args.index("--shutdown-timeout") if "--shutdown-timeout" in args else -1
    return args[i:i + 2] if i >= 0 else []


@pytest.mark.parametrize("image,emulate,drains", [
    ("vllm/vllm-openai:v0.33.0", "0.33.0", True),
    ("vllm/vllm-openai:v0.11.2", "0.11.2", False),
])
def test_operator_rendered_drain_on_the_twin_of_that_release(
        sims, image: str, emulate: str, drains: bool) -> None:
    """SIGTERM during a request: the default release drains it (the operator renders --shutdown-timeout); 0.11.2
    has no such flag (the operator renders none) and aborts it."""
    flags = _rendered_drain_flags(image)
    assert (flags == ["--shutdown-timeout", "20"]) is drains
    s = sims.start("--emulate-version", emulate, "--max-model-len", "4096", *flags, time_scale=0.5)
    result: dict[str, Any] = {}

    def call() -> None:
        try:
            result["r"] = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 100})
        except Exception as e:  # noqa: BLE001 - the aborted case: the connection is closed under the client
            result["e"] = e

    t = threading.Thread(target=call)
    t.start()
    wait_for(lambda: s.metrics()["vllm:num_requests_running"] == 1, what="request running")
    s.proc.send_signal(signal.SIGTERM)
    t.join(timeout=30)
    assert not t.is_alive()
    completed = "r" in result and result["r"][0] == 200 and result["r"][1]["usage"]["completion_tokens"] == 100
    assert completed is drains, result
    assert s.proc.wait(timeout=20) == 0
