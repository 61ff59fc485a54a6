"""``disagg sim`` command line: exactly what ``vllm serve`` accepts for the flags the operator renders,
plus sim flags. Every sim flag can also come from ``DISAGG_SIM_<NAME>`` (flag without ``--``/``sim-``,
upper case, ``-`` → ``_``); an explicit flag wins over the environment.

Parsing follows vLLM's FlexibleArgumentParser where it matters: ``--flag=value``, underscores in flag names
(``--max_model_len``), human-readable ints (``32k``), dotted JSON keys (``--kv-transfer-config.kv_role
kv_producer``), the model as positional or ``--model``. Unknown ``--flag [value]`` is accepted with a warning.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from . import presets

ENV_PREFIX = "DISAGG_SIM_"
VLLM_VERSION = "0.11.2"  # the vLLM release the twin mimics (wire fields, metric names, defaults)

# vLLM flags that take no value (so an unknown-flag skipper does not eat the next token).
_VLLM_BOOL_FLAGS = {
    "--enforce-eager", "--trust-remote-code", "--disable-log-requests", "--enable-log-requests", "--disable-log-stats",
    "--enable-auto-tool-choice", "--disable-frontend-multiprocessing", "--enable-lora", "--disable-custom-all-reduce",
    "--disable-sliding-window", "--skip-tokenizer-init", "--enable-prompt-tokens-details", "--enable-chunked-prefill",
    "--no-enable-chunked-prefill", "--enable-prefix-caching", "--no-enable-prefix-caching", "--headless",
    "--enable-expert-parallel", "--enable-eplb", "--disable-fastapi-docs", "--enable-request-id-headers",
    "--enable-server-load-tracking", "--enable-force-include-usage", "--enable-sleep-mode", "--async-scheduling",
    "--disable-uvicorn-access-log", "--enable-log-outputs", "--data-parallel-external-lb", "--enable-dbo",
    "--calculate-kv-scales", "--enable-tokenizer-info-endpoint",
    "--return-tokens-as-token-ids", "--disable-cascade-attn", "--enable-reasoning",
}


def human_readable_int(value: str) -> int:
    """vLLM's human_readable_int: '1k' → 1000, '1K' → 1024, '25.6k' → 25600."""
    value = value.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if m:
        number, suffix = m.groups()
        dec = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
        binary = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
        if suffix in dec:
            return int(float(number) * dec[suffix])
        try:
            return int(number) * binary[suffix]
        except ValueError:
            raise argparse.ArgumentTypeError(f"decimals are not allowed with binary suffix {suffix}") from None
    return int(value)


def _fraction(value: str) -> float:
    v = float(value)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {value}")
    return v


def _positive_float(value: str) -> float:
    v = float(value)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return v


def _non_negative_float(value: str) -> float:
    v = float(value)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return v


def _json_obj(value: str) -> dict:
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return obj


