"""extraArgs cannot reach a flag the operator owns, in any spelling `vllm serve` accepts.

The spellings are those of vLLM's FlexibleArgumentParser (vllm/utils/argparse_utils.py, read in the 0.33.0 and
0.11.2 wheels): ``--flag=value``, underscores for dashes, dotted sub-keys of JSON flags (appended after every other
argument, so ``--kv-transfer-config.kv_role=kv_consumer`` replaces the operator's whole config), argparse's short
aliases (``-tp``) and unambiguous prefixes (``--tensor-parallel``, ``-t``).
"""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from disagg.api import rules
from disagg.api.flags import extra_args_errors, sets_reserved_flag
from disagg.builders import parse_model, worker_args
from disagg.builders.workers import RESERVED_FLAGS, RESERVED_SHORT_FLAGS
from disagg.controller.reconcile import Reconciler

from .conftest import example_body, model, refused

# (extraArgs, index of the refused item, flag as the message names it, source the message names for spec.prefill)
REFUSED: list[tuple[list[str], int, str, str]] = [
    (["--enforce-eager", "--max-num-seqs=8", "--kv-transfer-config.kv_role=kv_consumer"], 2,
     "--kv-transfer-config.kv_role", "spec.kvTransfer"),
    (["--kv_transfer_config.kv_role", "kv_consumer"], 0, "--kv_transfer_config.kv_role", "spec.kvTransfer"),
    (["--kv-transfer-config.kv_connector_extra_config.backends+", "UCX,GDS"], 0,
     "--kv-transfer-config.kv_connector_extra_config.backends+", "spec.kvTransfer"),
    (["--kv-transfer-config={}"], 0, "--kv-transfer-config", "spec.kvTransfer"),
    (["--tensor_parallel_size", "4"], 0, "--tensor_parallel_size", "spec.prefill.parallelism.tensor"),
    (["--tensor-parallel-size=4"], 0, "--tensor-parallel-size", "spec.prefill.parallelism.tensor"),
    (["-tp", "4"], 0, "-tp", "spec.prefill.parallelism.tensor"),
    (["-tp=4"], 0, "-tp", "spec.prefill.parallelism.tensor"),
    (["--tensor-parallel", "4"], 0, "--tensor-parallel (an abbreviation of --tensor-parallel-size)",
     "spec.prefill.parallelism.tensor"),
    (["-t", "4"], 0, "-t (an abbreviation of --tensor-parallel-size)", "spec.prefill.parallelism.tensor"),
    (["-pp", "2"], 0, "-pp", "spec.prefill.parallelism.pipeline"),
    (["--pipeline_parallel_size=2"], 0, "--pipeline_parallel_size", "spec.prefill.parallelism.pipeline"),
    (["-dp", "2"], 0, "-dp", "spec.prefill.parallelism.data"),
    (["--data-parallel-size-local", "2"], 0, "--data-parallel-size-local", "spec.prefill.parallelism.data"),
    (["-dpl=2"], 0, "-dpl", "spec.prefill.parallelism.data"),
    (["--port", "9000"], 0, "--port", "spec.engine.port"),
    (["--served_model_name=x"], 0, "--served_model_name", "spec.model.servedName"),
    (["--model", "other/model"], 0, "--model", "spec.model (the positional model argument)"),
    (["--shutdown-timeout", "0"], 0, "--shutdown-timeout", "spec.engine.shutdownTimeoutSeconds"),
    (["--shutdown_timeout=5"], 0, "--shutdown_timeout", "spec.engine.shutdownTimeoutSeconds"),
]

# argparse reads these as values or as options the operator does not own
ALLOWED = [
    "--enforce-eager", "--max-num-seqs=8", "--max_num_batched_tokens", "8192", "-q", "fp8", "-O3",
    "--compilation-config.cudagraph_mode=PIECEWISE", "-cc.level=3", "--config-format", "hf",
    "--data-parallel-rank", "0", "--override-generation-config", '{"temperature": -0.5}', "-1", "-0.5",
    "--", "--chat-template={{ messages }}",
]


@pytest.mark.parametrize("args,index,flag,source", REFUSED, ids=[" ".join(r[0]) for r in REFUSED])
def test_every_spelling_of_an_owned_flag_is_refused_naming_pool_and_flag(args, index, flag, source) -> None:
    errors = extra_args_errors("spec.prefill.extraArgs", args)
    assert errors == [f"spec.prefill.extraArgs[{index}]: {flag} is set by the operator from {source}; remove it"]


def test_the_issue_example_is_worded_exactly() -> None:
    args = ["--enforce-eager", "--max-num-seqs=8", "--kv-transfer-config.kv_role=kv_consumer"]
    assert extra_args_errors("spec.prefill.extraArgs", args) == [
        "spec.prefill.extraArgs[2]: --kv-transfer-config.kv_role is set by the operator from spec.kvTransfer; "
        "remove it"]


@pytest.mark.parametrize("flag", ["--host", "--uds", "--grpc", "--headless", "--config"])
def test_flags_the_operator_depends_on_are_refused_with_the_reason(flag: str) -> None:
    [error] = extra_args_errors("spec.decode.extraArgs", ["--enforce-eager", f"{flag}=x"])
    assert error.startswith(f"spec.decode.extraArgs[1]: {flag} is owned by the operator: ")
    assert error.endswith("; remove it")
    assert RESERVED_FLAGS[flag] in error


