"""The `vllm serve` flags the operator owns, and how vLLM reads an option token: one table for the apiserver's CEL
rule over ``extraArgs`` (rules.py), the operator's own check (builders/workers.py ``extra_args_errors``) and the
compatibility hash (builders/workers.py ``kv_layout_args``).
"""

from __future__ import annotations

import re

# Flags the operator renders or depends on; refused in extraArgs (engine-level and per pool) so that the spec stays
# the one source, in every spelling `vllm serve` accepts. Keys are canonical long flags; values say where the
# operator takes the setting from ("spec.…"; <pool> is the pool whose extraArgs carry the flag), or why it owns it.
RESERVED_FLAGS: dict[str, str] = {
    "--model": "spec.model (the positional model argument)",
    "--served-model-name": "spec.model.servedName",
    "--port": "spec.engine.port",
    "--host": "vLLM must listen on every interface of the pod for the Service, the router and the probes",
    "--uds": "the router and the probes reach vLLM over TCP on spec.engine.port",
    "--grpc": "the router and the probes speak HTTP to spec.engine.port",
    "--headless": "a headless vLLM serves no HTTP API, so the pool would never become ready",
    "--config": "a config file can set the flags the operator owns (write its other flags in extraArgs)",
    "--kv-transfer-config": "spec.kvTransfer",
    "--tensor-parallel-size": "spec.<pool>.parallelism.tensor",
    "--pipeline-parallel-size": "spec.<pool>.parallelism.pipeline",
    "--data-parallel-size": "spec.<pool>.parallelism.data",
    "--data-parallel-size-local": "spec.<pool>.parallelism.data",
    "--shutdown-timeout": "spec.engine.shutdownTimeoutSeconds",
}
# vLLM's short aliases of reserved flags (vllm 0.33.0, vllm/engine/arg_utils.py, EngineArgs.add_cli_args:
# `"--tensor-parallel-size", "-tp"`, `"--pipeline-parallel-size", "-pp"`, `"--data-parallel-size", "-dp"`,
# `"--data-parallel-size-local", "-dpl"`).
RESERVED_SHORT_FLAGS: dict[str, str] = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
    "-dpl": "--data-parallel-size-local",
}


def option_name(token: str) -> tuple[str, str] | None:
    """``(as written, as vLLM reads it)`` for an option token of ``vllm serve``, None for a value or positional.

    Mirrors ``FlexibleArgumentParser.parse_args`` in vllm/utils/argparse_utils.py (read in the 0.33.0 and 0.11.2
    wheels, which agree on all of this), applied before argparse sees the arguments: ``--flag=value`` is split at
    the first ``=``; in a ``--`` option, underscores between ``--`` and the first ``.`` become dashes
    (``--tensor_parallel_size``); ``--flag.key.sub[+] value`` and ``-x.key=value`` (dotted sub-keys, ``+`` appends to
    a list) are merged into ``--flag '{"key": …}'``, appended *after* every other argument, so a sub-key overrides
    the JSON the operator rendered. The name vLLM reads is the part before the first dot. Tokens that argparse takes
    for values: not starting with ``-``, ``-`` alone, ``--`` alone, negative numbers.
    """
    if not token.startswith("-") or token in ("-", "--") or _negative_number(token):
        return None
    written = token.split("=", 1)[0]
    name = written.split(".", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return written, name


def _negative_number(token: str) -> bool:
    """argparse's ``^-\\d+$|^-\\d*\\.\\d+$`` (a value, not an option, in a parser without numeric options)."""
    whole, dot, frac = token[1:].partition(".")
    return (whole.isdigit() and not dot) or (frac.isdigit() and (whole == "" or whole.isdigit()))


def _reserved_pattern() -> str:
    """An RE2 (and Python) pattern matching an extraArgs item that sets a reserved flag by its full name: the
    canonical long name with dashes or underscores, or a short alias, alone, as ``--flag=value`` or with dotted
    sub-keys (``--kv-transfer-config.kv_role=…``). argparse's abbreviations (``--tensor-parallel``, ``-t``) are left
    to the operator's check (``extra_args_errors``), which reads every spelling."""
    longs = "|".join(f[2:].replace("-", "[-_]") for f in RESERVED_FLAGS)
    shorts = "|".join(sorted((s[1:] for s in RESERVED_SHORT_FLAGS), key=lambda s: (-len(s), s)))
    return rf"^(--({longs})|-({shorts}))([.=].*)?$"


RESERVED_ARG_PATTERN = _reserved_pattern()
"""The pattern in the CRD's CEL rule over extraArgs (rules.py), generated from the table above."""
# RE2's $ (no multiline) matches only at the end of the text, Python's also before a final newline; in both, `.`
# does not match a newline.
_RESERVED_ARG = re.compile(RESERVED_ARG_PATTERN.removesuffix("$") + r"\Z")


def sets_reserved_flag(arg: str) -> bool:
    """Whether ``arg`` matches ``RESERVED_ARG_PATTERN`` as the apiserver's CEL ``matches`` does."""
    return _RESERVED_ARG.match(arg) is not None
