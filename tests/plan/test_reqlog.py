"""The request log as an interface: reading schemas 1 and 2, `disagg plan --from-log` (round trip) and
`disagg replay` (determinism, side-by-side numbers, errors)."""

from __future__ import annotations

import dataclasses
import json
import zlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg.cli import main
from disagg.plan.emit import to_model
from disagg.plan.profile import ProfileError, parse_profile
from disagg.plan.replay import replay
from disagg.plan.reqlog import LogError, arrivals, histogram, log_lines, rates, read_lines, read_log, traffic_from_log
from disagg.plan.search import search
from disagg.plan.sources import Overrides, assemble
from disagg.plan.verify import cluster_spec, profile_arrivals
from disagg.twin import simulate

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_780_000_000.0
SOURCE: dict[str, Any] = {
    "name": "src", "model": {"preset": "Llama-3.1-8B"},
    "traffic": {"inputTokens": {"mean": 900, "p95": 2500}, "outputTokens": {"mean": 60, "p95": 150},
                "rate": {"meanRps": 8, "peakRps": 8}, "prefixCacheHitShare": 0.3,
                "tenants": [{"name": "chat", "share": 0.75},
                            {"name": "batch", "share": 0.25, "outputTokens": {"fixed": 20}}]},
    "slo": {"ttftP95Ms": 600, "tpotP95Ms": 30, "goodputTarget": 0.9},
    "gpus": [{"type": "L40S", "count": 4, "cost": 0.5, "product": "NVIDIA-L40S"}],
    "search": {"maxGpus": 4, "tensorParallel": [1]},
}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A log of 60 s of SOURCE traffic served by the plan's winner in the twin (the router's line keys), in both
    schemas, and the spec that served it."""
    p = parse_profile(SOURCE)
    res = search(p)
    live = to_model(res, res.ranked[0])
    live["spec"]["routing"]["tenants"] = [{"name": n, "match": {"header": "x-tenant", "values": [n]}}
                                          for n in ("chat", "batch")]
    # short prompts stay local whatever split the plan picked, so that the log holds prefix-cache hits
    live["spec"]["routing"]["remotePrefill"]["minInputTokens"] = 256
    live["spec"]["routing"]["localPrefill"] = {"maxInputTokens": 255, "preferWhenPrefixCacheHit": True}
    # the first arrival at 0, as a replay of the log starts (the twin's periodic work — scrapes, ticks — then has
    # the same phase in both runs, and a request whose placement is a close call is placed the same way)
    arr = profile_arrivals(p, 60.0, seed=5)
    arr = [dataclasses.replace(a, at=a.at - arr[0].at) for a in arr]
    m = cluster_spec(live)
    r = simulate(m.cluster, arr, seed=0, slo=m.slo)
    prefix = {a.request_id: (f"{zlib.crc32(a.prefix_key.encode()):08x}", a.prefix_tokens) for a in arr if a.prefix_key}
    d = tmp_path_factory.mktemp("log")
    (d / "v1.jsonl").write_text("\n".join(log_lines(r.records, T0, schema=1)) + "\n")
    noise = [json.dumps({"event": "config reloaded", "level": "info"}), "not json at all"]
    (d / "v2.jsonl").write_text("\n".join(noise + log_lines(r.records, T0, schema=2, prefix=prefix)) + "\n")
    (d / "live.yaml").write_text(yaml.safe_dump(live))
    agg = json.loads(json.dumps(live))
    agg["spec"].update(mode="Aggregated")
    agg["spec"]["decode"].update(replicas=2, maxReplicas=4)
    (d / "aggregated.yaml").write_text(yaml.safe_dump(agg))
    return {"dir": d, "arrivals": arr, "result": r, "live": live}


def test_schema_1_derives_arrival_from_timestamp_and_e2e(recorded: dict[str, Any]) -> None:
    log = read_log(recorded["dir"] / "v1.jsonl")
    assert log.schemas == {1: len(recorded["arrivals"])}
    arr, left = arrivals(log)
    assert not left
    want = recorded["arrivals"]
    assert [a.request_id for a in arr][:50] == [a.request_id for a in want][:50]
    for a, b in zip(arr, want, strict=True):  # relative times, to the log's millisecond rounding
        assert a.at == pytest.approx(b.at - want[0].at, abs=2e-3)
        assert a.output_tokens == b.output_tokens and a.prefix_key is None and not a.max_tokens_known


def test_schema_2_carries_arrival_max_tokens_and_prefix(recorded: dict[str, Any]) -> None:
    log = read_log(recorded["dir"] / "v2.jsonl")
    assert log.schemas == {2: len(recorded["arrivals"])}
    assert log.skipped == {"not JSON": 1, "other log event": 1}
    arr, _ = arrivals(log)
    with_prefix = [a for a in arr if a.prefix_key]
    assert len(with_prefix) == len(arr) and all(a.max_tokens_known for a in arr)
    assert len({a.prefix_key for a in with_prefix}) == 2  # one shared prefix per tenant


def test_from_log_round_trip_recovers_the_distributions(recorded: dict[str, Any]) -> None:
    log = read_log(recorded["dir"] / "v2.jsonl")
    traffic, notes = traffic_from_log(log, window_s=10.0)
    prof = assemble(traffic, {}, Overrides(model="Llama-3.1-8B", ttft_ms=600, tpot_ms=30, gpus=("L40S=4:0.5",)),
                    "v2.jsonl")
    arr = recorded["arrivals"]
    tr = prof.traffic
    assert tr.rate.mean_rps == pytest.approx(8, rel=0.15)
    assert tr.rate.peak >= tr.rate.mean_rps
    assert tr.prefix_cache_hit_share == pytest.approx(0.3, abs=0.02)
    shares = {t.name: t.share for t in tr.tenants}
    assert shares["batch"] == pytest.approx(0.25, abs=0.06)
    batch = next(t for t in tr.tenants if t.name == "batch")
    assert batch.output_tokens is not None and batch.output_tokens.bins() == [(20.0, 1.0)]

    def mean(bins: list[tuple[float, float]]) -> float:
        return sum(t * w for t, w in bins)

    # the histogram keeps the mean and the tail of what was recorded
    ins = sorted(a.input_tokens for a in arr)
    assert mean(tr.input_tokens.bins()) == pytest.approx(sum(ins) / len(ins), rel=0.01)
    hist = tr.input_tokens.bins()
    assert max(t for t, _ in hist) >= ins[int(0.95 * len(ins))]
    assert any("prefix-cache share" in n for n in notes)


def test_histogram_and_rates() -> None:
    h = histogram([10] * 50 + [1000] * 50, bins=4)
    assert h == [{"tokens": 10, "share": 0.5}, {"tokens": 1000, "share": 0.5}]
    mean, peak, w = rates([0.0, 0.1, 0.2, 0.3, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0], window_s=5.0)
    assert mean == pytest.approx(9 / 60)
    assert peak == pytest.approx(4 / 5) and w == 5.0


def test_cli_plan_from_log(recorded: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "profile.yaml"
    rc = main(["plan", "--from-log", str(recorded["dir"] / "v1.jsonl"), "--model", "Llama-3.1-8B",
               "--ttft-ms", "600", "--tpot-ms", "30", "--gpu", "L40S=4:0.5", "--max-gpus", "4", "--name", "fromlog",
               "--write-profile", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "profile from" in text and "no prefix information in the log (schema 1)" in text
    again = parse_profile(yaml.safe_load(out.read_text()))
    assert again.name == "fromlog" and again.traffic.input_tokens.histogram


def test_cli_from_log_names_what_is_missing(recorded: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", "--from-log", str(recorded["dir"] / "v1.jsonl")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "model: " in err and "pass --model PRESET" in err
    assert "slo: " in err and "--ttft-ms and --tpot-ms" in err
    assert "gpus: " in err and "--gpu TYPE=COUNT[:COST]" in err


def test_cli_from_log_with_a_base_profile(recorded: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    base = ROOT / "docs/examples/profiles/base-chat-8b.yaml"
    out = recorded["dir"] / "from-base.yaml"
    rc = main(["plan", "--from-log", str(recorded["dir"] / "v2.jsonl"), "--base", str(base), "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "plan chat-8b: Llama-3.1-8B" in text and "prefix hits 30%" in text
    assert yaml.safe_load(out.read_text())["spec"]["slo"]["ttftP95Ms"] == 800
    rc = main(["plan", "--from-log", str(recorded["dir"] / "v2.jsonl"), "--base", str(base), "--gpu", "TPU-v5=4"])
    assert rc == 2
    assert "gpus[0].type: unknown GPU preset 'TPU-v5'" in capsys.readouterr().err


def test_a_log_with_no_usable_line_says_what_a_line_needs(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(LogError) as e:
        read_lines(['{"event": "startup"}', "garbage", '{"event": "request", "tenant": "a"}'], "x.jsonl")
    msg = str(e.value)
    assert "x.jsonl: no usable request line (1 no input_tokens, 1 not JSON, 1 other log event)" in msg
    assert "timestamp + timings_ms.e2e (schema 1)" in msg and "arrival_unix" in msg
    bad = tmp_path / "bad.jsonl"
    bad.write_text("garbage\n")
    assert main(["plan", "--from-log", str(bad), "--model", "Llama-3.1-8B"]) == 2
    assert "no usable request line" in capsys.readouterr().err
    assert main(["replay", str(bad), "--candidate", str(bad)]) == 2


def test_gpu_flag_errors() -> None:
    with pytest.raises(ProfileError) as e:
        assemble({}, {}, Overrides(model="Llama-3.1-8B", ttft_ms=1, tpot_ms=1, gpus=("H100",)), "log")
    assert "--gpu 'H100': write TYPE=COUNT[:COST]" in str(e.value)


# ------------------------------------------------------------------------------------------------ replay


def test_replay_of_the_live_spec_reproduces_the_log_and_is_deterministic(recorded: dict[str, Any]) -> None:
    log = read_log(recorded["dir"] / "v2.jsonl")
    m = cluster_spec(recorded["live"])
    a = replay(log, [("live", Path("live.yaml"), m)], seed=0)
    b = replay(log, [("live", Path("live.yaml"), m)], seed=0)
    for rep in (a, b):
        for c in rep["columns"]:
            c["result"].pop("wall_s", None), c["result"].pop("speedup", None)
    assert a == b
    rec, live = a["columns"][0]["result"], a["columns"][1]["result"]
    # the log came from this spec in the twin: replaying it gives back what was recorded (to ms rounding)
    assert live["decisions"] == rec["decisions"] and live["paths"] == rec["paths"]
    assert live["attainment"] == pytest.approx(rec["attainment"], abs=0.01)
    assert live["ttft_p95_ms"] == pytest.approx(rec["ttft_p95_ms"], rel=0.02)
    assert rec["decisions"].get("local:prefix_cache_hit", 0) > 0
    # schema 1 has no prefix information: the same traffic replays without shared prefixes
    v1 = replay(read_log(recorded["dir"] / "v1.jsonl"), [("live", Path("live.yaml"), m)], seed=0)
    assert "local:prefix_cache_hit" not in v1["columns"][1]["result"]["decisions"]


def test_cli_replay_side_by_side(recorded: dict[str, Any], tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    d = recorded["dir"]
    out = tmp_path / "out"
    rc = main(["replay", str(d / "v2.jsonl"), "--live", str(d / "live.yaml"), "--candidate",
               str(d / "aggregated.yaml"), "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    header = next(line for line in text.splitlines() if "recorded" in line)
    assert header.split() == ["recorded", "live", "aggregated"]
    for row in ("goodput (share meeting SLOs)", "TTFT p95 ms [local]", "TPOT p99 ms [local]",
                "decision local:mode_aggregated", "GPU-seconds", "wall s (speed × real time)"):
        assert row in text, row
    rep = json.loads((out / "replay.json").read_text())
    agg = rep["columns"][2]
    assert agg["gpus"] == 2 and set(agg["result"]["paths"]) == {"local"}
    assert agg["result"]["decisions"] == {"local:mode_aggregated": rep["log"]["replayed"]}
    assert agg["result"]["gpu_seconds"] > 0
    assert "<table>" in (out / "replay.html").read_text() and "GPU-seconds" in (out / "replay.html").read_text()


def test_cli_replay_refuses_an_invalid_candidate(recorded: dict[str, Any], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = json.loads(json.dumps(recorded["live"]))
    bad["spec"]["prefill"]["replicas"] = "two"
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(bad))
    assert main(["replay", str(recorded["dir"] / "v1.jsonl"), "--candidate", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"{f}: spec.prefill.replicas" in err and "(disagg validate)" in err
    assert main(["replay", str(recorded["dir"] / "v1.jsonl")]) == 2
    assert "give at least one --candidate" in capsys.readouterr().err