# (flag, kwargs) of the sim flags; dest is derived by argparse. Env: DISAGG_SIM_<NAME>.
SIM_FLAGS: list[tuple[str, dict[str, Any]]] = [
    ("--gpu", dict(default=presets.DEFAULT_GPU, help=f"GPU preset: {', '.join(presets.GPUS)}")),
    ("--model-preset", dict(default=None, help="model shape preset (default: inferred from the model name, "
                                               f"else {presets.DEFAULT_MODEL}): {', '.join(presets.MODELS)}")),
    ("--time-scale", dict(type=_positive_float, default=1.0,
                          help="wall seconds per simulated second (0.1 runs 10x faster); metrics stay simulated")),
    ("--kv-transport", dict(default="auto", help="KV transport preset: rdma, nvlink, tcp, or auto (from UCX_TLS)")),
    ("--kv-payload-scale", dict(type=_non_negative_float, default=1 / 1024,
                                help="fraction of the modelled KV bytes really sent over the side channel")),
    ("--sim-output-tokens", dict(type=int, default=128,
                                 help="output length when a request sets no max_tokens (models EOS, reason stop)")),
    ("--sim-vllm-version", dict(default=VLLM_VERSION,
                                help="engine version advertised in the NIXL handshake (mismatch → refused)")),
    ("--sim-load-seconds", dict(type=_non_negative_float, default=0.0,
                                help="simulated model-loading time before the HTTP port opens")),
    ("--fault-kv-transfer-fail-rate", dict(type=_fraction, default=0.0, help="probability a KV pull fails")),
    ("--fault-kv-transfer-delay-ms", dict(type=_non_negative_float, default=0.0,
                                          help="extra simulated ms added to every KV pull")),
    ("--fault-prefill-error-rate", dict(type=_fraction, default=0.0,
                                        help="probability a request needing local prefill fails with HTTP 500")),
    ("--fault-error-rate", dict(type=_fraction, default=0.0,
                                help="probability any completion request fails with HTTP 500")),
    ("--fault-prefill-stall-ms", dict(type=_non_negative_float, default=0.0,
                                      help="extra simulated ms added to every step that runs prefill tokens")),
    ("--fault-health-fail", dict(type=lambda v: str(v).lower() in ("1", "true", "yes", "on"), default=False,
                                 help="/health answers 503")),
    ("--fault-crash-after-requests", dict(type=int, default=0,
                                          help="exit(1) after this many completion requests (0: never)")),
]

FAULT_FIELDS = ("kv_transfer_fail_rate", "kv_transfer_delay_ms", "prefill_error_rate", "error_rate",
                "prefill_stall_ms", "health_fail", "crash_after_requests")


def env_name(flag: str) -> str:
    name = flag.lstrip("-")
    if name.startswith("sim-"):
        name = name[4:]
    return ENV_PREFIX + name.upper().replace("-", "_")


class SimArgumentError(SystemExit):
    pass


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="disagg sim",
        description="Simulated vLLM worker (digital twin): `vllm serve`'s command line, OpenAI API, NIXL P/D "
        "protocol and vLLM metrics, timed by a roofline model. Sim flags also read DISAGG_SIM_<FLAG>.",
        allow_abbrev=False,
    )
    v = p.add_argument_group("vLLM serve flags")
    v.add_argument("model_tag", nargs="?", default=None, help="model name or path (or --model)")
    v.add_argument("--model", default=None)
    v.add_argument("--host", default=None)
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--served-model-name", nargs="+", default=None)
    v.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    v.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    v.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    v.add_argument("--max-model-len", type=human_readable_int, default=None)
    v.add_argument("--max-num-seqs", type=int, default=None)
    v.add_argument("--max-num-batched-tokens", type=human_readable_int, default=None)
    v.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    v.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    v.add_argument("--long-prefill-token-threshold", type=int, default=0)
    v.add_argument("--kv-transfer-config", type=_json_obj, default=None)
    v.add_argument("--shutdown-timeout", type=float, default=0.0)
    v.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    v.add_argument("--block-size", type=int, default=16)
    v.add_argument("--num-gpu-blocks-override", type=int, default=None)
    v.add_argument("--kv-cache-memory-bytes", type=human_readable_int, default=None)
    v.add_argument("--kv-cache-dtype", default="auto")
    v.add_argument("--dtype", default="auto")
    v.add_argument("--quantization", "-q", default=None)
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--enable-log-requests", action="store_true")
    v.add_argument("--disable-log-requests", action="store_true")
    v.add_argument("--uvicorn-log-level", default="info")
    s = p.add_argument_group("sim flags (env DISAGG_SIM_<FLAG>)")
    for flag, kw in SIM_FLAGS:
        s.add_argument(flag, **{**kw, "default": argparse.SUPPRESS})
    return p


_KNOWN_VALUE_FLAGS: set[str] | None = None
_KNOWN_FLAGS: set[str] | None = None


def _known_flags() -> tuple[set[str], set[str]]:
    global _KNOWN_VALUE_FLAGS, _KNOWN_FLAGS
    if _KNOWN_FLAGS is None:
        parser = build_parser()
        allf, valf = set(), set()
        for a in parser._actions:
            for o in a.option_strings:
                allf.add(o)
                if a.nargs != 0:
                    valf.add(o)
        _KNOWN_FLAGS, _KNOWN_VALUE_FLAGS = allf, valf
    return _KNOWN_FLAGS, _KNOWN_VALUE_FLAGS  # type: ignore[return-value]


