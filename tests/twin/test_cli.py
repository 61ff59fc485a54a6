"""`disagg twin`: a scenario from YAML and flags → summary + JSON; arrivals files; errors that name the input."""

from __future__ import annotations

import json

import pytest
import yaml

from disagg.cli import main
from disagg.load.workload import MIXES, SOAK, generate
from disagg.sim import tokenizer
from disagg.twin.arrivals import _engine_prompt


def test_scenario_yaml_with_flag_overrides(tmp_path, capsys) -> None:
    sc = tmp_path / "scenario.yaml"
    sc.write_text(yaml.safe_dump({
        "prefill": {"count": 1}, "decode": {"count": 1, "maxNumSeqs": 64},
        "router": {"mode": "Disaggregated", "routing": {"remotePrefill": {"minInputTokens": 2048}}},
        "workload": {"mix": "long-rag", "rate": 2, "duration": 4}, "slo": {"ttftMs": 2000, "tpotMs": 50},
        "seed": 5}))
    out = tmp_path / "out.json"
    assert main(["twin", "--scenario", str(sc), "--decode", "2", "--out", str(out), "--records"]) == 0
    doc = json.loads(out.read_text())
    assert doc["cluster"] == {"prefill": 1, "decode": 2} and doc["gpus"] == 3
    assert doc["workload"] == {"mix": "long-rag", "rate": 2.0, "duration_s": 4.0}
    assert doc["slo"] == {"ttft_ms": 2000.0, "tpot_ms": 50.0} and doc["seed"] == 5
    assert len(doc["records"]) == doc["requests"] > 0
    assert sum(doc["decisions"].values()) == doc["requests"]
    assert "attainment" in capsys.readouterr().out


def test_arrivals_file(tmp_path) -> None:
    arr = tmp_path / "arrivals.jsonl"
    arr.write_text("\n".join(json.dumps(a) for a in (
        {"at": 0.0, "input_tokens": 4000, "output_tokens": 100, "prefix_key": "doc-1", "prefix_tokens": 3000},
        {"at": 0.5, "input_tokens": 4200, "output_tokens": 100, "prefix_key": "doc-1", "prefix_tokens": 3000},
        {"at": 1.0, "input_tokens": 100, "output_tokens": 20, "tenant": "chat"})) + "\n")
    out = tmp_path / "out.json"
    assert main(["twin", "--decode", "1", "--arrivals", str(arr), "--out", str(out), "--records"]) == 0
    recs = json.loads(out.read_text())["records"]
    assert [r["status"] for r in recs] == [200, 200, 200]
    # the second prompt shares the first one's 3000-token prefix on the same decode engine: cached
    assert recs[0]["cached_tokens"] == 0 and recs[1]["cached_tokens"] >= 2992


@pytest.mark.parametrize(("argv", "named"), [
    (["--decode", "1", "--mix", "nope", "--rate", "1", "--duration", "1"], "mix"),
    (["--decode", "-1", "--mix", "mixed", "--rate", "1", "--duration", "1"], "--decode"),
    (["--decode", "1"], "--mix"),
    (["--prefill", "1", "--mix", "mixed", "--rate", "1", "--duration", "1"], "decode.count"),
    (["--decode", "1", "--mix", "mixed", "--rate", "0", "--duration", "1"], "rate"),
])
def test_errors_name_the_input(argv, named, capsys) -> None:
    assert main(["twin", *argv]) == 2
    assert named in capsys.readouterr().err


def test_bad_arrivals_line_is_named(tmp_path, capsys) -> None:
    arr = tmp_path / "a.jsonl"
    arr.write_text('{"at": 0, "input_tokens": 10, "output_tokens": 2}\n{"at": 1, "input_tokens": 10}\n')
    assert main(["twin", "--decode", "1", "--arrivals", str(arr)]) == 2
    assert f"{arr}:2" in capsys.readouterr().err


def test_engine_prompts_are_the_sims_tokens() -> None:
    """The fast path for workload text gives exactly the sim tokenizer's ids (what `disagg sim` would see)."""
    for mix in (*MIXES.values(), SOAK):
        for r in generate(mix, 10.0, 3.0, "m", seed=4):
            want = (tokenizer.encode_chat(r.body["messages"]) if "messages" in r.body
                    else [tokenizer.BOS_ID, *tokenizer.encode(r.body["prompt"])])
            assert _engine_prompt(r.path, r.body, 128256) == want, r.id
    odd = {"messages": [{"role": "user", "content": " Straße 42 and  extraordinary words!"}]}
    assert _engine_prompt("/v1/chat/completions", odd, 128256) == tokenizer.encode_chat(odd["messages"])
