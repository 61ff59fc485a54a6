"""How well the SLO placement predicts (issue 27, "Prediction accuracy in the twin below the knee"):
``disagg bench prediction``.

For every mix of the goodput benchmark, the shipped default (c-default: ``spec.routing.policy SLO``) at 4 GPUs,
deployed for and scored at each SLO, at every rate the benchmark ran **below its knee** (the best split's
attainment ≥ 90 %), on that rate's best split (from the committed ``docs/results/goodput.json``): the twin replays
the run and every request that the placement predicted and that finished gives actual ÷ predicted for TTFT and
TPOT. Reported per mix and SLO: the requests, the median |ratio − 1| (the target: ≤ 15 %), its p90 and the median
ratio (the bias: > 1 means the model is optimistic). Deterministic (the goodput benchmark's seeds and arrivals).

Each cell runs :data:`DURATION_S` simulated seconds of arrivals (longer than the goodput benchmark's few seconds),
and the steady columns keep the requests that arrived after the run filled and before it drained
(:func:`steady`): in a run of a few seconds most requests see a decode batch that is still growing or already
emptying — transients the model, which prices the batch it sees, cannot know about.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .goodput import ATTAINMENT_KNEE, SLOS, Config, TwinSettings, twin_run

COMMAND = "disagg bench prediction"
RESULTS = Path("docs") / "results" / "prediction.json"
TARGET = 0.15  # median |actual ÷ predicted − 1|
GPUS = 4
DURATION_S = 30.0  # simulated seconds of arrivals per cell (at least the goodput run's)


def below_knee(goodput: dict[str, Any], gpus: int = GPUS) -> list[dict[str, Any]]:
    """The (mix, SLO, rate, best c-default split) runs at or below each mix's knee at that SLO, in a fixed order."""
    rows = [r for r in goodput["results"]["rows"] if r["variant"] == "c-default" and r["gpus"] == gpus]
    out: list[dict[str, Any]] = []
    for slo in SLOS:
        mine = [r for r in rows if r["deployed_slo"] == slo.key]
        for mix in sorted({r["mix"] for r in mine}):
            for rate in sorted({r["rate"] for r in mine if r["mix"] == mix}):
                at = [r for r in mine if r["mix"] == mix and r["rate"] == rate]
                best = max(at, key=lambda r: (r["slos"][slo.key]["attainment"], -r["prefill"]))
                if best["slos"][slo.key]["attainment"] >= ATTAINMENT_KNEE:
                    out.append({"mix": mix, "slo": slo.key, "rate": rate, "prefill": best["prefill"],
                                "workers": best["workers"], "duration_s": best["duration_s"],
                                "attainment": best["slos"][slo.key]["attainment"]})
    return out


def warmup_s(records: Sequence[Any]) -> float:
    """How long a run takes to fill: twice the median request lifetime (arrival to last token) of its finished
    requests. A request placed before that sees the decode batch still growing from empty — a transient the cost
    model, which prices the batch it sees, cannot know about; the goodput benchmark's cells are short (seconds), so
    it is a large share of them."""
    lives = sorted(x.e2e_s for x in records if x.ok and getattr(x, "e2e_s", None) is not None)
    return 2.0 * statistics.median(lives) if lives else 0.0


def steady(records: Sequence[Any], duration_s: float) -> dict[str, Any]:
    """:func:`errors` over the requests that arrived after :func:`warmup_s` and at least as long before the end of
    the arrivals (``duration_s``): later ones finish while the batch drains."""
    w = warmup_s(records)
    return {"warmup_s": round(w, 2),
            **errors([x for x in records if w <= x.arrival_s <= duration_s - w])}


def errors(records: Sequence[Any]) -> dict[str, Any]:
    """actual ÷ predicted per phase over the finished requests the placement predicted."""
    out: dict[str, Any] = {}
    for phase in ("ttft", "tpot"):
        ratios = [getattr(x, f"{phase}_s") / getattr(x, f"predicted_{phase}_s") for x in records
                  if x.ok and getattr(x, f"{phase}_s") is not None and getattr(x, f"predicted_{phase}_s")]
        if not ratios:
            out[phase] = None
            continue
        dev = sorted(abs(r - 1) for r in ratios)
        out[phase] = {"n": len(ratios), "median_abs_error": round(statistics.median(dev), 4),
                      "p90_abs_error": round(dev[min(len(dev) - 1, int(0.9 * len(dev)))], 4),
                      "median_ratio": round(statistics.median(ratios), 4)}
    return out


def run(goodput_path: Path = Path("docs") / "results" / "goodput.json", out: Path | None = RESULTS,
        say: Callable[[str], None] = print) -> dict[str, Any]:
    """Every below-knee cell; the results document (written to ``out``)."""
    from ..results import machine_facts, results_doc, write_results

    doc = results_doc("prediction", f"{COMMAND} --goodput {goodput_path}", measure(goodput_path, say),
                      machine_facts())
    if out is not None:
        write_results(out, doc)
    return doc