_NUMBER = re.compile(r"^-\d")


def normalize_argv(argv: list[str]) -> tuple[list[str], dict[str, dict], list[str]]:
    """vLLM-style pre-processing. Returns (argv for argparse, dotted JSON args, ignored unknown flags)."""
    known, takes_value = _known_flags()
    argv = list(argv)
    if argv and argv[0] == "serve":
        argv = argv[1:]
    out: list[str] = []
    dotted: dict[str, dict] = {}
    ignored: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and len(arg) > 2:
            key, eq, value = arg.partition("=")
            head, dot, tail = key[2:].partition(".")
            key = "--" + head.replace("_", "-") + (dot + tail if dot else "")
            if dot:  # --kv-transfer-config.kv_role kv_producer
                if not eq:
                    if i + 1 >= len(argv):
                        raise SimArgumentError(f"disagg sim: error: argument {key}: expected a value")
                    value = argv[i + 1]
                    i += 1
                try:
                    parsed: Any = json.loads(value)
                except json.JSONDecodeError:
                    parsed = value
                target = dotted.setdefault("--" + head.replace("_", "-"), {})
                keys = tail.split(".")
                for k in keys[:-1]:
                    target = target.setdefault(k, {})
                target[keys[-1]] = parsed
                i += 1
                continue
            if key not in known:
                ignored.append(key)
                if not eq and key not in _VLLM_BOOL_FLAGS and i + 1 < len(argv) and (
                    not argv[i + 1].startswith("-") or _NUMBER.match(argv[i + 1])
                ):
                    i += 1
                i += 1
                continue
            out.append(key + ("=" + value if eq else ""))
        else:
            out.append(arg)
        i += 1
    return out, dotted, ignored


@dataclass
class Faults:
    kv_transfer_fail_rate: float = 0.0
    kv_transfer_delay_ms: float = 0.0
    prefill_error_rate: float = 0.0
    error_rate: float = 0.0
    prefill_stall_ms: float = 0.0
    health_fail: bool = False
    crash_after_requests: int = 0

    def update(self, data: dict[str, Any]) -> None:
        """Apply a partial update (admin endpoint); raises ValueError naming the bad field."""
        for k, v in data.items():
            if k not in FAULT_FIELDS:
                raise ValueError(f"unknown fault {k!r}; known: {', '.join(FAULT_FIELDS)}")
            cur = getattr(self, k)
            if isinstance(cur, bool):
                if not isinstance(v, bool):
                    raise ValueError(f"{k} must be a boolean")
            elif isinstance(cur, int) and not isinstance(cur, bool):
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise ValueError(f"{k} must be a non-negative integer")
            else:
                if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                    raise ValueError(f"{k} must be a non-negative number")
                if k.endswith("_rate") and v > 1:
                    raise ValueError(f"{k} must be between 0 and 1")
                v = float(v)
        for k, v in data.items():
            setattr(self, k, type(getattr(self, k))(v))

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in FAULT_FIELDS}


@dataclass
class KVTransfer:
    connector: str
    role: str  # kv_producer | kv_consumer | kv_both
    engine_id: str
    load_failure_policy: str  # recompute | fail
    lease_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def producer(self) -> bool:
        return self.role in ("kv_producer", "kv_both")

    @property
    def consumer(self) -> bool:
        return self.role in ("kv_consumer", "kv_both")


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

    @property
    def served_model_name(self) -> str:
        return self.served_model_names[0]


def _deep_merge(base: dict, update: dict) -> dict:
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = _deep_merge(dict(base[k]), v)
        else:
            base[k] = v
    return base


def _err(parser: argparse.ArgumentParser, msg: str) -> None:
    parser.error(msg)  # exits 2 with "disagg sim: error: ..."


