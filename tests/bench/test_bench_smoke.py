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
from pathlib import Path

from disagg.bench import goodput, goodput_live, nginx, router_bench


def _children() -> set[int]:
    """Live child processes of this test process (from /proc)."""
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                out.add(int(d))
    return out


def test_goodput_smoke(tmp_path: Path) -> None:
    before = _children()
    plan = dataclasses.replace(goodput_live.PLANS["long-rag"], rate=4.0, duration_s=2.0, prefill=1,
                               prefill_conditional=1)
    s = goodput_live.Settings(gpus=2, time_scale=0.2)
    out = tmp_path / "gp.json"
    res = goodput_live.run(["long-rag"], list(goodput.DEPLOYMENTS), s, {"long-rag": plan}, out=out,
                           progress=lambda *_: None)
    assert json.loads(out.read_text())["rows"] == res["rows"]
    rows = {r["deployment"]: r for r in res["rows"]}
    assert set(rows) == set(goodput.DEPLOYMENTS)
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
    text = goodput_live.table(res["rows"], res["ratios"])
    assert "c) conditional" in text and "c/a" in text
    assert _children() <= before  # everything stopped


def test_router_bench_smoke(tmp_path: Path) -> None:
    before = _children()
    assert nginx.find_nginx(), "nginx missing: `make test` installs it (hack/ensure-nginx.sh)"
    targets = ["direct", "router", "nginx"]
    doc = router_bench.run(streams=8, rounds=2, tokens=6, time_scale=1.0, targets=targets, out=tmp_path / "rb.json",
                           progress=lambda *_: None)
    assert json.loads((tmp_path / "rb.json").read_text()) == doc
    assert doc["schema"] == 1 and doc["benchmark"] == "router" and doc["command"].startswith("disagg bench router")
    assert doc["machine"]["cpus"] and doc["machine"]["nginx_version"] and doc["machine"]["date"]
    res = doc["results"]
    rows = res["rows"]
    router_rows = ["router", "router-w2", "router-remote", "router-remote-w2"]
    assert list(rows) == ["direct", *router_rows, "nginx"]
    assert res["settings"]["router_log_level"] == "INFO"
    for name in [*router_rows, "nginx"]:
        r = rows[name]
        assert r["pairs"] == 16 and r["errors"] == 0, r["errors_sample"]
        # added latency of a loopback proxy at 8 streams: positive-ish and well below a second (the remote path
        # adds the prefill worker's step and the KV hand-off)
        assert -50 < r["added_chunk_p50_ms"] < 1000
        assert -50 < r["added_ttft_p50_ms"] < (3000 if r["path"] == "remote" else 1000)
        assert r["chunks"] == 16 * 6 and r["chunks_per_s"] > 0 and r["direct_chunks_per_s"] > 0
        assert r["proxy_us_per_chunk"] is not None and r["proxy_us_per_chunk"] >= 0
    # each router row took the path it names, with the workers it names
    for name in router_rows:
        r = rows[name]
        assert r["workers"] == (2 if name.endswith("-w2") else 1)
        want = "remote:tenant_always" if r["path"] == "remote" else "local:"
        assert r["decisions"] and all(k.startswith(want) for k in r["decisions"]), r["decisions"]
        assert sum(r["decisions"].values()) == 16 and not r["fallbacks"], r
    # the direct row is measured (its own chunks), not copied from a proxied row
    assert rows["direct"]["chunks_per_s"] > 0 and set(rows["direct"]["chunks_per_s_by_phase"]) == set(rows) - {"direct"}
    assert set(res["targets"]) == set(router_rows)
    assert {"added_ttft_p50_le_2ms", "cpu_per_chunk_le_1.5x_nginx", "added_chunk_p50_le_2x_nginx"} \
        <= set(res["targets"]["router"])
    assert "added_ttft_p50_le_2ms" not in res["targets"]["router-remote"]
    assert set(res["targets"]["router-remote"]) == {"cpu_per_chunk_le_1.5x_nginx"}
    assert all(r["added_chunk_aligned_p50_ms"] is not None for n, r in rows.items() if n != "direct")
    assert "router-remote-w2" in router_bench.table(doc)
    md = router_bench.render_tables(doc)
    assert set(md) == {"relay", "targets", "other-runs"} and "| router-w2 | 2 |" in md["relay"]
    assert "| CPU µs per chunk ≤ 1.5 × nginx" in md["targets"]
    assert _children() <= before


def test_cli_wiring() -> None:
    from disagg.cli import build_parser

    args = build_parser().parse_args(["bench", "goodput", "--mixes", "long-rag", "--rate", "long-rag=3"])
    assert args.func.__name__ == "_cmd_goodput" and args.rate == ["long-rag=3"]
    args = build_parser().parse_args(["bench", "router", "--streams", "10"])
    assert args.func.__name__ == "_cmd_router" and args.streams == 10
    out = subprocess.run([sys.executable, "-c", "import sys; from disagg.cli import main; sys.exit(main())",
                          "bench", "sim", "--no-write"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "Reference comparison" in out.stdout
