"""``disagg bench goodput`` in the discrete-event twin: each deployment runs what it says (a aggregated with its
chunked-prefill budget, b always remote, c with the CRD's default thresholds read from api/spec.py), the sweep is
deterministic for a seed, the summary picks the best configuration per deployment and SLO, and the results
document follows the benchmark convention. Tiny loads: numbers are the benchmark's business, not the tests'."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from disagg import results
from disagg.api.spec import RoutingSpec
from disagg.bench import goodput
from disagg.bench.goodput import Config, SweepPlan, TwinSettings

SMALL = TwinSettings(gpus=3, duration_s=3.0, budgets=(2048, 8192), splits=(1, 2))
PLANS = {"long-rag": SweepPlan("long-rag", (1.0, 2.0))}


def _strip(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


@pytest.fixture(scope="module")
def doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("goodput") / "goodput.json"
    d = goodput.run_twin(["long-rag"], SMALL, PLANS, out=out, command="disagg bench goodput --test",
                         progress=lambda _: None)
    d["_path"] = out
    return d


def test_results_document_follows_the_convention(doc: dict[str, Any]) -> None:
    path: Path = doc.pop("_path")
    import json

    on_disk = json.loads(path.read_text())
    assert results.validate(on_disk, "goodput") == []
    assert on_disk["command"] == "disagg bench goodput --test" and on_disk["machine"]["cpus"]
    res = on_disk["results"]
    # 2 rates × (2 budgets + (b, c-thresholds) × 2 splits + c-default × 2 splits × 3 SLOs deployed for) runs,
    # each scored at three SLOs
    assert len(res["rows"]) == 2 * (2 + 2 * 2 + 2 * 3)
    deployed = [r["deployed_slo"] for r in res["rows"] if r["variant"] == "c-default"]
    assert sorted(set(deployed)) == sorted(goodput.TARGETS) and deployed.count("1000/25") == 2 * 2
    assert all(r["deployed_slo"] is None for r in res["rows"] if r["variant"] != "c-default")
    assert all(set(r["slos"]) == {"1000/50", "1000/25", "2000/100"} for r in res["rows"])
    assert res["targets_per_slo"] == {k: list(v) for k, v in goodput.TARGETS.items()}
    tables = goodput.render_tables(on_disk)
    assert set(tables) == {"summary", "knee", "targets", "sweep"}
    assert len([x for x in tables["sweep"].splitlines() if x.startswith("| 3 | long-rag")]) == len(res["rows"])
    assert tables["summary"].count("| 3 | long-rag |") == 2 * 3  # per rate and SLO


def test_each_deployment_runs_what_it_says(doc: dict[str, Any]) -> None:
    rows = doc["results"]["rows"]
    for r in rows:
        assert r["requests"] > 0 and r["errors"] == 0
        if r["variant"] == "a":
            assert set(r["decisions"]) == {"local:mode_aggregated"} and r["workers"] == 3 and r["prefill"] == 0
        else:
            assert r["prefill"] + r["workers"] == 3
        if r["variant"] == "b":
            assert r["remote_share"] == 1.0
    # the conditional policy keeps long-rag's short chats local and sends some long prompts remote
    c = [r for r in rows if r["variant"].startswith("c-")]
    assert all(0.0 < r["remote_share"] < 1.0 for r in c), [r["decisions"] for r in c]
    # c-default runs the CRD's defaults, read from api/spec.py (not a copy that could drift): the SLO policy
    spec = RoutingSpec().model_dump(by_alias=True, mode="json")
    assert doc["results"]["routing"]["c-default"]["remotePrefill"] == spec["remotePrefill"]
    assert doc["results"]["routing"]["c-default"]["policy"] == spec["policy"] == "SLO"
    assert Config("c-default", 1, 2).router().get("routing") is None
    assert Config("c-thresholds", 1, 2).router()["routing"] == {"policy": "Thresholds"}
    # c-default is deployed for the SLO it is scored at: spec.slo and the decode budget the operator renders
    tight = Config("c-default", 1, 2, slo=goodput.SLOS[1])
    assert tight.router()["slo"] == {"ttftP95Ms": 1000, "tpotP95Ms": 25}
    assert (tight.cluster(SMALL).decode.max_num_batched_tokens
            < Config("c-default", 1, 2).cluster(SMALL).decode.max_num_batched_tokens)
    # (a)'s budget reaches the engine
    cluster = Config("a", 0, 3, 2048).cluster(SMALL)
    assert cluster.aggregated.max_num_batched_tokens == 2048 and cluster.prefill is None


def test_the_sweep_is_deterministic_for_a_seed(doc: dict[str, Any]) -> None:
    # in worker processes (each replaced after goodput.TASKS_PER_CHILD runs), the same rows as in one process
    again = goodput.sweep(["long-rag"], dataclasses.replace(SMALL, jobs=2), PLANS, progress=lambda _: None)
    assert len(again) > 2 * goodput.TASKS_PER_CHILD
    assert _strip(again) == _strip(doc["results"]["rows"])
    other = goodput.sweep(["long-rag"], dataclasses.replace(SMALL, seed=1, variants=("a",), budgets=(8192,)),
                          PLANS, progress=lambda _: None)
    assert [r["requests"] for r in other] != [r["requests"] for r in again if r["config"] == "3 agg, budget 8192"]


def _row(variant: str, cfg: str, prefill: int, goodput_by_slo: dict[str, float], rate: float = 10.0,
         deployed_slo: str | None = None) -> dict[str, Any]:
    return {"gpus": 4, "mix": "long-rag", "rate": rate, "variant": variant, "config": cfg, "prefill": prefill,
            "deployed_slo": deployed_slo,
            "ttft_p95_ms": 1.0, "tpot_p95_ms": 1.0, "remote_share": 0.5,
            "slos": {k: {"goodput_rps": g, "attainment": g / rate} for k, g in goodput_by_slo.items()}}


def test_summary_compares_the_best_of_each_deployment_per_slo() -> None:
    rows = [
        _row("a", "4 agg, budget 2048", 0, {"1000/50": 9.0, "1000/25": 2.0, "2000/100": 10.0}),
        _row("a", "4 agg, budget 8192", 0, {"1000/50": 8.0, "1000/25": 3.0, "2000/100": 10.0}),
        _row("b", "1P+3D", 1, {"1000/50": 5.0, "1000/25": 1.0, "2000/100": 6.0}),
        # c-default deployed for each SLO: scored at its own only (the 1000/25 deployment's 50.0 elsewhere is not
        # counted)
        _row("c-default", "1P+3D", 1, {"1000/50": 9.5, "1000/25": 1.0, "2000/100": 10.0}, deployed_slo="1000/50"),
        _row("c-default", "1P+3D", 1, {"1000/50": 50.0, "1000/25": 2.95, "2000/100": 50.0}, deployed_slo="1000/25"),
        _row("c-default", "1P+3D", 1, {"1000/50": 1.0, "1000/25": 1.0, "2000/100": 10.0}, deployed_slo="2000/100"),
        _row("c-thresholds", "2P+2D", 2, {"1000/50": 9.8, "1000/25": 2.0, "2000/100": 9.0}),
    ]
    s = goodput.summarise(rows)
    best = {e["slo"]: e for e in s["best"]}
    # per SLO, each deployment's own best configuration
    assert best["1000/50"]["a"]["config"] == "4 agg, budget 2048" and best["1000/25"]["a"]["config"].endswith("8192")
    assert best["1000/50"]["c"]["goodput_rps"] == 9.5 and best["1000/25"]["c"]["goodput_rps"] == 2.95
    assert best["1000/50"]["c-thresholds"]["goodput_rps"] == 9.8  # the ladder beside it, not part of (c)
    never, tight = goodput.NEVER_WORSE, goodput.TIGHT_LONG
    assert best["1000/50"]["targets"] == {never: True, "long-rag: c ≥ 2 × a": False}
    # 2.95 ≥ 0.98 × a's 3.0, but not 1.10 × (long prompts, tight TPOT)
    assert best["1000/25"]["targets"] == {never: True, tight: False}
    assert best["2000/100"]["targets"] == {never: True}  # a tie counts
    assert best["1000/50"]["c_over_a"] == pytest.approx(9.5 / 9.0, abs=1e-3)
    assert s["targets"]["1000/25"][tight] == {"met": 0, "of": 1, "missed": ["long-rag @ 10/s (4 GPUs)"]}
    # where the better baseline keeps < 10 % the max(a, b) targets are not scored
    low = goodput.summarise([_row("a", "4 agg", 0, {k: 0.5 for k in goodput.TARGETS}),
                             _row("b", "1P+3D", 1, {k: 0.2 for k in goodput.TARGETS}),
                             *(_row("c-default", "1P+3D", 1, {k: 0.1 for k in goodput.TARGETS}, deployed_slo=k)
                               for k in goodput.TARGETS)])
    assert all(never not in e["targets"] for e in low["best"])
    # knee: the highest rate whose best attainment ≥ 90 %
    knee = {k["slo"]: k for k in s["knees"]}
    assert knee["1000/50"]["a"] == 10.0 and knee["1000/50"]["b"] is None and knee["2000/100"]["c"] == 10.0
    assert knee["1000/25"]["c"] is None  # 2.95 of 10 at its own SLO


@pytest.mark.parametrize(("settings", "flag"), [
    (TwinSettings(gpus=1), "--gpus"), (TwinSettings(gpus=4, splits=(4,)), "--splits"),
    (TwinSettings(duration_s=0), "--duration"), (TwinSettings(budgets=(0,)), "--budgets"),
    (TwinSettings(variants=("d",)), "--variants"), (TwinSettings(jobs=0), "--jobs"),
])
def test_settings_errors_name_the_flag(settings: TwinSettings, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        settings.validate()


def test_unknown_mix_and_missing_ladder_name_the_flag() -> None:
    with pytest.raises(ValueError, match="--mixes"):
        goodput.sweep(["nope"], SMALL, PLANS)
    with pytest.raises(ValueError, match="--rate"):
        goodput.sweep(["mixed"], SMALL, PLANS)


def test_cli_flags() -> None:
    from disagg.cli import build_parser

    args = build_parser().parse_args(["bench", "goodput", "--gpus", "4", "8", "--rates-per-gpu", "long-rag=3,4.5",
                                      "--splits", "1,2", "--jobs", "2"])
    assert args.func.__name__ == "_cmd_goodput" and args.gpus == [4, 8] and not args.real
    assert args.rates_per_gpu == ["long-rag=3,4.5"] and args.out is None
    assert args.func(build_parser().parse_args(["bench", "goodput", "--gpus", "1"])) == 2
    with pytest.raises(SystemExit, match="--splits"):
        args.func(build_parser().parse_args(["bench", "goodput", "--splits", "one"]))


def test_heldout_mixes_are_apart_and_scored_like_the_others() -> None:
    from disagg.load.workload import HELDOUT_MIXES, MIXES
    from disagg.twin.arrivals import arrivals_from_mix

    assert HELDOUT_MIXES and not set(HELDOUT_MIXES) & set(MIXES)
    assert set(goodput.HELDOUT_PLANS) == set(HELDOUT_MIXES)  # each has its ladder
    # the drain limit comes from MIXES' longest answer: a held-out answer beyond it would be cut before it could meet
    longest = max(c.output_tokens[1] for m in MIXES.values() for c in m.classes + m.then)
    assert all(c.output_tokens[1] <= longest for m in HELDOUT_MIXES.values() for c in m.classes + m.then)
    # the long-prompt target covers held-out long-prompt mixes
    assert {"summarise", "longdoc"} <= goodput.LONG_PROMPT_MIXES
    arrivals = arrivals_from_mix("summarise", 4.0, 3.0, seed=0)
    assert arrivals and all(3000 <= a.input_tokens <= 8000 and a.output_tokens <= 96 for a in arrivals)


def test_heldout_run_writes_its_own_results(tmp_path: Path) -> None:
    import json

    out = tmp_path / "goodput-heldout.json"
    goodput.run_twin(["summarise"], dataclasses.replace(SMALL, variants=("a", "c-default")),
                     {"summarise": SweepPlan("summarise", (1.0,))}, out=out, command=goodput.HELDOUT_COMMAND,
                     progress=lambda _: None, benchmark=goodput.HELDOUT_BENCHMARK)
    on_disk = json.loads(out.read_text())
    assert on_disk["benchmark"] == "goodput-heldout" and results.validate(on_disk, "goodput-heldout") == []
    assert {r["mix"] for r in on_disk["results"]["rows"]} == {"summarise"}


def test_heldout_cli() -> None:
    from disagg.cli import build_parser

    args = build_parser().parse_args(["bench", "goodput", "--heldout"])
    assert args.heldout and args.mixes is None
    assert args.func(build_parser().parse_args(["bench", "goodput", "--heldout", "--real"])) == 2
    assert args.func(build_parser().parse_args(["bench", "goodput", "--heldout", "--mixes", "nope"])) == 2
    # a held-out mix is no mix of the real-process run
    assert args.func(build_parser().parse_args(["bench", "goodput", "--real", "--mixes", "summarise"])) == 2


def test_name_picks_a_registered_results_document(tmp_path: Path) -> None:
    """``--name``: one of the sweep's registered results documents (bench/docs.py), written with its own name and
    command; refused beside --real, and beside --heldout unless it names the held-out document."""
    import json

    from disagg.bench.docs import REGISTRY
    from disagg.cli import build_parser

    parser = build_parser()
    for name in (n for n, b in REGISTRY.items() if b.module == "disagg.bench.goodput"):
        assert parser.parse_args(["bench", "goodput", "--name", name]).name == name
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "goodput", "--name", "goodput-32gpu"])
    refused = [["--name", "goodput-16gpu", "--real"], ["--heldout", "--name", "goodput-16gpu"]]
    for argv in refused:
        args = parser.parse_args(["bench", "goodput", *argv])
        assert args.func(args) == 2, argv
    out = tmp_path / "cluster.json"
    args = parser.parse_args(["bench", "goodput", "--name", "goodput-16gpu", "--gpus", "2", "--mixes", "long-rag",
                              "--rates-per-gpu", "long-rag=0.5", "--duration", "2", "--splits", "1", "--budgets",
                              "2048", "--variants", "a", "--jobs", "1", "--out", str(out)])
    assert args.func(args) == 0
    on_disk = json.loads(out.read_text())
    assert on_disk["benchmark"] == goodput.CLUSTER_BENCHMARK and on_disk["command"] == goodput.CLUSTER_COMMAND
    assert results.validate(on_disk, goodput.CLUSTER_BENCHMARK) == []
