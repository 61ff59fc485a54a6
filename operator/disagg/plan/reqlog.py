"""The router's request log as an interface: read it (schema 1 and 2), replay it, build a traffic profile from it.

The router writes one JSON line per request (router/accounting.py ``Accounting.finish`` → ``RequestLog``; event
``request``). docs/planning.md "The request log" documents both schemas; in short:

* **schema 1** (no ``log_schema`` key; what the router writes today): ``timestamp`` (ISO, UTC, when the request
  ended), ``request_id``, ``tenant``, ``stream``, ``input_tokens`` (the router's count), ``output_tokens``,
  ``decision``, ``reason``, ``path``, ``fallback``, ``outcome``, ``status``, ``timings_ms`` (``e2e``, ``ttft``,
  ``tpot``, …). Arrival = timestamp − ``timings_ms.e2e``; no prefix information (replay shares no prefixes);
  ``max_tokens`` unknown (replay generates ``output_tokens``).
* **schema 2** (``log_schema: 2``): schema 1 plus ``arrival_unix`` (float seconds, when the router received the
  request), ``max_tokens`` (as the client sent it; null when absent), ``prefix_hash`` (hex; requests with the same
  value share their first ``prefix_tokens`` tokens; null when the prompt shares nothing the router has seen) and
  ``prefix_tokens``.

Lines that are not request lines (other log events, other JSON, garbage) are skipped and counted; a log with no
usable line is an error that says what a usable line needs.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..twin import Arrival
from .burst import measure as measure_burstiness
from .burst import peak_rate

SCHEMAS = (1, 2)
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
HIST_BINS = 16


class LogError(ValueError):
    """A request log that cannot be used; ``str()`` says why and what a usable line needs."""


@dataclass(frozen=True)
class LogRequest:
    """One request line, normalised across schemas."""

    line: int
    schema: int
    request_id: str
    arrival: float  # unix seconds
    tenant: str
    input_tokens: int
    output_tokens: int | None
    max_tokens: int | None
    stream: bool
    decision: str
    reason: str
    path: str
    fallback: str | None
    outcome: str
    status: int | None
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    prefix_hash: str | None = None
    prefix_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.outcome == "ok" or (self.outcome == "" and self.status == 200)


@dataclass
class RequestLogData:
    requests: list[LogRequest]
    skipped: dict[str, int] = field(default_factory=dict)
    schemas: dict[int, int] = field(default_factory=dict)
    source: str = ""

    @property
    def span_s(self) -> float:
        if len(self.requests) < 2:
            return 0.0
        return self.requests[-1].arrival - self.requests[0].arrival


def _ts(value: Any) -> float | None:
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(float(value)) else None


def parse_line(obj: Any, lineno: int) -> LogRequest | str:
    """A LogRequest, or the reason the line is not usable (a short key for the skipped counts)."""
    if not isinstance(obj, dict):
        return "not a JSON object"
    if obj.get("event", "request") != "request":
        return "other log event"
    schema = obj.get("log_schema", 1)
    if schema not in SCHEMAS:
        return f"unknown log_schema {schema!r}"
    n_in = _num(obj.get("input_tokens"))
    if n_in is None or n_in < 1:
        return "no input_tokens"
    raw_t = obj.get("timings_ms")
    timings: dict[str, Any] = raw_t if isinstance(raw_t, dict) else {}
    e2e = _num(timings.get("e2e"))
    if schema == 2:
        arrival = _ts(obj.get("arrival_unix"))
        if arrival is None:
            return "schema 2 without arrival_unix"
    else:
        end = _ts(obj.get("timestamp"))
        if end is None:
            return "no timestamp"
        if e2e is None:
            return "no timings_ms.e2e (arrival = timestamp - e2e)"
        arrival = end - e2e / 1000.0
    n_out = _num(obj.get("output_tokens"))
    max_tokens = _num(obj.get("max_tokens")) if schema == 2 else None
    ph = obj.get("prefix_hash") if schema == 2 else None
    pt = _num(obj.get("prefix_tokens")) if schema == 2 else None
    status = _num(obj.get("status"))
    return LogRequest(
        line=lineno, schema=int(schema), request_id=str(obj.get("request_id") or f"line-{lineno}"), arrival=arrival,
        tenant=str(obj.get("tenant") or "default"), input_tokens=int(n_in),
        output_tokens=int(n_out) if n_out is not None and n_out >= 1 else None,
        max_tokens=int(max_tokens) if max_tokens is not None and max_tokens >= 1 else None,
        stream=bool(obj.get("stream", True)), decision=str(obj.get("decision") or ""),
        reason=str(obj.get("reason") or ""), path=str(obj.get("path") or "none"),
        fallback=obj.get("fallback") if isinstance(obj.get("fallback"), str) else None,
        outcome=str(obj.get("outcome") or ""), status=int(status) if status is not None else None,
        ttft_ms=_num(timings.get("ttft")), tpot_ms=_num(timings.get("tpot")), e2e_ms=e2e,
        prefix_hash=str(ph) if isinstance(ph, str) and ph and pt else None,
        prefix_tokens=int(pt) if isinstance(ph, str) and ph and pt else 0)


def read_lines(lines: Iterable[str], source: str = "log") -> RequestLogData:
    out = RequestLogData([], source=source)
    for i, raw in enumerate(lines, 1):
        raw = raw.strip()
        if not raw:
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            got: LogRequest | str = "not JSON"
        else:
            got = parse_line(obj, i)
        if isinstance(got, str):
            out.skipped[got] = out.skipped.get(got, 0) + 1
        else:
            out.requests.append(got)
            out.schemas[got.schema] = out.schemas.get(got.schema, 0) + 1
    if not out.requests:
        why = ", ".join(f"{v} {k}" for k, v in sorted(out.skipped.items())) or "the file is empty"
        raise LogError(f"{source}: no usable request line ({why}); a usable line is the router's JSON request log "
                       "line (event: request) with input_tokens and either timestamp + timings_ms.e2e (schema 1) or "
                       "log_schema: 2 + arrival_unix (docs/planning.md, \"The request log\")")
    out.requests.sort(key=lambda r: (r.arrival, r.line))
    return out


def read_log(path: Path) -> RequestLogData:
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            return read_lines(f, str(path))
    except OSError as e:
        raise LogError(f"{path}: {e.strerror or e}") from None


# ------------------------------------------------------------------------------------------------ replay


def arrivals(log: RequestLogData, *, limit: int | None = None) -> tuple[list[Arrival], dict[str, int]]:
    """The log's requests as twin arrivals (times relative to the first), and what was left out and why.

    Output tokens: what the request generated when it succeeded, else the client's ``max_tokens`` (schema 2);
    a request with neither cannot be replayed (it is counted in the second value)."""
    reqs = log.requests[:limit] if limit else log.requests
    t0 = reqs[0].arrival
    out: list[Arrival] = []
    left: dict[str, int] = {}
    for r in reqs:
        n_out = r.output_tokens if r.ok and r.output_tokens else r.max_tokens
        if not n_out:
            left["no output_tokens or max_tokens"] = left.get("no output_tokens or max_tokens", 0) + 1
            continue
        out.append(Arrival(at=max(0.0, r.arrival - t0), input_tokens=r.input_tokens, output_tokens=n_out,
                           tenant=None if r.tenant == "default" else r.tenant, prefix_key=r.prefix_hash,
                           prefix_tokens=min(r.prefix_tokens, r.input_tokens), request_id=r.request_id,
                           cls=r.tenant, stream=r.stream, max_tokens_known=r.max_tokens is not None))
    out.sort(key=lambda a: a.at)
    return out, left


# ------------------------------------------------------------------------------------- profile from a log


def histogram(values: list[int], bins: int = HIST_BINS) -> list[dict[str, float]]:
    """Equal-mass bins of the sorted values, each ``{tokens: its mean (rounded), share}``; equal token values are
    merged. Keeps the mean (to rounding) and the shape the planner bins again (plan/model.py)."""
    xs = sorted(values)
    n = len(xs)
    out: dict[int, float] = {}
    for k in range(min(bins, n)):
        lo, hi = k * n // min(bins, n), (k + 1) * n // min(bins, n)
        chunk = xs[lo:hi]
        if not chunk:
            continue
        tok = max(1, round(sum(chunk) / len(chunk)))
        out[tok] = out.get(tok, 0.0) + len(chunk) / n
    return [{"tokens": t, "share": round(s, 6)} for t, s in sorted(out.items())]


def rates(times: list[float], window_s: float) -> tuple[float, float, float]:
    """(mean req/s over the span, peak req/s over any ``window_s`` window, the window used). A log shorter than two
    windows uses a tenth of its span as the window."""
    if len(times) < 2:
        raise LogError("the log has one request: a rate needs at least two arrivals")
    span = times[-1] - times[0]
    if span <= 0:
        raise LogError("every request in the log arrived at the same instant: no rate can be derived")
    mean = (len(times) - 1) / span
    w = window_s if span >= 2 * window_s else span / 10
    return mean, max(peak_rate(times, w), mean), w


def tenant_name(name: str) -> str:
    s = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63].strip("-")
    return s or "default"


def traffic_from_log(log: RequestLogData, window_s: float = 60.0) -> tuple[dict[str, Any], list[str]]:
    """The profile's ``traffic`` section (camelCase dict) from a log, and notes on how it was derived."""
    reqs = log.requests
    ok = [r for r in reqs if r.ok and r.output_tokens]
    if not ok:
        raise LogError(f"{log.source}: no successful request with output_tokens: the output distribution needs "
                       "requests that finished (outcome ok)")
    mean, peak, w = rates([r.arrival for r in reqs], window_s)
    traffic: dict[str, Any] = {
        "inputTokens": {"histogram": histogram([r.input_tokens for r in ok])},
        "outputTokens": {"histogram": histogram([r.output_tokens or 1 for r in ok])},
        "rate": {"meanRps": round(mean, 4), "peakRps": round(peak, 4)},
    }
    notes = [f"{len(reqs)} requests over {log.span_s:.0f} s ({len(ok)} successful give the token distributions); "
             f"rate mean {mean:.3g} req/s, peak {peak:.3g} req/s over {w:.3g} s windows"]
    burst, why = measure_burstiness([r.arrival for r in reqs])
    # a short-window peak is at least the mean over the span (the busiest window is at least average)
    burst = {k: (max(v, round(mean, 4)) if k.startswith("peakRps") else v) for k, v in burst.items()}
    if burst:
        traffic["burstiness"] = burst
        notes.append("burstiness: " + ", ".join(f"{k} {v:g}" for k, v in burst.items()))
    notes += [f"burstiness: {x}" for x in why]
    with_prefix = [r for r in ok if r.schema == 2]
    if with_prefix:
        share = sum(r.prefix_tokens for r in with_prefix) / sum(r.input_tokens for r in with_prefix)
        traffic["prefixCacheHitShare"] = round(min(share, 0.99), 4)
        notes.append(f"prefix-cache share {share:.1%} from prefix_tokens of {len(with_prefix)} schema-2 lines")
    else:
        notes.append("no prefix information in the log (schema 1): prefixCacheHitShare 0")
    names = sorted({r.tenant for r in ok})
    if len(names) > 1:
        tenants = []
        used: set[str] = set()
        for name in names:
            mine = [r for r in ok if r.tenant == name]
            tn = tenant_name(name)
            while tn in used:
                tn = (tn[:60] + "-x")
            used.add(tn)
            t: dict[str, Any] = {"name": tn, "share": round(len(mine) / len(ok), 6),
                                 "inputTokens": {"histogram": histogram([r.input_tokens for r in mine])},
                                 "outputTokens": {"histogram": histogram([r.output_tokens or 1 for r in mine])}}
            if with_prefix:
                m2 = [r for r in mine if r.schema == 2]
                if m2:
                    t["prefixCacheHitShare"] = round(min(0.99, sum(r.prefix_tokens for r in m2)
                                                         / sum(r.input_tokens for r in m2)), 4)
            tenants.append(t)
        traffic["tenants"] = tenants[:16]
        shares = ", ".join(f"{t['name']} {t['share']:.0%}" for t in tenants)
        notes.append(f"tenants: {shares}")
    return traffic, notes


