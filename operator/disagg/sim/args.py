"""``disagg sim``'s command line: ``vllm serve``'s flags (those the operator renders), the sim flags and the fault
flags, and vLLM's FlexibleArgumentParser pre-processing.

Every sim and fault flag can also come from ``DISAGG_SIM_<NAME>`` (flag without ``--``/``sim-``, upper case,
``-`` → ``_``); an explicit flag wins over the environment (:func:`apply_env`).

Parsing follows vLLM's FlexibleArgumentParser where it matters: ``--flag=value``, underscores in flag names
(``--max_model_len``), human-readable ints (``32k``), dotted JSON keys (``--kv-transfer-config.kv_role
kv_producer``), the model as positional or ``--model``. Unknown ``--flag [value]`` is accepted with a warning.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping
from typing import Any, NoReturn

from ..perf import presets
from ..vllm_versions import DEFAULT_VERSION, OLDEST_CHECKED, fmt, parse_version
from .faults import FAULTS, FaultSpec

ENV_PREFIX = "DISAGG_SIM_"
# The vLLM release the twin mimics by default (CLI, metric names, KV-transfer behaviour, error shapes): the operator's
# default release, from the version table (disagg.vllm_versions). --emulate-version picks another one.
VLLM_VERSION = fmt(DEFAULT_VERSION)

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
    "--return-tokens-as-token-ids", "--disable-cascade-attn", "--enable-reasoning", "--enable-per-request-metrics",
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


def _vllm_release(value: str) -> str:
    v = parse_version(value)
    if v is None:
        raise argparse.ArgumentTypeError(f"not a vLLM release number (MAJOR.MINOR.PATCH, e.g. {VLLM_VERSION})")
    if v < OLDEST_CHECKED or v > DEFAULT_VERSION:
        raise argparse.ArgumentTypeError(f"the version table covers vLLM {fmt(OLDEST_CHECKED)} to {VLLM_VERSION}")
    return fmt(v)


def _json_obj(value: str) -> dict[str, Any]:
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return obj


# (flag, kwargs) of the sim flags; dest is derived by argparse. Env: DISAGG_SIM_<NAME>. The fault flags follow,
# one per row of the fault table (disagg.sim.faults), with dest ``fault_<name>``.
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
    ("--emulate-version", dict(type=_vllm_release, default=VLLM_VERSION,
                               help="vLLM release to emulate (flags, kv-transfer-config keys, KV-load-failure "
                                    "and lease behaviour, metric names), from the operator's version table")),
    ("--sim-vllm-version", dict(default=None,
                                help="engine version advertised in /version and the NIXL handshake (mismatch → "
                                     "refused); default: the emulated release")),
    ("--sim-load-seconds", dict(type=_non_negative_float, default=0.0,
                                help="simulated model-loading time before the HTTP port opens")),
    ("--sim-efficiency", dict(type=_json_obj, default=None,
                              help="the engine's costs in place of the GPU preset's, as a JSON object of "
                                   "disagg.perf.roofline.Efficiency fields (step_overhead_s, request_overhead_s, "
                                   "…) and bf16_flops: an engine fitted on measurements (disagg bench "
                                   "real-engine)")),
]


def _fault_flag(spec: FaultSpec) -> tuple[str, dict[str, Any]]:
    help_text = f"{spec.help} [{spec.kind.values}]"
    return spec.flag, {"type": spec.kind.from_text, "default": spec.default, "help": help_text}


SIM_FLAGS.extend(_fault_flag(spec) for spec in FAULTS)


def env_name(flag: str) -> str:
    name = flag.lstrip("-")
    if name.startswith("sim-"):
        name = name[4:]
    return ENV_PREFIX + name.upper().replace("-", "_")


def flag_dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


class SimArgumentError(SystemExit):
    pass


def _add_vllm_flags(v: argparse._ArgumentGroup) -> None:
    """The ``vllm serve`` flags the sim honours (names, short forms and value types as vLLM's)."""
    v.add_argument("model_tag", nargs="?", default=None, help="model name or path (or --model)")
    v.add_argument("--model", default=None)
    v.add_argument("--host", default=None)
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--served-model-name", nargs="+", default=None)
    v.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    v.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    v.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    _add_multinode_flags(v)
    v.add_argument("--max-model-len", type=human_readable_int, default=None)
    v.add_argument("--max-num-seqs", type=int, default=None)
    v.add_argument("--max-num-batched-tokens", type=human_readable_int, default=None)
    v.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    v.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    v.add_argument("--long-prefill-token-threshold", type=int, default=0)
    # vLLM SchedulerConfig.policy (vllm/config/scheduler.py SchedulerPolicy, 0.33.0): fcfs | priority
    v.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default="fcfs")
    v.add_argument("--kv-transfer-config", type=_json_obj, default=None)
    # vLLM's KVEventsConfig (vllm/config/kv_events.py, 0.33.0): KV cache events over ZMQ (sim/kvevents.py)
    v.add_argument("--kv-events-config", type=_json_obj, default=None)
    # vllm/entrypoints/common/cli_args.py (0.33.0) enable_prompt_tokens_details: usage.prompt_tokens_details
    v.add_argument("--enable-prompt-tokens-details", action="store_true")
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
    # tracing (vLLM 0.33.0 vllm/engine/arg_utils.py ObservabilityConfig; citations in disagg/tracing.py): the sim emits
    # vLLM's llm_request span to this OTLP endpoint, and per-request metrics on the final response like vLLM
    v.add_argument("--otlp-traces-endpoint", default=None)
    v.add_argument("--collect-detailed-traces", default=None)
    v.add_argument("--enable-per-request-metrics", action="store_true")


