"""Smoke runs of the benchmarks: tiny loads, asserting the output structure and that the numbers are sane.

Not timed targets (those are in docs/benchmarks.md); every process started here is stopped by the benchmarks
themselves, which the last test checks.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from disagg.bench import goodput as G
from disagg.bench import router_bench as R
from disagg.bench.procs import Processes


def _children() -> set[int]:
    """Live child processes of this test process (from /proc)."""
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                fields = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                out.add(int(d))
    return out


def test_goodput_smoke(tmp_path) -> None:
    before = _children()
    plan = dataclasses.replace(G.PLANS["long-rag"], rate=4.0, duration_s=2.0, prefill=1, prefill_conditional=1)
    s = G.Settings(gpus=2, time_scale=0.2)
    out = tmp_path / "gp.json"
    res = G.run(["long-rag"], list(G.DEPLOYMENTS), s, {"long-rag": plan}, out=out, progress=lambda *_: None)
    assert json.loads(out.read_text())["rows"] == res["rows"]
    rows = {r["deployment"]: r for r in res["rows"]}
    assert set(rows) == set(G.DEPLOYMENTS)
    for r in rows.values():
        assert r["requests"] > 0 and r["errors"] == 0, r["errors_sample"]
        assert 0.0 <= r["attainment"] <= 1.0
        assert r["ttft_p50_ms"] > 0 and r["ttft_p95_ms"] >= r["ttft_p50_ms"]
        assert r["tpot_p50_ms"] > 0 and r["tpot_p95_ms"] >= r["tpot_p50_ms"]
        assert not r["crashed"]
        assert set(r["alt_slos"]) == {"1000/25", "2000/100"}
    # what each deployment is: decisions seen by the router
    assert set(rows["aggregated"]["decisions"]) == {"local:mode_aggregated"}
    assert all(k.startswith("remote:") for k in rows["disaggregated"]["decisions"])
    assert (rows["aggregated"]["aggregated_workers"], rows["disaggregated"]["prefill_workers"],
            rows["disaggregated"]["decode_workers"]) == (2, 1, 1)
    ratios = res["ratios"]["long-rag"]
    assert {"c_over_a", "c_over_b", "c_ge_max_ab", "c_ge_2a"} <= set(ratios)
    text = G.table(res["rows"], res["ratios"])
    assert "c) conditional" in text and "c/a" in text
    assert _children() <= before  # everything stopped


def test_router_bench_smoke(tmp_path) -> None:
    before = _children()
    assert R.find_nginx(), "nginx missing: `make test` installs it (hack/ensure-nginx.sh)"
    targets = ["direct", "router", "nginx"]
    res = R.run(streams=8, rounds=2, tokens=6, time_scale=1.0, targets=targets, out=tmp_path / "rb.json",
                progress=lambda *_: None)
    rows = res["rows"]
    assert set(rows) == set(targets)
    for name in targets[1:]:
        r = rows[name]
        assert r["pairs"] == 16 and r["errors"] == 0, r["errors_sample"]
        # added latency of a loopback proxy at 8 streams: positive-ish and well below a second
        assert -50 < r["added_ttft_p50_ms"] < 1000 and -50 < r["added_chunk_p50_ms"] < 1000
        assert r["chunks_per_s"] > 0 and r["proxy_us_per_chunk"] is not None and r["proxy_us_per_chunk"] >= 0
    assert "added_p50_le_1ms" in res["targets"]
    assert "router" in R.table(res)
    assert _children() <= before


def test_processes_stopped_on_exception(tmp_path) -> None:
    with pytest.raises(RuntimeError), Processes(tmp_path) as procs:
        p = procs.spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], "http://127.0.0.1:1")
        raise RuntimeError("boom")
    assert p.proc.poll() is not None


def test_cli_wiring() -> None:
    from disagg.cli import build_parser

    args = build_parser().parse_args(["bench", "goodput", "--mixes", "long-rag", "--rate", "long-rag=3"])
    assert args.func.__name__ == "_cmd_goodput" and args.rate == ["long-rag=3"]
    args = build_parser().parse_args(["bench", "router", "--streams", "10"])
    assert args.func.__name__ == "_cmd_router" and args.streams == 10
    out = subprocess.run([sys.executable, "-c", "import sys; from disagg.cli import main; sys.exit(main())",
                          "bench", "sim"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "Reference comparison" in out.stdout
