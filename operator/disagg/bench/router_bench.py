"""``disagg bench router``: the relay overhead of ``disagg router`` next to nginx, at N concurrent streams.

One decode sim serves everything. Added latency is measured *paired*: each of N client workers repeatedly sends
two identical streaming requests at the same instant — one straight to the sim, one through the proxy under test
(``disagg router`` or nginx as a plain reverse proxy) — so both usually join the same engine step and get their
tokens in the same step. Then, per pair:

* added TTFT = TTFT(proxied) − TTFT(direct): request relay + first-chunk relay;
* added per-chunk latency = t_proxied(k) − t_direct(k) for every later token k: the streaming relay delay.

The sim's step time, its queueing and the client's own scheduling cancel out of the differences; only the
proxy's work (and the CPU it takes from the other processes on the same machine) remains. When a proxied
request lands one engine step after its twin (the proxy delayed it across a step boundary), every difference of
that pair is about one step: such pairs are counted (``step_shifted``) and stay in the percentiles.

Streaming throughput: output chunks per second received through each target during its phase, and the proxy's
CPU cost per relayed chunk (µs/chunk → the chunks/s one core can relay).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from ..load.loadgen import percentile
from ..local.procs import HOST, SIM_MODEL, Proc, Processes, cpu_seconds, free_port
from .goodput import machine

NGINX_CONF = """\
worker_processes 1;
error_log {dir}/error.log warn;
pid {dir}/nginx.pid;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {dir}/tmp-body;
    proxy_temp_path {dir}/tmp-proxy;
    fastcgi_temp_path {dir}/tmp-fastcgi;
    uwsgi_temp_path {dir}/tmp-uwsgi;
    scgi_temp_path {dir}/tmp-scgi;
    upstream sim {{ server {upstream}; keepalive 1024; }}
    server {{
        listen {host}:{port};
        location / {{
            proxy_pass http://sim;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""


def find_nginx(explicit: str | None = None) -> str | None:
    for c in [explicit, shutil.which("nginx"), "/usr/sbin/nginx"]:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def start_nginx(procs: Processes, binary: str, upstream: str) -> Proc:
    d = procs.log_dir / "nginx"
    d.mkdir(parents=True, exist_ok=True)
    port = free_port()
    (d / "nginx.conf").write_text(NGINX_CONF.format(dir=d, upstream=upstream, host=HOST, port=port))
    # foreground (daemon off), own prefix and error log: nothing outside the temp directory is touched
    p = procs.spawn("nginx", [binary, "-p", str(d), "-e", str(d / "error.log"), "-c", str(d / "nginx.conf"),
                              "-g", "daemon off;"], f"http://{HOST}:{port}", role="nginx")
    return p


async def _stream(session: aiohttp.ClientSession, url: str, body: bytes,
                  headers: dict[str, str]) -> tuple[float, list[float], str]:
    """Send at once; return (send time, arrival time of each content chunk, error)."""
    t0 = time.perf_counter()
    times: list[float] = []
    try:
        async with session.post(url + "/v1/completions", data=body, headers=headers) as resp:
            if resp.status != 200:
                return t0, times, f"HTTP {resp.status}"
            buf = b""
            async for chunk in resp.content.iter_any():
                now = time.perf_counter()
                buf += chunk
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    if event.startswith(b"data: {") and b'"text":""' not in event and b'"choices":[]' not in event:
                        times.append(now)
    except Exception as e:  # noqa: BLE001 - reported
        return t0, times, f"{type(e).__name__}: {e}"[:200]
    return t0, times, ""


async def _phase(direct: str, proxy: str, streams: int, rounds: int, tokens: int) -> dict[str, Any]:
    def connector() -> aiohttp.TCPConnector:
        return aiohttp.TCPConnector(limit=0, force_close=False)

    ttft_d: list[float] = []
    ttft_p: list[float] = []
    added_ttft: list[float] = []
    added_chunk: list[float] = []
    errors: list[str] = []
    chunks_p = 0
    body_tpl = {"model": SIM_MODEL, "max_tokens": tokens, "stream": True, "ignore_eos": True}
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector(), timeout=timeout) as sd, \
            aiohttp.ClientSession(connector=connector(), timeout=timeout) as sp:

        async def worker(i: int) -> None:
            nonlocal chunks_p
            await asyncio.sleep(random.random() * 0.5)  # spread the first arrivals
            for r in range(rounds):
                body = json.dumps({**body_tpl, "prompt": f"stream {i} round {r}: say something about routers"}
                                  ).encode()
                hd = {"Content-Type": "application/json", "X-Request-Id": f"d-{i}-{r}"}
                hp = {"Content-Type": "application/json", "X-Request-Id": f"p-{i}-{r}"}
                (t0d, cd, ed), (t0p, cp, ep) = await asyncio.gather(_stream(sd, direct, body, hd),
                                                                    _stream(sp, proxy, body, hp))
                if ed or ep or not cd or not cp:
                    errors.append(ed or ep or "no chunks")
                    continue
                chunks_p += len(cp)
                ttft_d.append(cd[0] - t0d)
                ttft_p.append(cp[0] - t0p)
                added_ttft.append((cp[0] - t0p) - (cd[0] - t0d))
                added_chunk.extend(b - a for a, b in zip(cd[1:], cp[1:], strict=False))  # pairs only

        t_start = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(streams)))
        wall = time.perf_counter() - t_start
    return {"ttft_direct": ttft_d, "ttft_proxied": ttft_p, "added_ttft": added_ttft, "added_chunk": added_chunk,
            "errors": errors, "chunks_proxied": chunks_p, "wall": wall}


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 3)