def summary(log: RequestLogData, slo_ttft_ms: float, slo_tpot_ms: float) -> dict[str, Any]:
    """What the log itself says happened (the 'recorded' column of ``disagg replay``)."""
    from .verify import pct

    reqs = log.requests
    ok = [r for r in reqs if r.ok]
    met = [r for r in ok if (r.ttft_ms is None or r.ttft_ms <= slo_ttft_ms)
           and (r.tpot_ms is None or r.tpot_ms <= slo_tpot_ms)]
    paths: dict[str, int] = {}
    decisions: dict[str, int] = {}
    fallbacks: dict[str, int] = {}
    for r in reqs:
        paths[r.path] = paths.get(r.path, 0) + 1
        decisions[f"{r.decision}:{r.reason}"] = decisions.get(f"{r.decision}:{r.reason}", 0) + 1
        if r.fallback:
            fallbacks[r.fallback] = fallbacks.get(r.fallback, 0) + 1
    per_path: dict[str, dict[str, float]] = {}
    for path in sorted({r.path for r in ok}):
        xs = [r for r in ok if r.path == path]
        tt = [r.ttft_ms for r in xs if r.ttft_ms is not None]
        tp = [r.tpot_ms for r in xs if r.tpot_ms is not None]
        per_path[path] = {"requests": len(xs), "ttft_p50_ms": pct(tt, 0.5), "ttft_p95_ms": pct(tt, 0.95),
                          "ttft_p99_ms": pct(tt, 0.99), "tpot_p50_ms": pct(tp, 0.5), "tpot_p95_ms": pct(tp, 0.95),
                          "tpot_p99_ms": pct(tp, 0.99)}
    span = max(log.span_s, 1e-9)
    return {"requests": len(reqs), "attainment": len(met) / len(reqs), "goodput_rps": len(met) / span,
            "errors": len(reqs) - len(ok), "paths": dict(sorted(paths.items())),
            "decisions": dict(sorted(decisions.items())), "fallbacks": dict(sorted(fallbacks.items())),
            "ttft_p95_ms": pct([r.ttft_ms for r in ok if r.ttft_ms is not None], 0.95),
            "tpot_p95_ms": pct([r.tpot_ms for r in ok if r.tpot_ms is not None], 0.95),
            "per_path": per_path, "window_s": span}