def parse(argv: list[str], env: dict[str, str] | None = None) -> SimConfig:
    env = dict(os.environ) if env is None else env
    parser = build_parser()
    norm, dotted, ignored = normalize_argv(argv)
    ns = parser.parse_args(norm)

    # sim flags: CLI > env > default
    for flag, kw in SIM_FLAGS:
        dest = flag.lstrip("-").replace("-", "_")
        if hasattr(ns, dest):
            continue
        raw = env.get(env_name(flag))
        if raw is None or raw == "":
            setattr(ns, dest, kw.get("default"))
            continue
        conv = kw.get("type", str)
        try:
            setattr(ns, dest, conv(raw))
        except (ValueError, argparse.ArgumentTypeError) as e:
            _err(parser, f"environment {env_name(flag)} (for {flag}): invalid value {raw!r}: {e}")

    model = ns.model_tag or ns.model
    if ns.model_tag and ns.model and ns.model_tag != ns.model:
        _err(parser, f"argument --model: {ns.model!r} conflicts with the positional model {ns.model_tag!r}")
    if not model:
        _err(parser, "the model is required (positional or --model)")

    for key, value in dotted.items():
        if key != "--kv-transfer-config":
            ignored.append(key + ".*")
            continue
        ns.kv_transfer_config = _deep_merge(dict(ns.kv_transfer_config or {}), value)

    try:
        gpu = presets.get_gpu(ns.gpu)
    except presets.PresetError as e:
        _err(parser, f"argument --gpu: {e}")
    inferred = False
    if ns.model_preset:
        try:
            mp = presets.get_model(ns.model_preset)
        except presets.PresetError as e:
            _err(parser, f"argument --model-preset: {e}")
    else:
        mp = presets.infer_model(model)
        inferred = mp is not None
        mp = mp or presets.MODELS[presets.DEFAULT_MODEL]
    try:
        transport = presets.resolve_transport(ns.kv_transport, env)
    except presets.PresetError as e:
        _err(parser, f"argument --kv-transport: {e}")

    tp, pp = ns.tensor_parallel_size, ns.pipeline_parallel_size
    if tp < 1:
        _err(parser, "argument --tensor-parallel-size/-tp: must be >= 1")
    if pp < 1:
        _err(parser, "argument --pipeline-parallel-size/-pp: must be >= 1")
    if mp.layers % pp:
        _err(parser, f"argument --pipeline-parallel-size/-pp: {mp.name} has {mp.layers} layers, "
                     f"not divisible by {pp}")
    if ns.data_parallel_size < 1:
        _err(parser, "argument --data-parallel-size/-dp: must be >= 1")
    if not 0 < ns.gpu_memory_utilization <= 1:
        _err(parser, "argument --gpu-memory-utilization: must be in (0, 1]")
    if ns.num_gpu_blocks_override is not None and ns.num_gpu_blocks_override < 1:
        _err(parser, "argument --num-gpu-blocks-override: must be >= 1")
    if ns.block_size not in (1, 8, 16, 32, 64, 128, 256):
        _err(parser, "argument --block-size: must be one of 1, 8, 16, 32, 64, 128, 256")
    if ns.kv_cache_dtype not in ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"):
        _err(parser, f"argument --kv-cache-dtype: invalid choice {ns.kv_cache_dtype!r}")

    max_model_len = ns.max_model_len or mp.max_position
    if max_model_len < 1:
        _err(parser, "argument --max-model-len: must be >= 1")
    chunked = True if ns.enable_chunked_prefill is None else ns.enable_chunked_prefill
    prefix = True if ns.enable_prefix_caching is None else ns.enable_prefix_caching
    # vLLM's defaults (EngineArgs.get_batch_defaults, OPENAI_API_SERVER context)
    big = gpu.memory_bytes >= 70 * presets.GiB and "a100" not in gpu.name.lower()
    max_num_seqs = ns.max_num_seqs
    mnbt = ns.max_num_batched_tokens
    if mnbt is None:
        mnbt = 8192 if big else 2048
        if not chunked:
            mnbt = max(max_model_len, mnbt)
        mnbt = min((max_num_seqs or (1024 if big else 256)) * max_model_len, mnbt)
    if max_num_seqs is None:
        max_num_seqs = min(1024 if big else 256, mnbt)
    if max_num_seqs < 1:
        _err(parser, "argument --max-num-seqs: must be >= 1")
    if mnbt < 1:
        _err(parser, "argument --max-num-batched-tokens: must be >= 1")
    if not chunked and mnbt < max_model_len:
        _err(parser, f"argument --max-num-batched-tokens: ({mnbt}) is smaller than max_model_len ({max_model_len}) "
                     "with chunked prefill disabled, so requests longer than it could never be scheduled; "
                     "raise it or --enable-chunked-prefill")

    kvt = None
    if ns.kv_transfer_config:
        cfg = ns.kv_transfer_config
        connector = cfg.get("kv_connector")
        role = cfg.get("kv_role")
        if connector is not None and role is None:
            _err(parser, "argument --kv-transfer-config: kv_role is required when kv_connector is set "
                         "(kv_producer, kv_consumer, kv_both)")
        if role is not None and role not in ("kv_producer", "kv_consumer", "kv_both"):
            _err(parser, f"argument --kv-transfer-config: Unsupported kv_role: {role}. Supported roles are "
                         "('kv_producer', 'kv_consumer', 'kv_both')")
        policy = cfg.get("kv_load_failure_policy", "fail")
        if policy not in ("recompute", "fail"):
            _err(parser, f"argument --kv-transfer-config: kv_load_failure_policy must be 'recompute' or 'fail', "
                         f"got {policy!r}")
        extra = cfg.get("kv_connector_extra_config") or {}
        if not isinstance(extra, dict):
            _err(parser, "argument --kv-transfer-config: kv_connector_extra_config must be an object")
        if connector is not None:
            if connector not in ("NixlConnector",):
                ignored.append(f"--kv-transfer-config kv_connector={connector} (only NixlConnector is simulated)")
            else:
                lease = extra.get("kv_lease_duration")
                if lease is None:
                    lease = float(env.get("VLLM_NIXL_ABORT_REQUEST_TIMEOUT", "480"))
                import uuid

                kvt = KVTransfer(connector, role, str(cfg.get("engine_id") or uuid.uuid4()), policy,
                                 float(lease), extra)

    try:
        sc_port = int(env.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600"))
    except ValueError:
        _err(parser, "environment VLLM_NIXL_SIDE_CHANNEL_PORT: not an integer")

    faults = Faults(
        kv_transfer_fail_rate=ns.fault_kv_transfer_fail_rate,
        kv_transfer_delay_ms=ns.fault_kv_transfer_delay_ms,
        prefill_error_rate=ns.fault_prefill_error_rate,
        error_rate=ns.fault_error_rate,
        prefill_stall_ms=ns.fault_prefill_stall_ms,
        health_fail=bool(ns.fault_health_fail),
        crash_after_requests=ns.fault_crash_after_requests,
    )
    if ns.sim_output_tokens < 1:
        _err(parser, "argument --sim-output-tokens: must be >= 1")
    return SimConfig(
        model=model,
        served_model_names=ns.served_model_name or [model],
        host=ns.host,
        port=ns.port,
        tp=tp,
        pp=pp,
        dp=ns.data_parallel_size,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=mnbt,
        chunked_prefill=chunked,
        prefix_caching=prefix,
        long_prefill_token_threshold=ns.long_prefill_token_threshold,
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
        gpu=gpu,
        model_preset=mp,
        model_preset_inferred=inferred,
        time_scale=ns.time_scale,
        transport=transport,
        kv_payload_scale=ns.kv_payload_scale,
        output_tokens=ns.sim_output_tokens,
        vllm_version=ns.sim_vllm_version,
        load_seconds=ns.sim_load_seconds,
        faults=faults,
        ignored_flags=ignored,
        num_gpu_blocks_override=ns.num_gpu_blocks_override,
        kv_cache_memory_bytes=ns.kv_cache_memory_bytes,
        max_model_len_explicit=ns.max_model_len is not None,
    )