def _add_multinode_flags(v: argparse._ArgumentGroup) -> None:
    """The flags of a replica spanning several nodes, as vLLM 0.33.0 names them (vllm/engine/arg_utils.py lines
    1175-1178 and 1241-1307; vllm/entrypoints/common/cli_args.py line 445; the version table's MULTI_NODE).
    disagg.sim.group reads them: the leader serves, ``--headless`` workers join it (docs/simulator.md)."""
    v.add_argument("--data-parallel-size-local", "-dpl", type=int, default=None)
    v.add_argument("--data-parallel-start-rank", "-dpr", type=int, default=None)
    v.add_argument("--data-parallel-address", "-dpa", default=None)
    v.add_argument("--data-parallel-rpc-port", "-dpp", type=int, default=None)
    v.add_argument("--headless", action="store_true")
    v.add_argument("--nnodes", "-n", type=int, default=1)
    v.add_argument("--node-rank", "-r", type=int, default=0)
    v.add_argument("--master-addr", default=None)
    v.add_argument("--master-port", type=int, default=None)
    v.add_argument("--enable-expert-parallel", "-ep", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="disagg sim",
        description="The simulator, a simulated vLLM worker: `vllm serve`'s command line, OpenAI API, NIXL P/D "
        "protocol and vLLM metrics, timed by a roofline model. Sim flags also read DISAGG_SIM_<FLAG>.",
        allow_abbrev=False,
    )
    _add_vllm_flags(p.add_argument_group("vLLM serve flags"))
    s = p.add_argument_group("sim flags (env DISAGG_SIM_<FLAG>)")
    for flag, kw in SIM_FLAGS:
        s.add_argument(flag, **{**kw, "default": argparse.SUPPRESS})
    return p


def _known_flags(parser: argparse.ArgumentParser) -> tuple[set[str], set[str]]:
    """(every option string, those that take a value)."""
    every: set[str] = set()
    valued: set[str] = set()
    for a in parser._actions:  # noqa: SLF001 - argparse has no public list of its actions
        for o in a.option_strings:
            every.add(o)
            if a.nargs != 0:
                valued.add(o)
    return every, valued


_NUMBER = re.compile(r"^-\d")


def _set_dotted(dotted: dict[str, dict[str, Any]], head: str, tail: str, value: str) -> None:
    """``--kv-transfer-config.a.b value`` → dotted["--kv-transfer-config"]["a"]["b"] = JSON value (or the text)."""
    try:
        parsed: Any = json.loads(value)
    except json.JSONDecodeError:
        parsed = value
    target = dotted.setdefault("--" + head.replace("_", "-"), {})
    keys = tail.split(".")
    for k in keys[:-1]:
        target = target.setdefault(k, {})
    target[keys[-1]] = parsed


def normalize_argv(argv: list[str], parser: argparse.ArgumentParser | None = None,
                   ) -> tuple[list[str], dict[str, dict[str, Any]], list[str]]:
    """vLLM-style pre-processing. Returns (argv for argparse, dotted JSON args, ignored unknown flags)."""
    known, _ = _known_flags(parser or build_parser())
    argv = list(argv)
    if argv and argv[0] == "serve":
        argv = argv[1:]
    out: list[str] = []
    dotted: dict[str, dict[str, Any]] = {}
    ignored: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not (arg.startswith("--") and len(arg) > 2):
            out.append(arg)
            i += 1
            continue
        key, eq, value = arg.partition("=")
        head, dot, tail = key[2:].partition(".")
        key = "--" + head.replace("_", "-") + (dot + tail if dot else "")
        if dot:  # --kv-transfer-config.kv_role kv_producer
            if not eq:
                if i + 1 >= len(argv):
                    raise SimArgumentError(f"disagg sim: error: argument {key}: expected a value")
                value = argv[i + 1]
                i += 1
            _set_dotted(dotted, head, tail, value)
        elif key not in known:
            ignored.append(key)
            if not eq and key not in _VLLM_BOOL_FLAGS and i + 1 < len(argv) and (
                not argv[i + 1].startswith("-") or _NUMBER.match(argv[i + 1])
            ):
                i += 1
        else:
            out.append(key + ("=" + value if eq else ""))
        i += 1
    return out, dotted, ignored


def fail(parser: argparse.ArgumentParser, msg: str) -> NoReturn:
    parser.error(msg)  # exits 2 with "disagg sim: error: ..."


def apply_env(ns: argparse.Namespace, env: Mapping[str, str], parser: argparse.ArgumentParser) -> None:
    """Sim and fault flags: CLI > ``DISAGG_SIM_<NAME>`` > default."""
    for flag, kw in SIM_FLAGS:
        dest = flag_dest(flag)
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
            fail(parser, f"environment {env_name(flag)} (for {flag}): invalid value {raw!r}: {e}")