def log_lines(records: Iterable[Any], t0_unix: float, schema: int = 2,
              prefix: dict[str, tuple[str, int]] | None = None, max_tokens: bool = True) -> list[str]:
    """Request log lines as the router writes them (the keys of accounting.py ``Accounting.finish``), from twin
    records (disagg.twin RequestRecord) — for tests, examples and the accuracy benchmark. Schema 2 adds
    ``log_schema``, ``arrival_unix``, ``max_tokens`` and the prefix fields (``prefix``: request id → (hash,
    tokens))."""
    out = []
    for r in records:
        timings: dict[str, float] = {}
        if r.ttft_s is not None:
            timings["ttft"] = round(r.ttft_s * 1000, 3)
        if r.tpot_s is not None:
            timings["tpot"] = round(r.tpot_s * 1000, 3)
        e2e = r.e2e_s if r.e2e_s is not None else 0.0
        timings["e2e"] = round(e2e * 1000, 3)
        end = t0_unix + r.arrival_s + e2e
        line: dict[str, Any] = {
            "request_id": r.request_id, "upstream_request_id": r.request_id, "endpoint": "/v1/chat/completions",
            "tenant": r.tenant, "stream": True, "input_tokens": r.router_input_tokens,
            "output_tokens": r.output_tokens if r.ok else None, "decision": r.decision, "reason": r.reason,
            "path": r.path, "fallback": r.fallback, "probe": False, "prefill_worker": r.prefill_worker,
            "decode_worker": r.decode_worker, "outcome": "ok" if r.ok else "upstream_error", "status": r.status,
            "timings_ms": timings, "estimated": [], "trace_id": None, "event": "request", "level": "info",
            "timestamp": datetime.fromtimestamp(end, tz=UTC).isoformat().replace("+00:00", "Z")}
        if schema == 2:
            ph, pt = (prefix or {}).get(r.request_id, (None, 0))
            line.update({"log_schema": 2, "arrival_unix": round(t0_unix + r.arrival_s, 6),
                         "max_tokens": r.output_tokens if max_tokens else None, "prefix_hash": ph,
                         "prefix_tokens": pt})
        out.append(json.dumps(line))
    return out