def _summ(ph: dict[str, Any], step_wall_s: float) -> dict[str, Any]:
    shifted = sum(1 for x in ph["added_ttft"] if abs(x) > step_wall_s / 2)
    return {
        "pairs": len(ph["added_ttft"]), "errors": len(ph["errors"]), "errors_sample": sorted(set(ph["errors"]))[:3],
        "ttft_direct_p50_ms": _ms(percentile(ph["ttft_direct"], 0.5)),
        "ttft_direct_p99_ms": _ms(percentile(ph["ttft_direct"], 0.99)),
        "ttft_proxied_p50_ms": _ms(percentile(ph["ttft_proxied"], 0.5)),
        "ttft_proxied_p99_ms": _ms(percentile(ph["ttft_proxied"], 0.99)),
        "added_ttft_p50_ms": _ms(percentile(ph["added_ttft"], 0.5)),
        "added_ttft_p99_ms": _ms(percentile(ph["added_ttft"], 0.99)),
        "added_chunk_p50_ms": _ms(percentile(ph["added_chunk"], 0.5)),
        "added_chunk_p99_ms": _ms(percentile(ph["added_chunk"], 0.99)),
        "step_shifted_pairs": shifted,
        "chunks_per_s": round(ph["chunks_proxied"] / ph["wall"], 1) if ph["wall"] else None,
        "wall_s": round(ph["wall"], 1),
    }


def run(streams: int = 500, rounds: int = 3, tokens: int = 64, time_scale: float = 8.0,
        targets: list[str] | tuple[str, ...] = ("direct", "router", "nginx"), nginx: str | None = None,
        out: Path | None = None, progress: Callable[[str], None] = print) -> dict[str, Any]:
    started = datetime.now(UTC)
    rows: dict[str, Any] = {}
    nginx_bin = find_nginx(nginx) if "nginx" in targets else None
    if "nginx" in targets and nginx_bin is None:
        progress("[router-bench] nginx not found (run hack/ensure-nginx.sh): skipping the nginx target")
    with Processes() as procs:
        sim = procs.sim("decode", time_scale=time_scale, extra=["--max-num-seqs", str(max(256, 2 * streams + 64))])
        procs.wait_ready(sim)
        conf = procs.log_dir / "router.yaml"
        conf.write_text(yaml.safe_dump({"model": SIM_MODEL}))
        proxies: dict[str, Proc] = {}
        if "router" in targets:
            proxies["router"] = procs.router(conf, decode=[sim.url])
        if nginx_bin:
            proxies["nginx"] = start_nginx(procs, nginx_bin, sim.url.removeprefix("http://"))
        for p in proxies.values():
            procs.wait_ready(p, "/health")
        # one decode step of this batch, in wall seconds (to recognise step-shifted pairs)
        from ..sim.perf import PerfModel

        step_wall = PerfModel.from_names().decode_step_time(2 * streams, 64 + tokens) * time_scale
        for name, p in proxies.items():
            progress(f"[router-bench] {name}: {streams} concurrent paired streams × {rounds} rounds "
                     f"× {tokens} tokens ...")
            pid = [p.proc.pid]
            sim_pid = [sim.proc.pid]
            c0, s0, me0 = cpu_seconds(pid), cpu_seconds(sim_pid), time.process_time()
            ph = asyncio.run(_phase(sim.url, p.url, streams, rounds, tokens))
            cpu = cpu_seconds(pid) - c0
            row = _summ(ph, step_wall)
            row["proxy_cpu_s"] = round(cpu, 2)
            row["proxy_cpu_util"] = round(cpu / ph["wall"], 3) if ph["wall"] else None
            row["proxy_us_per_chunk"] = round(cpu / ph["chunks_proxied"] * 1e6, 1) if ph["chunks_proxied"] else None
            row["relay_capacity_chunks_per_core_s"] = round(1e6 / row["proxy_us_per_chunk"]) \
                if row["proxy_us_per_chunk"] else None
            row["sim_cpu_util"] = round((cpu_seconds(sim_pid) - s0) / ph["wall"], 3) if ph["wall"] else None
            row["client_cpu_util"] = round((time.process_time() - me0) / ph["wall"], 3) if ph["wall"] else None
            rows[name] = row
            progress(f"[router-bench] {name}: added TTFT p50 {row['added_ttft_p50_ms']} ms p99 "
                     f"{row['added_ttft_p99_ms']} ms; per chunk p50 {row['added_chunk_p50_ms']} ms p99 "
                     f"{row['added_chunk_p99_ms']} ms; {row['chunks_per_s']} chunks/s; errors {row['errors']}")
        if "direct" in targets and rows:
            # the direct twins of every phase: the baseline figures
            first = next(iter(rows.values()))
            rows = {"direct": {"ttft_p50_ms": first["ttft_direct_p50_ms"], "ttft_p99_ms": first["ttft_direct_p99_ms"],
                               "chunks_per_s": first["chunks_per_s"]}, **rows}
    result = {"benchmark": "router", "date": started.isoformat(timespec="seconds"), "machine": machine(),
              "settings": {"streams": streams, "rounds": rounds, "tokens": tokens, "time_scale": time_scale,
                           "step_wall_ms": round(step_wall * 1000, 1), "nginx": nginx_bin,
                           "nginx_worker_processes": 1},
              "rows": rows, "targets": _targets(rows)}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
    return result


