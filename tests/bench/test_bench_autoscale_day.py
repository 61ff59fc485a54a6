"""A quick smoke of the virtual-day autoscale bench (bench/autoscale_day.py): a tiny day, every part, the tables."""

from __future__ import annotations

import logging

import pytest
import structlog

from disagg.bench import autoscale_day as ad
from disagg.results import results_doc, validate


@pytest.fixture(autouse=True)
def _quiet(caplog):
    caplog.set_level(logging.ERROR)


def test_day_shape_is_diurnal_with_bursts_and_a_shifting_mix() -> None:
    s = ad.DaySettings(day_s=1000.0, peak_rps=10.0)
    assert ad.diurnal_rate(0.0, s) == pytest.approx(1.0)  # the trough: 0.1 × peak at midnight
    assert ad.diurnal_rate(500.0, s) == pytest.approx(10.0)  # noon
    mean = sum(ad.diurnal_rate(t + 0.5, s) for t in range(1000)) / 1000
    assert 2.0 <= 10.0 / mean <= 3.0  # peak ≈ 2–3 × mean (bursts included in the mean)
    flat = ad.DaySettings(day_s=1000.0, peak_rps=10.0, burst_factor=1.0)
    assert ad.diurnal_rate(305.0, s) == pytest.approx(1.8 * ad.diurnal_rate(305.0, flat))  # a burst at 30 %
    assert ad.diurnal_rate(295.0, s) == pytest.approx(ad.diurnal_rate(295.0, flat))
    assert ad.rag_share(0.0, s) == pytest.approx(0.2) and ad.rag_share(500.0, s) == pytest.approx(0.8)
    arr = ad.day_arrivals(s)
    noon = [a for a in arr if 400 <= a.at < 600]
    night = [a for a in arr if a.at < 100 or a.at >= 900]
    assert len(noon) > 3 * len(night)
    assert sum(a.cls == "rag" for a in noon) / len(noon) > 0.6 > sum(a.cls == "rag" for a in night) / len(night)


def test_oscillation_measures_reversals_within_the_window() -> None:
    ev = [{"pool": "decode", "t": 0, "before": 2, "after": 5}, {"pool": "decode", "t": 100, "before": 5,
                                                                  "after": 3},
          {"pool": "decode", "t": 1000, "before": 3, "after": 6}]
    assert ad.oscillation(ev, 300) == 2  # up 3 then down 2 within 300 s; the later rise is outside the window
    assert ad.oscillation(ev[:1], 300) == 0


def test_virtual_bench_smoke() -> None:
    s = ad.DaySettings(day_s=240.0, peak_rps=2.0, bucket_s=120.0, probe_s=30.0, step_base_rps=1.0,
                       step_pre_s=60.0, step_post_s=90.0, swing_rps=2.0, scalers=("predictive", "reactive"))
    disabled, config = logging.root.manager.disable, structlog.get_config()
    r = ad.run(s, jobs=1)
    # the bench quiets its own work only: the process's logging is as it was (a later test's log capture relies on it)
    assert logging.root.manager.disable == disabled and structlog.get_config() == config
    days = {d["scaler"]: d for d in r["days"]}
    assert set(days) == {"static_peak", "predictive", "reactive"}
    st = r["static_peak"]
    assert days["static_peak"]["gpu_seconds"] == pytest.approx((st["prefill"] + st["decode"]) * 240.0)
    assert 0 < r["oracle"]["gpu_seconds"] <= days["static_peak"]["gpu_seconds"]
    assert all(b["met"] for b in r["oracle"]["buckets"])
    # every bucket has the loose pick beside the SLO's, and the ratios to both are reported
    assert r["oracle"]["loose_gpu_seconds"] > 0 and all("loose" in b for b in r["oracle"]["buckets"])
    assert all(b["slo_share"] >= ad.SLO_QUANTILE for b in r["oracle"]["buckets"])
    assert all("vs_loose_oracle" in d for d in r["days"])
    for d in days.values():
        assert d["requests"] == r["requests"] > 0
        assert d["gpu_seconds"] > 0 and 0 <= d["attainment"] <= 1
    assert 0 <= r["savings_ceiling"] < 1
    assert r["step"]["bucket_s"] == s.step_bucket_s
    doc = results_doc("autoscale_day", "python -m disagg.bench.autoscale_day", r)
    assert not validate(doc, "autoscale_day")
    tables = ad.render_tables(doc)
    assert set(tables) == {"day", "step", "swing"}
    # the mix swings both ways, with and without role moves; only the predictive run lends
    assert [(w["share_before"], w["scaler"]) for w in r["swings"]] == [
        (0.9, "predictive"), (0.9, "predictive-pods"), (0.1, "predictive"), (0.1, "predictive-pods")]
    assert all(not w["role_moves"] for w in r["swings"] if w["scaler"] == "predictive-pods")
    assert tables["swing"].count("| predictive-pods |") == 2
    assert "| predictive |" in tables["day"] and "hindsight oracle" in tables["day"]


