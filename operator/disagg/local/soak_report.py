"""What the soak (soak.py ``Soak``) found, and the figures derived from it (``SoakReport.figures``): every request's
result, the router's log line for each, the faults with their windows, the mode and scale history, the children
before and after; e2e/test_soak.py asserts on it and ``disagg bench soak`` writes it to docs/results/soak.json."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..load import loadgen
from .harness import POOLS


@dataclass
class Fault:
    name: str
    start: float  # wall clock (time.time())
    end: float = 0.0  # recovered (the component serves again)
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class SoakReport:
    settings: dict[str, Any]
    started: float
    ended: float
    faults: list[Fault]
    results: list[loadgen.Result]
    router_log: dict[str, dict[str, Any]]  # request id → the router's request log line
    mode_events: list[tuple[float, str, str]]  # (wall time, mode, message) of ModeChanged Events in the soak
    scale_events: list[tuple[float, str, int, int, str]]  # (wall time, pool, from, to, message) of Scaled Events
    timeline_modes: list[str]
    last_scale_changes: dict[str, int]  # distinct lastScale records seen per pool during the soak
    children: dict[str, dict[str, list[tuple[str, str]]]]  # "start" | "after-operator-restart" | "end" → children
    replicas_after_operator_restart: dict[str, dict[str, int]]  # pool → {deployment, desired}
    limits: dict[str, dict[str, int]]  # pool → {min, max}
    interval_s: float
    scale_down_window_s: float  # spec.autoscaling.scaleDownStabilizationSeconds
    max_tokens: dict[str, int]  # request id → max_tokens asked for

    def fault(self, name: str) -> Fault:
        return next(f for f in self.faults if f.name == name)

    # ------------------------------------------------------------------ derived figures
    def failed_before_stream(self) -> list[loadgen.Result]:
        """Failed requests whose client had not received a token: each should have got a fallback or a retry."""
        return [r for r in self.results if not r.ok and not r.streamed]

    def mid_stream_losses(self) -> list[loadgen.Result]:
        return [r for r in self.results if not r.ok and r.streamed]

    def unexplained_mid_stream(self) -> list[dict[str, Any]]:
        """Mid-stream losses not explained by the decode kill: the stream must have been in flight when the decode
        pod was killed, and its decode leg (per the router's log line) on that pod."""
        kill = self.fault("kill-decode")
        worker = kill.detail["worker"]
        out = []
        for r in self.mid_stream_losses():
            line = self.router_log.get(r.id, {})
            if not (r.sent_at <= kill.start <= r.done_at and line.get("decode_worker") == worker):
                out.append({"id": r.id, "class": r.cls, "error": r.error, "sent_at": r.sent_at,
                            "done_at": r.done_at, "router_line": line})
        return out

    def flips(self) -> list[tuple[float, str]]:
        return [(t, mode) for t, mode, _ in self.mode_events]

    def explained_flips(self) -> list[tuple[float, str, str, str | None]]:
        """Each mode change with what explains it (None: nothing). The KV stall explains one flip to Aggregated
        while KV pulls stalled (Event timestamps have 1 s resolution); a flip to Disaggregated is explained as the
        return from an explained flip to Aggregated. Nothing else explains a flip: a prefill pod restarting within
        the mode window is not a fault of disaggregation (autoscaling/mode.py)."""
        stall = self.fault("kv-stall")
        healed = float(stall.detail["healed"])
        out: list[tuple[float, str, str, str | None]] = []
        stall_used = False
        for t, mode, msg in self.mode_events:
            why: str | None = None
            prev = out[-1] if out else None
            if mode == "Aggregated":
                if not stall_used and stall.start - 1 <= t <= healed + 1:
                    why, stall_used = "kv-stall", True
            elif prev is not None and prev[1] == "Aggregated" and prev[3] is not None:
                why = f"return after {prev[3]}"
            out.append((t, mode, msg, why))
        return out

    def unexplained_flips(self) -> list[tuple[float, str, str]]:
        return [(t, m, msg) for t, m, msg, why in self.explained_flips() if why is None]

    def short_answers(self) -> list[tuple[str, int, int]]:
        """Successful answers with fewer tokens than asked for (every request sets ignore_eos): (id, got, asked)."""
        return [(r.id, r.output_tokens, self.max_tokens[r.id]) for r in self.results
                if r.ok and r.output_tokens < self.max_tokens.get(r.id, 0)]

    def scale_events_in(self, start: float, end: float) -> list[tuple[float, str, int, int, str]]:
        return [e for e in self.scale_events if start - 1 <= e[0] <= end + 1]

    def direction_changes(self, pool: str) -> int:
        dirs = [1 if to > frm else -1 for _, p, frm, to, _ in self.scale_events if p == pool]
        return sum(a != b for a, b in itertools.pairwise(dirs))

    def duplicates(self) -> dict[str, dict[str, int]]:
        return {when: {k: len(v) for k, v in kids.items() if len(v) != 1} for when, kids in self.children.items()}

    def figures(self) -> dict[str, Any]:
        res = self.results
        streamed = [r for r in res if r.cls in ("rag", "chat", "stream")]
        ok = [r for r in res if r.ok]
        by_class: dict[str, dict[str, int]] = {}
        for r in res:
            c = by_class.setdefault(r.cls, {"requests": 0, "ok": 0})
            c["requests"] += 1
            c["ok"] += r.ok
        paths: dict[str, int] = {}
        for r in res:
            paths[r.path or "none"] = paths.get(r.path or "none", 0) + 1
        reasons: dict[str, int] = {}
        for r in res:
            if r.decision == "local" or r.path == "fallback":
                key = f"{r.decision}/{r.reason}" + ("/fallback" if r.path == "fallback" else "")
                reasons[key] = reasons.get(key, 0) + 1
        fallback_causes: dict[str, int] = {}
        for line in self.router_log.values():
            if line.get("fallback"):
                fallback_causes[str(line["fallback"])] = fallback_causes.get(str(line["fallback"]), 0) + 1
        per_fault = {}
        for f in self.faults:
            during = [r for r in res if r.sent_at <= f.end and r.done_at >= f.start]
            per_fault[f.name] = {
                "start_s": round(f.start - self.started, 1), "duration_s": round(f.end - f.start, 1),
                # a failure is the fault's when it ended while the fault lasted (a long stream overlaps several)
                "requests_overlapping": len(during),
                "failed": sum(not r.ok and f.start <= r.done_at <= f.end for r in during),
                "fallbacks": sum(r.path == "fallback" for r in during), "retried": sum(r.retries > 0 for r in during),
                **{k: v for k, v in f.detail.items() if k != "healed"},
            }
        scale: dict[str, Any] = {}
        for pool in POOLS:
            evs = [e for e in self.scale_events if e[1] == pool]
            scale[pool] = {"events": [f"{e[0] - self.started:.0f}s {e[2]}→{e[3]}: {e[4]}" for e in evs],
                           "count": len(evs), "direction_changes": self.direction_changes(pool),
                           "last_scale_changes": self.last_scale_changes.get(pool, 0), **self.limits[pool]}
        outage = self.fault("prometheus-outage")
        return {
            "duration_s": round(self.ended - self.started, 1),
            "requests": len(res), "ok": len(ok), "streamed_requests": len(streamed),
            "non_streamed_requests": len(res) - len(streamed),
            "failed_before_first_token": len(self.failed_before_stream()),
            "short_answers": len(self.short_answers()),
            "mid_stream_losses": len(self.mid_stream_losses()),
            "mid_stream_losses_unexplained": len(self.unexplained_mid_stream()),
            "mid_stream_loss_errors": _count(r.error[:60] for r in self.mid_stream_losses()),
            "connect_retries": sum(r.retries for r in res), "requests_retried": sum(r.retries > 0 for r in res),
            "paths": paths, "local_and_fallback_reasons": reasons, "fallback_causes": fallback_causes,
            "by_class": by_class,
            "ttft_p50_ms": _ms(loadgen.percentile([r.ttft_s for r in ok], 0.5)),
            "ttft_p95_ms": _ms(loadgen.percentile([r.ttft_s for r in ok], 0.95)),
            "faults": per_fault,
            "mode_history": [f"{t - self.started:.0f}s {msg} [{why or 'UNEXPLAINED'}]"
                             for t, _, msg, why in self.explained_flips()],
            "mode_flips_unexplained": len(self.unexplained_flips()),
            "timeline_modes": self.timeline_modes,
            "scale": scale,
            "scale_events_during_prometheus_outage": len(self.scale_events_in(outage.start,
                                                                              outage.end + self.interval_s)),
            "duplicate_children": self.duplicates(),
            "children_recreated_by_operator_restart": sorted(
                set(map(tuple, _flat(self.children["start"]))) ^ set(map(tuple, _flat(
                    self.children["after-operator-restart"])))),
            "replicas_after_operator_restart": self.replicas_after_operator_restart,
        }

    def to_json(self) -> dict[str, Any]:
        return {"settings": self.settings, "figures": self.figures(),
                "faults": [asdict(f) for f in self.faults],
                "mid_stream_losses": [{"id": r.id, "class": r.cls, "error": r.error,
                                       "decode_worker": self.router_log.get(r.id, {}).get("decode_worker")}
                                      for r in self.mid_stream_losses()],
                "failed_before_first_token": [asdict(r) for r in self.failed_before_stream()]}


def _flat(kids: dict[str, list[tuple[str, str]]]) -> list[tuple[str, str, str]]:
    return [(k, name, uid) for k, v in kids.items() for name, uid in v]


def _count(keys: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in keys:
        out[k] = out.get(k, 0) + 1
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)
