"""The pydantic API: examples parse, defaults are sane, errors name fields, CLI validation."""

from __future__ import annotations

import yaml
from tests.paths import EXAMPLES

from disagg.api import DisaggregatedModel, Mode
from disagg.api.validate import errors_of
from disagg.cli import main


def test_examples_parse() -> None:
    assert len(EXAMPLES) >= 3
    for path in EXAMPLES:
        dm = DisaggregatedModel.model_validate(yaml.safe_load(path.read_text()))
        assert dm.spec.model.name


def test_defaults() -> None:
    dm = DisaggregatedModel.model_validate({"spec": {"model": {"name": "m"}}})
    s = dm.spec
    assert s.mode == Mode.AUTO
    assert s.kv_transfer.connector == "NixlConnector" and s.kv_transfer.side_channel_port == 5600
    assert s.routing.remote_prefill.min_input_tokens > s.routing.local_prefill.max_input_tokens
    assert s.routing.fallback.on_kv_transfer_timeout == "LocalAggregated"
    assert s.rollout.canary.traffic_percent == 100
    assert s.autoscaling.enabled is False
    assert s.prefill.min_replicas <= s.prefill.replicas <= s.prefill.max_replicas


def test_wire_names_are_camel_case_with_acronyms() -> None:
    out = DisaggregatedModel.model_validate({"spec": {"model": {"name": "m"}}}).to_api()
    assert "kvTransfer" in out["spec"]
    assert "onKVTransferTimeout" in out["spec"]["routing"]["fallback"]
    assert "ttftP95Ms" in out["spec"]["slo"]


def test_errors_name_nested_fields() -> None:
    errs = errors_of({"spec": {"model": {"name": "m"}, "decode": {"parallelism": {"tensor": "x"}}}})
    assert any(e.startswith("spec.decode.parallelism.tensor") for e in errs), errs


def test_validate_cli(tmp_path, capsys) -> None:
    good = EXAMPLES[0]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"apiVersion": "serving.disagg.dev/v1alpha1", "kind": "DisaggregatedModel",
                                   "metadata": {"name": "bad"},
                                   "spec": {"model": {"name": "m"}, "kvTransfer": {"transport": "carrier-pigeon"}}}))
    assert main(["validate", str(good)]) == 0
    assert main(["validate", str(bad)]) == 1
    assert "spec.kvTransfer.transport" in capsys.readouterr().err


def test_models_re_exports_the_split_modules() -> None:
    """disagg.api.models stays the import surface after the split into spec, status and rules."""
    from disagg.api import models, rules, spec, status

    for name in models.__all__:
        assert hasattr(models, name), name
    assert models.PoolSpec is spec.PoolSpec and models.ActiveMode is status.ActiveMode
    assert models.spec_errors is rules.spec_errors and models.RULES is rules.RULES
    api_version = f"{models.GROUP}/{models.VERSION}"
    assert api_version == models.API_VERSION
    assert f"{Mode.AUTO}" == "Auto"  # StrEnum: formats as its value