def measure(goodput_path: Path, say: Callable[[str], None] = print) -> dict[str, Any]:
    import json

    goodput = json.loads(goodput_path.read_text())
    settings = goodput["results"]["settings"]
    s = TwinSettings(gpus=GPUS, gpu=settings["gpu"], model_preset=settings["model_preset"], seed=settings["seed"])
    slos = {slo.key: slo for slo in SLOS}
    cells = []
    t0 = time.perf_counter()
    for run_ in below_knee(goodput):
        cfg = Config("c-default", run_["prefill"], run_["workers"], slo=slos[run_["slo"]])
        duration = max(DURATION_S, run_["duration_s"])
        records = twin_run(cfg, run_["mix"], run_["rate"], replace(s, duration_s=duration)).records
        cell = {**run_, "duration_s": duration, **errors(records), "steady": steady(records, duration)}
        cells.append(cell)
        say(f"{run_['mix']} {run_['slo']} {run_['rate']:g} req/s {run_['prefill']}P+{run_['workers']}D: "
            f"TTFT {_fmt(cell['ttft'])}, TPOT {_fmt(cell['tpot'])}; after {cell['steady']['warmup_s']} s: TTFT "
            f"{_fmt(cell['steady']['ttft'])}, TPOT {_fmt(cell['steady']['tpot'])}")
    return {"gpus": GPUS, "target": TARGET, "knee_attainment": ATTAINMENT_KNEE, "cells": cells,
            "summary": summary(cells), "goodput_results": str(goodput_path),
            "wall_s": round(time.perf_counter() - t0, 1)}


def summary(cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per phase: the cells that meet the target, and the median of the cells' medians."""
    out: dict[str, Any] = {}
    for key, of in (("", lambda c: c), ("steady_", lambda c: c.get("steady") or {})):
        for phase in ("ttft", "tpot"):
            have = [of(c)[phase] for c in cells if of(c).get(phase)]
            out[key + phase] = {"cells": len(have), "met": sum(1 for e in have if e["median_abs_error"] <= TARGET),
                                "median_of_medians": round(statistics.median(e["median_abs_error"] for e in have), 4)
                                if have else None}
    return out


def _fmt(e: dict[str, Any] | None) -> str:
    return "n/a" if not e else f"{100 * e['median_abs_error']:.1f} % (bias ×{e['median_ratio']:.2f}, n {e['n']})"


def render_tables(doc: dict[str, Any]) -> dict[str, str]:
    r = doc["results"]
    lines = ["| mix | SLO (ms) | rate (req/s) | split | TTFT: median \\|err\\| | TTFT p90 | TTFT bias | "
             "TPOT: median \\|err\\| | TPOT p90 | TPOT bias | steady: TTFT \\|err\\| / bias | "
             "TPOT \\|err\\| / bias |", "|" + " --- |" * 12]

    def cell_of(e: dict[str, Any] | None, full: bool) -> list[str]:
        if not e:
            return ["n/a"] * (3 if full else 1)
        err = f"{100 * e['median_abs_error']:.1f} %{'' if e['median_abs_error'] <= r['target'] else ' ✗'}"
        if not full:
            return [f"{err} / ×{e['median_ratio']:.2f}"]
        return [err, f"{100 * e['p90_abs_error']:.1f} %", f"×{e['median_ratio']:.2f}"]

    for c in r["cells"]:
        cols = cell_of(c.get("ttft"), True) + cell_of(c.get("tpot"), True)
        st = c.get("steady") or {}
        cols += cell_of(st.get("ttft"), False) + cell_of(st.get("tpot"), False)
        lines.append(f"| {c['mix']} | {c['slo']} | {c['rate']:g} | {c['prefill']}P+{c['workers']}D | "
                     + " | ".join(cols) + " |")
    s = r["summary"]
    lines.append("")
    lines.append(f"Within ±{100 * r['target']:.0f} % at the median: TTFT {s['ttft']['met']}/{s['ttft']['cells']} "
                 f"cells, TPOT {s['tpot']['met']}/{s['tpot']['cells']} cells (✗: missed). Bias: actual ÷ predicted "
                 "at the median (> 1: the placement's model is optimistic).")
    if "steady_ttft" in s:
        lines.append(f"Steady (requests arriving after twice the run's median request lifetime, and as long before its "
                     f"arrivals end): TTFT "
                     f"{s['steady_ttft']['met']}/{s['steady_ttft']['cells']} cells, TPOT "
                     f"{s['steady_tpot']['met']}/{s['steady_tpot']['cells']} cells within ±{100 * r['target']:.0f} %.")
    return {"accuracy": "\n".join(lines)}
