"""The `vllm serve` flags the operator owns, and how vLLM reads an option token: one table for the apiserver's CEL
rule over ``extraArgs`` (rules.py), the operator's own check (``extra_args_errors`` below, run by semantics.py) and
the compatibility hash (builders/workers.py ``kv_layout_args``).
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
    # the router sends tenant priorities exactly when the operator renders the priority scheduler
    "--scheduling-policy": "spec.routing.tenants[].priority (a tenant below Interactive turns on vLLM's priority "
                           "scheduler)",
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
    to the operator's check (``extra_args_errors`` below), which reads every spelling."""
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


# ------------------------------------------------------------------------------------ the operator's check


def _reserved(name: str) -> tuple[str, bool] | None:
    """``(reserved long flag, abbreviated)`` when vLLM would read option ``name`` as a flag the operator owns.

    argparse (``allow_abbrev``, which vLLM leaves on) also takes an unambiguous prefix of an option for the option:
    ``--tensor-parallel 4`` is ``--tensor-parallel-size 4``, ``-t 4`` is ``-tp 4``. A prefix of a reserved flag is
    refused whether or not it is ambiguous (an ambiguous one would only fail at startup). No option of vLLM 0.33.0
    that the operator does not own is a strict prefix of a reserved flag (checked against the option strings of
    vllm/engine/arg_utils.py and vllm/entrypoints/common/cli_args.py), so no such option is refused.
    """
    if name in RESERVED_FLAGS:
        return name, False
    if name in RESERVED_SHORT_FLAGS:
        return RESERVED_SHORT_FLAGS[name], False
    if name.startswith("--") and len(name) > 2:
        longs = sorted(f for f in RESERVED_FLAGS if f.startswith(name))
        if longs:
            return longs[0], True
    elif len(name) > 1 and name[1] != "-":
        shorts = sorted(f for f in RESERVED_SHORT_FLAGS if f.startswith(name))
        if shorts:
            return RESERVED_SHORT_FLAGS[shorts[0]], True
    return None


def extra_args_errors(field: str, args: list[str]) -> list[str]:
    """Every item of an extraArgs list (``field``: ``spec.engine.extraArgs`` or ``spec.<pool>.extraArgs``) that sets
    a flag the operator owns, in any spelling vLLM accepts, or that vLLM could not read as one option."""
    return [error for _, error in extra_args_item_errors(field, args)]


def extra_args_item_errors(field: str, args: list[str]) -> list[tuple[int, str]]:
    """``extra_args_errors`` with the index of the item each error is about."""
    pool = field.split(".")[1] if field.count(".") == 2 and not field.startswith("spec.engine.") else "<pool>"
    out: list[tuple[int, str]] = []
    for i, arg in enumerate(args):
        option = option_name(arg)
        if option is None:
            continue
        written, name = option
        if any(ch.isspace() for ch in written):
            out.append((i,
                f"{field}[{i}]: {arg!r} is one argument to vLLM, which cannot read it as an option; write the flag "
                "and its value as two items, or as --flag=value"
            ))
            continue
        reserved = _reserved(name)
        if reserved is None:
            continue
        flag, abbreviated = reserved
        reads = f" (an abbreviation of {flag})" if abbreviated else ""
        source = RESERVED_FLAGS[flag].replace("<pool>", pool)
        owner = f"is set by the operator from {source}" if source.startswith("spec.") else (
            f"is owned by the operator: {source}")
        out.append((i, f"{field}[{i}]: {written}{reads} {owner}; remove it"))
    return out


# ------------------------------------------------------------------------------------- multi-node ranks

# The flags of a rank that the operator renders for a multi-node pool (vllm_versions.MULTI_NODE), with where it takes
# them from, and their short aliases (vllm/engine/arg_utils.py 0.33.0 lines 1177-1178, 1244-1306). Refused in the
# extraArgs of such a pool by the operator (``rank_flag_errors``), in every spelling vLLM reads: not by the CRD's CEL
# rule over extraArgs (above), whose pattern with these flags exceeds the apiserver's CEL cost budget.
RANK_FLAGS: dict[str, str] = {
    "--data-parallel-start-rank": "spec.<pool>.nodesPerReplica (each node's first data-parallel rank)",
    "--data-parallel-address": "spec.<pool>.nodesPerReplica (the address of the replica's leader)",
    "--data-parallel-rpc-port": "spec.multiNode.dataParallelRpcPort",
    "--nnodes": "spec.<pool>.nodesPerReplica",
    "--node-rank": "spec.<pool>.nodesPerReplica (each pod's rank in its replica)",
    "--master-addr": "spec.<pool>.nodesPerReplica (the address of the replica's leader)",
    "--master-port": "spec.multiNode.masterPort",
    "--enable-expert-parallel": "spec.<pool>.parallelism.expert",
    "--data-parallel-rank": "the replica's leader balances its ranks (vLLM's internal load balancing)",
    "--data-parallel-hybrid-lb": "the replica's leader balances its ranks (vLLM's internal load balancing)",
    "--data-parallel-external-lb": "the replica's leader balances its ranks (vLLM's internal load balancing)",
}
RANK_SHORT_FLAGS: dict[str, str] = {
    "-dpr": "--data-parallel-start-rank", "-dpa": "--data-parallel-address", "-dpp": "--data-parallel-rpc-port",
    "-n": "--nnodes", "-r": "--node-rank", "-ep": "--enable-expert-parallel", "-dpn": "--data-parallel-rank",
    "-dph": "--data-parallel-hybrid-lb", "-dpe": "--data-parallel-external-lb",
}


def rank_flag(name: str) -> str | None:
    """The rank flag vLLM reads option ``name`` as: itself, a short alias, or an abbreviation (argparse's
    allow_abbrev) of one; None otherwise."""
    if name in RANK_FLAGS:
        return name
    if name in RANK_SHORT_FLAGS:
        return RANK_SHORT_FLAGS[name]
    if name.startswith("--") and len(name) > 2:
        longs = sorted(f for f in RANK_FLAGS if f.startswith(name))
        return longs[0] if longs else None
    return None


def rank_flag_item_errors(field: str, args: list[str], role: str, nodes: int) -> list[tuple[int, str]]:
    """Every item of an extraArgs list (``field``) that sets a flag the operator renders for the ranks of multi-node
    pool ``role`` (``nodes`` nodes per replica), with its index."""
    out: list[tuple[int, str]] = []
    for i, arg in enumerate(args):
        option = option_name(arg)
        flag = rank_flag(option[1]) if option else None
        if option and flag:
            source = RANK_FLAGS[flag].replace("<pool>", role)
            owner = (f"is set by the operator from {source}" if source.startswith("spec.")
                     else f"is owned by the operator: {source}")
            reads = f" (vLLM reads it as {flag})" if option[1] != flag else ""
            out.append((i, f"{field}[{i}]: {option[0]}{reads} {owner} in a pool whose replicas span "
                           f"spec.{role}.nodesPerReplica {nodes} nodes; remove it"))
    return out