def _targets(rows: dict[str, Any]) -> dict[str, Any]:
    r, n = rows.get("router"), rows.get("nginx")
    if not r or r["added_ttft_p50_ms"] is None:
        return {}
    t: dict[str, Any] = {"added_p50_le_1ms": r["added_ttft_p50_ms"] <= 1.0,
                         "added_p99_le_5ms": r["added_ttft_p99_ms"] <= 5.0}
    if n and n["added_ttft_p50_ms"] is not None:
        # "within 2× of nginx": compared on p50 and p99 of the added TTFT (floored at 0.1 ms: below that the
        # difference is measurement noise)
        t["within_2x_nginx_p50"] = r["added_ttft_p50_ms"] <= 2 * max(n["added_ttft_p50_ms"], 0.1)
        t["within_2x_nginx_p99"] = r["added_ttft_p99_ms"] <= 2 * max(n["added_ttft_p99_ms"], 0.1)
    return t


def table(result: dict[str, Any]) -> str:
    rows = result["rows"]
    s = result["settings"]
    lines = [f"router benchmark: {s['streams']} concurrent streams (each paired with a direct twin), {s['rounds']} "
             f"rounds × {s['tokens']} tokens, sim time-scale {s['time_scale']} (engine step ≈ {s['step_wall_ms']} "
             f"ms wall)"]
    head = (f"{'target':<8} {'pairs':>6} {'err':>4} {'TTFT p50':>9} {'TTFT p99':>9} {'+TTFT p50':>10} "
            f"{'+TTFT p99':>10} {'+chunk p50':>11} {'+chunk p99':>11} {'shifted':>8} {'chunks/s':>9} "
            f"{'proxy cpu':>9} {'us/chunk':>9}")
    lines += [head, "-" * len(head)]

    def f(v: Any, w: int) -> str:
        return ("-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))).rjust(w)

    for name, r in rows.items():
        if name == "direct":
            lines.append(f"{name:<8} {f(None, 6)} {f(None, 4)} {f(r['ttft_p50_ms'], 9)} {f(r['ttft_p99_ms'], 9)} "
                         f"{f(0.0, 10)} {f(0.0, 10)} {f(0.0, 11)} {f(0.0, 11)} {f(None, 8)} "
                         f"{f(r['chunks_per_s'], 9)} {f(None, 9)} {f(None, 9)}")
            continue
        lines.append(f"{name:<8} {f(r['pairs'], 6)} {f(r['errors'], 4)} {f(r['ttft_proxied_p50_ms'], 9)} "
                     f"{f(r['ttft_proxied_p99_ms'], 9)} {f(r['added_ttft_p50_ms'], 10)} "
                     f"{f(r['added_ttft_p99_ms'], 10)} {f(r['added_chunk_p50_ms'], 11)} "
                     f"{f(r['added_chunk_p99_ms'], 11)} {f(r['step_shifted_pairs'], 8)} {f(r['chunks_per_s'], 9)} "
                     f"{f(r['proxy_cpu_util'], 9)} {f(r['proxy_us_per_chunk'], 9)}")
    t = result.get("targets") or {}
    if t:
        lines.append("")
        lines.append("targets: " + ", ".join(f"{k}: {'MET' if v else 'MISSED'}" for k, v in t.items()))
    return "\n".join(lines)