def test_a_probe_measures_after_its_warmup() -> None:
    """The oracle's and the static peak's probe counts the requests arriving after a warm-up of the same load: a split
    past its capacity holds for a while from empty pools (its queue starts empty), so a cold probe approves it."""
    cold = ad.probe_fn(ad.DaySettings(probe_s=20.0, probe_warmup_s=0.0))
    warm = ad.probe_fn(ad.DaySettings(probe_s=20.0, probe_warmup_s=40.0))
    # 1.6 RAG prompts/s of 6–10k tokens on one L40S prefill worker (≈ 0.8 s each): past its capacity
    assert warm(2.0, 0.8, 1, 1) < cold(2.0, 0.8, 1, 1) - 0.2
    # well within capacity the warm-up changes nothing that matters
    assert warm(0.5, 0.5, 2, 2) >= 0.95 and cold(0.5, 0.5, 2, 2) >= 0.95


def test_cli_rejects_a_negative_window(capsys) -> None:
    with pytest.raises(SystemExit):
        ad.main(["--scale-down-window", "-1"])
    assert "--scale-down-window" in capsys.readouterr().err


def test_cli_keeps_the_2h_results_for_the_2h_day(capsys) -> None:
    with pytest.raises(SystemExit):
        ad.main(["--name", "autoscale_day-2h"])  # the 1 h day under the 2 h day's name
    assert "--day 7200" in capsys.readouterr().err


def test_cli_rejects_a_negative_warmup(capsys) -> None:
    with pytest.raises(SystemExit):
        ad.main(["--probe-warmup", "-5"])
    assert "--probe-warmup" in capsys.readouterr().err


def test_the_oracle_is_held_to_the_slos_p95s_which_is_stricter_than_90_percent_attainment() -> None:
    """A probe's SLO share is the smaller of the shares within the TTFT and within the TPOT target (the SLO is a
    p95 of each): never below the share within both, and ≥ 95 % of each implies ≥ 90 % within both (union
    bound), so a split that meets the SLO also clears the loose bar — not the other way round."""
    s = ad.DaySettings(probe_s=30.0, probe_warmup_s=30.0)
    scores = ad.probe_scores(s)
    seen = [scores(*args) for args in ((2.0, 0.8, 1, 1), (1.2, 0.5, 1, 1), (0.5, 0.5, 2, 2))]
    for sc in seen:
        assert sc.slo_share >= sc.attainment
        if sc.slo_share >= ad.SLO_QUANTILE:
            assert sc.attainment >= 1 - 2 * (1 - ad.SLO_QUANTILE) - 1e-9
    assert seen[0].slo_share < ad.SLO_QUANTILE <= seen[2].slo_share  # past capacity, and well within it
    assert ad.probe_fn(s, scores)(2.0, 0.8, 1, 1) == seen[0].slo_share
    assert ad.probe_fn(s, scores, slo=False)(2.0, 0.8, 1, 1) == seen[0].attainment
