"""``disagg sim``'s configuration: the command line (:mod:`disagg.sim.args`: ``vllm serve``'s flags, the sim
flags, the fault flags from :mod:`disagg.sim.faults`) resolved and validated into a :class:`SimConfig`.

Validation and defaults follow vLLM where the operator relies on them (EngineArgs' batch defaults,
KVTransferConfig's roles and ``kv_load_failure_policy``); every error exits 2 naming the flag or variable.
"""

from __future__ import annotations

import argparse
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..perf import presets
from ..perf.roofline import GPU_EFFICIENCY, Efficiency
from ..vllm_versions import VllmProfile, fmt, parse_version, profile
from .args import (
    ENV_PREFIX,
    SIM_FLAGS,
    VLLM_VERSION,
    SimArgumentError,
    apply_env,
    build_parser,
    env_name,
    fail,
    flag_dest,
    human_readable_int,
    normalize_argv,
)
from .faults import FAULT_FIELDS, FAULTS, Faults

__all__ = [
    "ENV_PREFIX", "FAULT_FIELDS", "SIM_FLAGS", "VLLM_VERSION", "Faults", "KVTransfer", "SimArgumentError", "SimConfig",
    "build_parser", "env_name", "human_readable_int", "normalize_argv", "parse",
]

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
KV_LOAD_FAILURE_POLICIES = ("recompute", "fail")
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")


@dataclass
class KVTransfer:
    connector: str
    role: str  # kv_producer | kv_consumer | kv_both
    engine_id: str
    load_failure_policy: str  # recompute | fail
    lease_s: float
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class SimConfig:
    model: str
    served_model_names: list[str]
    host: str | None
    port: int
    tp: int
    pp: int
    dp: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    prefix_caching: bool
    long_prefill_token_threshold: int
    scheduling_policy: str  # fcfs | priority (--scheduling-policy)
    gpu_memory_utilization: float
    block_size: int
    kv_cache_dtype: str
    quantization: str | None
    seed: int
    shutdown_timeout: float
    log_requests: bool
    kv_transfer: KVTransfer | None
    side_channel_host: str
    side_channel_port: int
    gpu: presets.GPUPreset
    model_preset: presets.ModelPreset
    model_preset_inferred: bool
    time_scale: float
    transport: presets.TransportPreset
    kv_payload_scale: float
    output_tokens: int
    vllm_version: str
    load_seconds: float
    faults: Faults
    ignored_flags: list[str]
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None
    max_model_len_explicit: bool = False
    otlp_traces_endpoint: str | None = None  # --otlp-traces-endpoint (else OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
    enable_per_request_metrics: bool = False  # --enable-per-request-metrics
    kv_events: dict[str, Any] | None = None  # --kv-events-config (issue 30: sim/kvevents.py)
    enable_prompt_tokens_details: bool = False  # --enable-prompt-tokens-details (issue 30)
    expert_parallel: bool = False  # --enable-expert-parallel: MoE experts over tp × dp GPUs (perf/roofline.py ep)
    release: VllmProfile = field(default_factory=lambda: profile(parse_version(VLLM_VERSION) or (0, 0, 0)))
    efficiency: Efficiency | None = None  # --sim-efficiency: the preset's costs overridden (None: the preset's)

    @property
    def served_model_name(self) -> str:
        return self.served_model_names[0]


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = _deep_merge(dict(base[k]), v)
        else:
            base[k] = v
    return base