def test_engine_level_args_name_every_pool() -> None:
    assert extra_args_errors("spec.engine.extraArgs", ["-tp", "2"]) == [
        "spec.engine.extraArgs[0]: -tp is set by the operator from spec.<pool>.parallelism.tensor; remove it"]
    assert extra_args_errors("spec.aggregated.extraArgs", ["--tensor_parallel_size=2"]) == [
        "spec.aggregated.extraArgs[0]: --tensor_parallel_size is set by the operator from "
        "spec.aggregated.parallelism.tensor; remove it"]


def test_args_the_operator_does_not_own_pass() -> None:
    assert extra_args_errors("spec.prefill.extraArgs", ALLOWED) == []
    assert refused(model(prefill={"extraArgs": ALLOWED})) == ""  # the operator's whole check


def test_every_short_alias_maps_to_a_reserved_flag() -> None:
    assert set(RESERVED_SHORT_FLAGS.values()) <= set(RESERVED_FLAGS)


def test_a_flag_and_value_in_one_item_is_refused() -> None:
    [error] = extra_args_errors("spec.decode.extraArgs", ["--max-num-seqs 8"])
    assert error.startswith("spec.decode.extraArgs[0]: '--max-num-seqs 8' is one argument to vLLM")
    assert extra_args_errors("spec.decode.extraArgs", ["--max-num-seqs=8 "]) == []  # int(" 8 ") parses


def test_the_refusal_lists_every_refused_item(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rules, "RULES", ())  # (a model stored before the CRD's rule existed)
    dm = model(prefill={"extraArgs": ["-tp", "4", "--enforce-eager", "--port=1", "--kv_transfer_config.x=1"]})
    assert refused(dm).split("; remove it; ") == [
        "spec.prefill.extraArgs[0]: -tp is set by the operator from spec.prefill.parallelism.tensor",
        "spec.prefill.extraArgs[3]: --port is set by the operator from spec.engine.port",
        "spec.prefill.extraArgs[4]: --kv_transfer_config.x is set by the operator from spec.kvTransfer; remove it",
    ]


@pytest.mark.parametrize("where", ["engine", "prefill", "decode", "aggregated"])
def test_the_dotted_kv_role_is_refused_in_every_list(where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    body = example_body("llama-8b-nvlink")
    body["spec"]["aggregated"] = {"replicas": 1}
    body["spec"].setdefault(where, {})["extraArgs"] = ["--kv-transfer-config.kv_role=kv_consumer"]
    # at admission: the CRD's CEL rule, which parse_model applies as the apiserver does
    with pytest.raises(ValidationError, match=rf"spec\.{where}\.extraArgs: extraArgs must not set a flag"):
        parse_model(body)
    # and by the operator's own check, for a model stored before the rule existed
    monkeypatch.setattr(rules, "RULES", ())
    dm = parse_model(body)
    assert re.search(rf"^spec\.{where}\.extraArgs\[0\]: --kv-transfer-config\.kv_role is set", refused(dm))


@pytest.mark.parametrize("arg", [a for args, *_ in REFUSED for a in args if extra_args_errors("f.x.y", [a])])
def test_the_cel_pattern_refuses_only_what_the_operator_refuses(arg: str) -> None:
    """The CEL rule's pattern (api/flags.py) is the operator's check restricted to full names: whatever it refuses,
    extra_args_errors refuses; what it lets through are argparse's abbreviations."""
    if sets_reserved_flag(arg):
        assert extra_args_errors("spec.prefill.extraArgs", [arg])
    else:
        assert "(an abbreviation of" in extra_args_errors("spec.prefill.extraArgs", [arg])[0]


def test_the_cel_pattern_follows_the_table() -> None:
    for flag in RESERVED_FLAGS:
        for spelling in (flag, f"{flag}=1", f"{flag}.key=1", "--" + flag[2:].replace("-", "_"), f"{flag}.a.b+"):
            assert sets_reserved_flag(spelling), spelling
        assert not sets_reserved_flag(flag + "x") and not sets_reserved_flag(flag[:-1])
    for short in RESERVED_SHORT_FLAGS:
        assert sets_reserved_flag(short) and sets_reserved_flag(f"{short}=2") and not sets_reserved_flag(short + "x")
    assert not any(sets_reserved_flag(a) for a in ALLOWED)


def test_clean_extra_args_are_rendered_after_the_operators() -> None:
    dm = model(prefill={"extraArgs": ["--enforce-eager", "--compilation-config.cudagraph_mode=PIECEWISE"]})
    args = worker_args(dm, "prefill")
    assert args[-2:] == ["--enforce-eager", "--compilation-config.cudagraph_mode=PIECEWISE"]


def test_the_operator_reports_it_as_invalid_spec() -> None:
    body = example_body("llama-8b-nvlink")
    body["spec"]["prefill"]["extraArgs"] = ["--enforce-eager", "--tensor_parallel_size", "4"]
    # the reconciler's InvalidSpec error (a ValueError), reported as Ready=False reason InvalidSpec: the CEL rule's
    # words for a full name, the operator's own check's (api/semantics.py) for an abbreviation
    with pytest.raises(ValueError, match=r"^spec\.prefill\.extraArgs: extraArgs must not set a flag the operator "):
        Reconciler(kube=None).desired(body)  # type: ignore[arg-type]
    body["spec"]["prefill"]["extraArgs"] = ["--enforce-eager", "--tensor-parallel", "4"]
    with pytest.raises(ValueError, match=r"^spec\.prefill\.extraArgs\[1\]: --tensor-parallel \(an abbreviation of "
                                          r"--tensor-parallel-size\) is set by the operator from "
                                          r"spec\.prefill\.parallelism\.tensor; remove it$"):
        Reconciler(kube=None).desired(body)  # type: ignore[arg-type]
