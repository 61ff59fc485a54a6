"""`disagg sim` accepts `vllm serve`'s command line (as the operator renders it) and the sim flags/env."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disagg.cli import build_parser
from disagg.sim import args, faults
from disagg.sim.config import Faults, env_name, parse

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
NIXL = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_producer"})


def test_operator_style_args_parse_like_vllm():
    cfg = parse([MODEL, "--port", "8000", "--served-model-name", "llama", "alias", "--tensor-parallel-size", "2",
                 "--pipeline-parallel-size", "2", "--max-model-len", "32k", "--max-num-seqs", "128",
                 "--max-num-batched-tokens", "32K", "--no-enable-chunked-prefill", "--enable-prefix-caching",
                 "--gpu-memory-utilization", "0.85", "--kv-transfer-config", NIXL, "--shutdown-timeout", "30",
                 "--data-parallel-size", "1"], env={})
    assert cfg.model == MODEL and cfg.served_model_names == ["llama", "alias"]
    assert (cfg.tp, cfg.pp, cfg.max_model_len, cfg.max_num_seqs) == (2, 2, 32000, 128)
    assert cfg.max_num_batched_tokens == 32768 and cfg.chunked_prefill is False and cfg.prefix_caching
    assert cfg.gpu_memory_utilization == 0.85 and cfg.shutdown_timeout == 30
    assert cfg.kv_transfer and cfg.kv_transfer.role == "kv_producer"
    assert cfg.kv_transfer.load_failure_policy == "fail"  # vLLM's default
    assert cfg.model_preset.name == "Llama-3.1-8B" and cfg.model_preset_inferred


def test_vllm_spellings_and_defaults():
    cfg = parse(["--model", MODEL, "-tp", "1", "--max_model_len=8192", "--kv-transfer-config",
                 json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"}),
                 "--kv-transfer-config.kv_connector_extra_config.kv_lease_duration", "7",
                 "--kv-transfer-config.kv_load_failure_policy", "recompute"], env={})
    assert cfg.max_model_len == 8192
    assert cfg.kv_transfer is not None
    assert cfg.kv_transfer.lease_s == 7 and cfg.kv_transfer.load_failure_policy == "recompute"
    # H100 defaults of vLLM 0.11 for the OpenAI server: 8192 batched tokens, 1024 sequences, chunked on
    assert cfg.max_num_batched_tokens == 8192 and cfg.max_num_seqs == 1024 and cfg.chunked_prefill
    a100 = parse([MODEL, "--gpu", "A100-80GB", "--max-model-len", "4096"], env={})
    assert a100.max_num_batched_tokens == 2048 and a100.max_num_seqs == 256
    nochunk = parse([MODEL, "--max-model-len", "16384", "--no-enable-chunked-prefill"], env={})
    assert nochunk.max_num_batched_tokens == 16384


def test_unknown_vllm_flags_are_accepted_and_reported():
    cfg = parse([MODEL, "--enforce-eager", "--swap-space", "4", "--disable-log-requests", "--foo=bar",
                 "--seed", "3", "--trust-remote-code", "--port", "9000"], env={})
    assert cfg.port == 9000 and cfg.seed == 3
    assert cfg.ignored_flags == ["--enforce-eager", "--swap-space", "--foo", "--trust-remote-code"]


def test_lease_follows_the_emulated_release():
    env = {"VLLM_NIXL_ABORT_REQUEST_TIMEOUT": "12", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5601",
           "VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.7"}
    # vLLM >= 0.22.0: kv_connector_extra_config.kv_lease_duration (default 30 s); the variable is not read
    cfg = parse([MODEL, "--kv-transfer-config", NIXL], env=env)
    assert cfg.kv_transfer is not None and cfg.kv_transfer.lease_s == 30
    assert (cfg.side_channel_host, cfg.side_channel_port) == ("10.0.0.7", 5601)
    # before 0.22.0: VLLM_NIXL_ABORT_REQUEST_TIMEOUT (default 480 s)
    old = parse([MODEL, "--emulate-version", "0.21.0", "--kv-transfer-config", NIXL], env=env)
    assert old.kv_transfer is not None and old.kv_transfer.lease_s == 12
    bare = parse([MODEL, "--emulate-version", "0.21.0", "--kv-transfer-config", NIXL], env={}).kv_transfer
    assert bare is not None and bare.lease_s == 480


def test_sim_flags_from_env_and_cli_wins():
    env = {"DISAGG_SIM_GPU": "H200", "DISAGG_SIM_TIME_SCALE": "0.1", "DISAGG_SIM_FAULT_KV_TRANSFER_FAIL_RATE": "0.5",
           "DISAGG_SIM_MODEL_PRESET": "Qwen3-32B", "DISAGG_SIM_OUTPUT_TOKENS": "9", "UCX_TLS": "tcp,cuda_copy"}
    cfg = parse([MODEL, "--gpu", "B200"], env=env)
    assert cfg.gpu.name == "B200" and cfg.time_scale == 0.1 and cfg.faults.kv_transfer_fail_rate == 0.5
    assert cfg.model_preset.name == "Qwen3-32B" and cfg.output_tokens == 9
    assert cfg.transport.name == "tcp"
    assert parse([MODEL, "--kv-transport", "nvlink"], env=env).transport.name == "nvlink"
    assert env_name("--sim-vllm-version") == "DISAGG_SIM_VLLM_VERSION"
    assert env_name("--fault-prefill-stall-ms") == "DISAGG_SIM_FAULT_PREFILL_STALL_MS"


def test_unknown_model_falls_back_to_default_preset():
    cfg = parse(["facebook/opt-125m", "--max-model-len", "2048"], env={})
    assert cfg.model_preset.name == "Llama-3.1-8B" and not cfg.model_preset_inferred


@pytest.mark.parametrize(
    "argv,needle",
    [
        ([MODEL, "--port", "abc"], "argument --port"),
        ([MODEL, "--kv-transfer-config", "{not json"], "argument --kv-transfer-config"),
        ([MODEL, "--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": "producer"})],
         "Unsupported kv_role: producer"),
        ([MODEL, "--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector"})], "kv_role is required"),
        ([MODEL, "--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both",
                                                     "kv_load_failure_policy": "retry"})], "kv_load_failure_policy"),
        ([MODEL, "--gpu", "TPU-v9"], "argument --gpu"),
        ([MODEL, "--model-preset", "GPT-5"], "argument --model-preset"),
        ([MODEL, "--time-scale", "0"], "argument --time-scale"),
        ([MODEL, "--fault-kv-transfer-fail-rate", "2"], "argument --fault-kv-transfer-fail-rate"),
        (["--port", "8000"], "model is required"),
        ([MODEL, "-pp", "3"], "argument --pipeline-parallel-size"),
        ([MODEL, "--no-enable-chunked-prefill", "--max-num-batched-tokens", "512", "--max-model-len", "4096"],
         "argument --max-num-batched-tokens"),
        ([MODEL, "--sim-efficiency", '{"step_overhead": 0.001}'], "argument --sim-efficiency: unknown key"),
        ([MODEL, "--sim-efficiency", '{"step_overhead_s": -1}'], "argument --sim-efficiency: step_overhead_s"),
        ([MODEL, "--sim-efficiency", '{"bf16_flops": 0}'], "argument --sim-efficiency: bf16_flops"),
        ([MODEL, "--sim-efficiency", "[1]"], "argument --sim-efficiency"),
    ],
)
def test_bad_flags_fail_naming_the_flag(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        parse(argv, env={})
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def test_sim_efficiency_replaces_the_presets_costs_and_keeps_the_rest():
    """--sim-efficiency (an engine fitted on measurements, disagg bench real-engine): the named costs and FLOP rate
    replace the GPU preset's; every other constant stays the preset's."""
    from disagg.perf.roofline import GPU_EFFICIENCY
    from disagg.sim.engine import build_perf

    base = build_perf(parse([MODEL, "--gpu", "vLLM-CPU-2core"], env={}))
    flops = 2 * base.gpu.bf16_flops
    given = {"step_overhead_s": base.eff.step_overhead_s / 2, "per_seq_overhead_s": 5e-05, "bf16_flops": flops}
    cfg = parse([MODEL, "--gpu", "vLLM-CPU-2core", "--sim-efficiency", json.dumps(given)], env={})
    perf = build_perf(cfg)
    assert (perf.eff.step_overhead_s, perf.eff.per_seq_overhead_s) == (given["step_overhead_s"], 5e-05)
    assert perf.eff.request_overhead_s == GPU_EFFICIENCY["vLLM-CPU-2core"].request_overhead_s
    assert cfg.gpu.bf16_flops == flops and cfg.gpu.hbm_bw == base.gpu.hbm_bw
    assert perf.prefill_time(512, chunk=1024) < base.prefill_time(512, chunk=1024)  # faster compute, less overhead


def test_bad_env_value_names_the_variable(capsys):
    with pytest.raises(SystemExit):
        parse([MODEL], env={"DISAGG_SIM_TIME_SCALE": "fast"})
    assert "DISAGG_SIM_TIME_SCALE" in capsys.readouterr().err


def test_main_cli_hands_every_argument_to_the_sim_parser():
    argv = ["sim", MODEL, "--port", "8001", "-tp", "2", "--kv-transfer-config", NIXL, "--unknown", "-h"]
    args = build_parser().parse_args(argv)
    assert args.argv == argv[1:]


def test_faults_update_validates():
    f = Faults()
    f.update({"kv_transfer_fail_rate": 1, "health_fail": True})
    assert f.kv_transfer_fail_rate == 1.0 and f.health_fail is True
    for bad in ({"nope": 1}, {"error_rate": 1.5}, {"health_fail": "yes"}, {"kv_transfer_delay_ms": -1}):
        with pytest.raises(ValueError):
            f.update(bad)


DOCS = Path(__file__).resolve().parents[2] / "docs" / "simulator.md"
# per kind of fault: (CLI/env text, the value it means, a valid admin value) and (bad text, bad admin value)
GOOD = {faults.RATE: ("0.25", 0.25, 1), faults.MILLIS: ("12.5", 12.5, 40), faults.COUNT: ("3", 3, 2),
        faults.SWITCH: ("yes", True, True)}
BAD = {faults.RATE: ("1.5", 1.5), faults.MILLIS: ("-1", -1), faults.COUNT: ("-2", 2.5),
       faults.SWITCH: (None, "yes")}


def test_fault_table_in_docs_is_generated_from_code():
    text = DOCS.read_text()
    assert faults.docs_table(text) == faults.markdown_table(env_name), (
        "docs/simulator.md's fault table is stale: run `python -m disagg.sim.faults docs/simulator.md`")
    assert faults.replace_docs_table(text, faults.markdown_table(env_name)) == text
    with pytest.raises(ValueError):
        faults.replace_docs_table("no markers here", "| x |")


def test_fault_table_is_the_runtime_structure():
    assert tuple(Faults().as_dict()) == faults.FAULT_FIELDS == tuple(s.name for s in faults.FAULTS)
    assert {s.kind for s in faults.FAULTS} == set(GOOD)  # every kind is exercised below
    flags = {o for a in args.build_parser()._actions for o in a.option_strings}
    assert {s.flag for s in faults.FAULTS} <= flags


@pytest.mark.parametrize("spec", faults.FAULTS, ids=lambda s: s.name)
def test_each_fault_reaches_the_config_from_flag_env_and_admin(spec):
    text, value, admin = GOOD[spec.kind]
    assert getattr(parse([MODEL], env={}).faults, spec.name) == spec.default
    assert getattr(parse([MODEL, spec.flag, text], env={}).faults, spec.name) == value
    assert getattr(parse([MODEL], env={env_name(spec.flag): text}).faults, spec.name) == value
    f = Faults()
    f.update({spec.name: admin})
    assert f.as_dict()[spec.name] == admin and type(getattr(f, spec.name)) is spec.kind.type


@pytest.mark.parametrize("spec", faults.FAULTS, ids=lambda s: s.name)
def test_each_fault_refuses_bad_values_naming_it(spec, capsys):
    bad_text, bad_admin = BAD[spec.kind]
    if bad_text is not None:  # a switch reads any text (vLLM-style truthy strings)
        with pytest.raises(SystemExit) as e:
            parse([MODEL, spec.flag, bad_text], env={})
        assert e.value.code == 2 and f"argument {spec.flag}" in capsys.readouterr().err
    f = Faults()
    with pytest.raises(ValueError, match=spec.name):
        f.update({"kv_transfer_delay_ms": 5.0, spec.name: bad_admin})
    assert f == Faults()  # all or nothing


def test_tracing_flags_parse_like_vllm_and_do_not_swallow_the_next_flag():
    """The operator renders these for workers (builders/tracing.py): the twin takes them as vLLM does; the boolean
    --enable-per-request-metrics must not eat the flag after it."""
    cfg = parse(["m", "--otlp-traces-endpoint", "http://127.0.0.1:4318/v1/traces", "--enable-per-request-metrics",
                 "--max-num-seqs", "7"], env={})
    assert cfg.otlp_traces_endpoint == "http://127.0.0.1:4318/v1/traces"
    assert cfg.enable_per_request_metrics and cfg.max_num_seqs == 7
    assert "--otlp-traces-endpoint" not in cfg.ignored_flags
    off = parse(["m"], env={})
    assert off.otlp_traces_endpoint is None and not off.enable_per_request_metrics


def test_expert_parallel_reaches_the_perf_model_and_bad_sizes_name_the_flag(capsys):
    """--enable-expert-parallel shards a MoE model's experts over tp × dp GPUs in the perf model (fewer expert
    weights read per GPU); a size that does not divide the experts is refused naming the flag."""
    from disagg.sim.engine import build_perf

    base = ["Qwen/Qwen3-30B-A3B", "-tp", "2", "-dp", "2"]
    ep = build_perf(parse([*base, "--enable-expert-parallel"], env={}))
    no = build_perf(parse(base, env={}))
    assert (ep.ep, ep.dp) == (4, 2) and (no.ep, no.dp) == (1, 1)
    assert ep.weight_bytes_per_gpu < no.weight_bytes_per_gpu
    with pytest.raises(SystemExit):
        parse(["mistralai/Mixtral-8x7B-Instruct-v0.1", "-tp", "4", "-dp", "4", "--enable-expert-parallel"], env={})
    assert "argument --enable-expert-parallel" in capsys.readouterr().err