def _model_name(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    if ns.model_tag and ns.model and ns.model_tag != ns.model:
        fail(parser, f"argument --model: {ns.model!r} conflicts with the positional model {ns.model_tag!r}")
    model = ns.model_tag or ns.model
    if not model:
        fail(parser, "the model is required (positional or --model)")
    return str(model)


def _merge_dotted(ns: argparse.Namespace, dotted: dict[str, dict[str, Any]], ignored: list[str]) -> None:
    """Dotted ``--kv-transfer-config.key value`` args into the JSON flag; other dotted flags are ignored."""
    for key, value in dotted.items():
        if key != "--kv-transfer-config":
            ignored.append(key + ".*")
            continue
        ns.kv_transfer_config = _deep_merge(dict(ns.kv_transfer_config or {}), value)


@dataclass
class _Presets:
    gpu: presets.GPUPreset
    model: presets.ModelPreset
    model_inferred: bool
    transport: presets.TransportPreset


def _presets(ns: argparse.Namespace, model: str, env: Mapping[str, str], parser: argparse.ArgumentParser,
             ) -> _Presets:
    try:
        gpu = presets.get_gpu(ns.gpu)
    except presets.PresetError as e:
        fail(parser, f"argument --gpu: {e}")
    inferred = False
    if ns.model_preset:
        try:
            mp = presets.get_model(ns.model_preset)
        except presets.PresetError as e:
            fail(parser, f"argument --model-preset: {e}")
    else:
        found = presets.infer_model(model)
        inferred = found is not None
        mp = found or presets.MODELS[presets.DEFAULT_MODEL]
    try:
        transport = presets.resolve_transport(ns.kv_transport, env)
    except presets.PresetError as e:
        fail(parser, f"argument --kv-transport: {e}")
    return _Presets(gpu, mp, inferred, transport)


def _check_engine_flags(ns: argparse.Namespace, mp: presets.ModelPreset, parser: argparse.ArgumentParser) -> None:
    tp, pp = ns.tensor_parallel_size, ns.pipeline_parallel_size
    if tp < 1:
        fail(parser, "argument --tensor-parallel-size/-tp: must be >= 1")
    if pp < 1:
        fail(parser, "argument --pipeline-parallel-size/-pp: must be >= 1")
    if mp.layers % pp:
        fail(parser, f"argument --pipeline-parallel-size/-pp: {mp.name} has {mp.layers} layers, not divisible by {pp}")
    if ns.data_parallel_size < 1:
        fail(parser, "argument --data-parallel-size/-dp: must be >= 1")
    ep = tp * ns.data_parallel_size
    if ns.enable_expert_parallel and mp.is_moe and mp.num_experts % ep:
        fail(parser, f"argument --enable-expert-parallel: {mp.name} has {mp.num_experts} experts, not divisible by "
                     f"the expert-parallel size tensor × data = {ep}")
    if not 0 < ns.gpu_memory_utilization <= 1:
        fail(parser, "argument --gpu-memory-utilization: must be in (0, 1]")
    if ns.num_gpu_blocks_override is not None and ns.num_gpu_blocks_override < 1:
        fail(parser, "argument --num-gpu-blocks-override: must be >= 1")
    if ns.block_size not in BLOCK_SIZES:
        fail(parser, f"argument --block-size: must be one of {', '.join(map(str, BLOCK_SIZES))}")
    if ns.kv_cache_dtype not in KV_CACHE_DTYPES:
        fail(parser, f"argument --kv-cache-dtype: invalid choice {ns.kv_cache_dtype!r}")
    if ns.sim_output_tokens < 1:
        fail(parser, "argument --sim-output-tokens: must be >= 1")


@dataclass
class _Batch:
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    prefix_caching: bool


def _batch_limits(ns: argparse.Namespace, gpu: presets.GPUPreset, mp: presets.ModelPreset,
                  parser: argparse.ArgumentParser) -> _Batch:
    max_model_len = ns.max_model_len or mp.max_position
    if max_model_len < 1:
        fail(parser, "argument --max-model-len: must be >= 1")
    chunked = True if ns.enable_chunked_prefill is None else ns.enable_chunked_prefill
    prefix = True if ns.enable_prefix_caching is None else ns.enable_prefix_caching
    default_seqs, default_mnbt = presets.vllm_batch_defaults(gpu)  # vLLM's defaults for this GPU
    max_num_seqs = ns.max_num_seqs
    mnbt = ns.max_num_batched_tokens
    if mnbt is None:
        mnbt = default_mnbt
        if not chunked:
            mnbt = max(max_model_len, mnbt)
        mnbt = min((max_num_seqs or default_seqs) * max_model_len, mnbt)
    if max_num_seqs is None:
        max_num_seqs = min(default_seqs, mnbt)
    if max_num_seqs < 1:
        fail(parser, "argument --max-num-seqs: must be >= 1")
    if mnbt < 1:
        fail(parser, "argument --max-num-batched-tokens: must be >= 1")
    if not chunked and mnbt < max_model_len:
        fail(parser, f"argument --max-num-batched-tokens: ({mnbt}) is smaller than max_model_len ({max_model_len}) "
                     "with chunked prefill disabled, so requests longer than it could never be scheduled; "
                     "raise it or --enable-chunked-prefill")
    return _Batch(max_model_len, max_num_seqs, mnbt, chunked, prefix)


def _kv_transfer(cfg: dict[str, Any] | None, env: Mapping[str, str], ignored: list[str],
                 parser: argparse.ArgumentParser, release: VllmProfile) -> KVTransfer | None:
    """vLLM's KVTransferConfig checks, as the emulated release makes them (disagg.vllm_versions: which keys exist,
    whether unknown ones are refused, the kv_load_failure_policy default, where the lease comes from); only
    NixlConnector is simulated (others are reported as ignored)."""
    if not cfg:
        return None
    unknown = sorted(k for k in cfg if k not in release.kv_transfer_fields)
    if unknown and release.kv_config_forbids_unknown_keys:
        # vLLM >= 0.16.0: pydantic's extra="forbid" (vllm/config/utils.py); vLLM 0.33.0's parser says
        # "argument --kv-transfer-config: 1 validation error for KVTransferConfig\n<key>\n  Unexpected keyword
        # argument [type=unexpected_keyword_argument, …]" and exits 2.
        fail(parser, f"argument --kv-transfer-config: 1 validation error for KVTransferConfig\n{unknown[0]}\n"
                     "  Unexpected keyword argument [type=unexpected_keyword_argument]")
    for k in unknown:  # vLLM < 0.16.0 drops them silently (pydantic's default extra="ignore")
        ignored.append(f"--kv-transfer-config {k} (not a KVTransferConfig field in vLLM {fmt(release.version)})")
        cfg = {key: v for key, v in cfg.items() if key != k}
    connector = cfg.get("kv_connector")
    role = cfg.get("kv_role")
    if connector is not None and role is None:
        fail(parser, "argument --kv-transfer-config: kv_role is required when kv_connector is set "
                     "(kv_producer, kv_consumer, kv_both)")
    if role is not None and role not in KV_ROLES:
        fail(parser, f"argument --kv-transfer-config: Unsupported kv_role: {role}. Supported roles are {KV_ROLES}")
    # Before 0.13.0 there is no policy: a failed KV load is always recomputed.
    policy = cfg.get("kv_load_failure_policy", release.default_kv_load_failure_policy)
    if policy not in KV_LOAD_FAILURE_POLICIES:
        fail(parser, f"argument --kv-transfer-config: kv_load_failure_policy must be 'recompute' or 'fail', "
                     f"got {policy!r}")
    extra = cfg.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        fail(parser, "argument --kv-transfer-config: kv_connector_extra_config must be an object")
    if connector is None:
        return None
    if connector != "NixlConnector":
        ignored.append(f"--kv-transfer-config kv_connector={connector} (only NixlConnector is simulated)")
        return None
    # Unclaimed prefill blocks: kv_connector_extra_config.kv_lease_duration from 0.22.0 (default 30 s), the
    # environment variable VLLM_NIXL_ABORT_REQUEST_TIMEOUT before (default 480 s); each release reads only its own.
    if release.kv_lease_duration:
        lease = extra.get("kv_lease_duration", release.default_unclaimed_kv_timeout_s)
    else:
        lease = env.get("VLLM_NIXL_ABORT_REQUEST_TIMEOUT", str(release.default_unclaimed_kv_timeout_s))
    try:
        lease = float(lease)
    except (TypeError, ValueError):
        fail(parser, f"kv_lease_duration / VLLM_NIXL_ABORT_REQUEST_TIMEOUT: not a number: {lease!r}")
    return KVTransfer(connector, str(role), str(cfg.get("engine_id") or uuid.uuid4()), policy, lease, extra)


def _release(ns: argparse.Namespace, argv: list[str], parser: argparse.ArgumentParser) -> VllmProfile:
    """The emulated vLLM release; its CLI refuses the flags it does not have (as `vllm serve` does)."""
    version = parse_version(ns.emulate_version)
    if version is None:  # checked by the flag's type, also when it comes from the environment
        fail(parser, f"argument --emulate-version: invalid value {ns.emulate_version!r}")
    release = profile(version)
    if not release.shutdown_timeout and any(a.split("=", 1)[0] == "--shutdown-timeout" for a in argv):
        # vllm/engine/arg_utils.py has --shutdown-timeout from 0.18.0; before, argparse refuses it.
        fail(parser, f"unrecognized arguments: --shutdown-timeout (vLLM {fmt(version)} has no such flag; it "
                     "aborts in-flight requests on SIGTERM)")
    return release


def _side_channel_port(env: Mapping[str, str], parser: argparse.ArgumentParser) -> int:
    try:
        return int(env.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600"))
    except ValueError:
        fail(parser, "environment VLLM_NIXL_SIDE_CHANNEL_PORT: not an integer")


def _efficiency(ns: argparse.Namespace, gpu: presets.GPUPreset, parser: argparse.ArgumentParser,
                ) -> tuple[presets.GPUPreset, Efficiency | None]:
    """--sim-efficiency: the GPU preset's Efficiency with the given fields replaced, and its bf16_flops."""
    given: dict[str, Any] | None = ns.sim_efficiency
    if not given:
        return gpu, None
    known = {f.name for f in fields(Efficiency)}
    for key, value in given.items():
        if key not in known and key != "bf16_flops":
            fail(parser, f"argument --sim-efficiency: unknown key {key!r} (known: {', '.join(sorted(known))}, "
                         "bf16_flops)")
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            fail(parser, f"argument --sim-efficiency: {key} must be a number >= 0, got {value!r}")
    costs = {k: float(v) for k, v in given.items() if k != "bf16_flops"}
    if "bf16_flops" in given:
        if not given["bf16_flops"]:
            fail(parser, "argument --sim-efficiency: bf16_flops must be > 0")
        gpu = replace(gpu, bf16_flops=float(given["bf16_flops"]))
    return gpu, replace(GPU_EFFICIENCY.get(gpu.name) or Efficiency(), **costs)


def _faults(ns: argparse.Namespace) -> Faults:
    return Faults.from_values({spec.name: getattr(ns, flag_dest(spec.flag)) for spec in FAULTS})


def parse(argv: list[str], env: Mapping[str, str] | None = None) -> SimConfig:
    env = dict(os.environ) if env is None else env
    parser = build_parser()
    norm, dotted, ignored = normalize_argv(argv, parser)
    ns = parser.parse_args(norm)
    apply_env(ns, env, parser)
    model = _model_name(ns, parser)
    _merge_dotted(ns, dotted, ignored)
    pre = _presets(ns, model, env, parser)
    pre.gpu, efficiency = _efficiency(ns, pre.gpu, parser)
    _check_engine_flags(ns, pre.model, parser)
    batch = _batch_limits(ns, pre.gpu, pre.model, parser)
    release = _release(ns, norm, parser)
    kvt = _kv_transfer(ns.kv_transfer_config, env, ignored, parser, release)
    sc_port = _side_channel_port(env, parser)
    return SimConfig(
        model=model,
        served_model_names=ns.served_model_name or [model],
        host=ns.host,
        port=ns.port,
        tp=ns.tensor_parallel_size,
        pp=ns.pipeline_parallel_size,
        dp=ns.data_parallel_size,
        max_model_len=batch.max_model_len,
        max_num_seqs=batch.max_num_seqs,
        max_num_batched_tokens=batch.max_num_batched_tokens,
        chunked_prefill=batch.chunked_prefill,
        prefix_caching=batch.prefix_caching,
        long_prefill_token_threshold=ns.long_prefill_token_threshold,
        scheduling_policy=ns.scheduling_policy,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        block_size=ns.block_size,
        kv_cache_dtype=ns.kv_cache_dtype,
        quantization=ns.quantization,
        seed=ns.seed,
        shutdown_timeout=ns.shutdown_timeout,
        log_requests=ns.enable_log_requests and not ns.disable_log_requests,
        kv_transfer=kvt,
        side_channel_host=env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost"),
        side_channel_port=sc_port,
        gpu=pre.gpu,
        model_preset=pre.model,
        model_preset_inferred=pre.model_inferred,
        time_scale=ns.time_scale,
        transport=pre.transport,
        kv_payload_scale=ns.kv_payload_scale,
        output_tokens=ns.sim_output_tokens,
        vllm_version=ns.sim_vllm_version or ns.emulate_version,
        release=release,
        load_seconds=ns.sim_load_seconds,
        faults=_faults(ns),
        ignored_flags=ignored,
        num_gpu_blocks_override=ns.num_gpu_blocks_override,
        kv_cache_memory_bytes=ns.kv_cache_memory_bytes,
        max_model_len_explicit=ns.max_model_len is not None,
        otlp_traces_endpoint=ns.otlp_traces_endpoint,
        enable_per_request_metrics=ns.enable_per_request_metrics,
        kv_events=ns.kv_events_config,
        enable_prompt_tokens_details=ns.enable_prompt_tokens_details,
        expert_parallel=ns.enable_expert_parallel,
        efficiency=efficiency,
    )