# ------------------------------------------------------------------------------------- --arrivals FILE


def read_times(lines: Iterable[str], source: str) -> list[float]:
    """Arrival times, one per line: seconds (unix or relative, float) or ISO 8601; blank lines and ``#`` comments
    skipped. Returned sorted and relative to the first. LogError naming the line on anything else."""
    out: list[float] = []
    for i, raw in enumerate(lines, 1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            t: float | None = float(text)
        except ValueError:
            t = _ts(text)
        if t is None or not math.isfinite(t):
            raise LogError(f"{source}: line {i}: {text[:40]!r} is not an arrival time (seconds, e.g. 1712.25, or "
                           "ISO 8601, e.g. 2026-01-01T00:00:00.25Z)")
        out.append(t)
    if len(out) < 2:
        raise LogError(f"{source}: {len(out)} arrival time{'s' if len(out) != 1 else ''}: verifying on recorded "
                       "arrivals needs at least two")
    out.sort()
    return [t - out[0] for t in out]


def read_arrivals_file(path: Path) -> tuple[list[float], RequestLogData | None]:
    """``--arrivals FILE``: the router's request log (JSON lines: its arrivals with their tokens) or a list of
    arrival times. Returns the times (from 0) and the log when it was one."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise LogError(f"--arrivals {path}: {e.strerror or e}") from None
    first = next((x.strip() for x in text.splitlines() if x.strip() and not x.strip().startswith("#")), "")
    if first.startswith("{"):
        log = read_lines(text.splitlines(), f"--arrivals {path}")
        t0 = log.requests[0].arrival
        return [r.arrival - t0 for r in log.requests], log
    return read_times(text.splitlines(), f"--arrivals {path}"), None
