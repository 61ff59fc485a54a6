"""Soak (issue 12 §7): under steady mixed load, every component fails once — a prefill pod and a decode pod are
killed, KV pulls stall, Prometheus goes away for two autoscaler intervals, the operator and the router restart —
and nothing is lost: no request fails before its first token, mid-stream losses come only from the decode kill
and only for streams on that pod, no child is duplicated or re-created, scaling does not thrash, and the mode
history has exactly the flips the faults explain. The driver is :mod:`disagg.local.soak` (also
``disagg bench soak``, whose figures are in docs/benchmarks.md R2).

Set ``DISAGG_SOAK_OUT=path.json`` to keep the figures; they are always written to the test's log directory.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from disagg.local.harness import POOLS, REAL_TIME, serving, started_stack
from disagg.local.soak import SOAK_OVERRIDES, Soak
from disagg.local.soak_report import SoakReport

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def soak(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SoakReport]:
    logs = tmp_path_factory.mktemp("soak-logs")
    with started_stack("soak", logs, sim_env=REAL_TIME) as stack:
        with serving(stack, SOAK_OVERRIDES) as model:
            report = Soak(model, say=lambda m: print(f"soak: {m}", file=sys.stderr, flush=True)).run()
        doc = json.dumps(report.to_json(), indent=1, default=str)
        (logs / "soak.json").write_text(doc)
        if out := os.environ.get("DISAGG_SOAK_OUT"):
            Path(out).write_text(doc)
        print(f"soak figures: {logs / 'soak.json'}\n{json.dumps(report.figures(), indent=1)}", file=sys.stderr)
        yield report


def test_nothing_lost_before_the_first_token(soak: SoakReport) -> None:
    """Every request that failed before a token reached its client should have had a fallback or a retry."""
    # (a new router pod is Ready only once it knows a decode worker: its readinessProbe is /ready)
    failed = [(r.id, r.cls, r.status, r.error, r.path, r.router) for r in soak.failed_before_stream()]
    assert failed == []
    assert soak.short_answers() == []  # no answer came back shorter than asked (every request sets ignore_eos)
    # the load was mixed, and the faults were exercised
    assert {"rag", "rag-whole", "chat", "completion", "stream"} <= {r.cls for r in soak.results}
    assert {"remote", "local"} <= {r.decision for r in soak.results}
    assert sum(r.path == "fallback" for r in soak.results) > 0


def test_mid_stream_losses_are_explained_by_the_decode_kill(soak: SoakReport) -> None:
    kill = soak.fault("kill-decode")
    assert kill.detail["running_at_kill"] >= 3, kill  # streams were in flight on the killed pod
    assert soak.unexplained_mid_stream() == []


def test_no_duplicate_or_recreated_children(soak: SoakReport) -> None:
    for when, kids in soak.children.items():
        assert {k: len(v) for k, v in kids.items() if len(v) != 1} == {}, when
        for pool in (*POOLS, "router"):
            assert len(kids.get(f"Deployment/{pool}", [])) == 1, (when, kids)
    # the operator restart re-created nothing (same names and uids), and neither did the rest of the soak
    assert soak.children["after-operator-restart"] == soak.children["start"]
    assert soak.children["end"] == soak.children["start"]
    # and it did not reset the autoscaler's replicas to the spec's
    for pool, r in soak.replicas_after_operator_restart.items():
        assert r["deployment"] == r["desired"], (pool, r)


def test_scaling_does_not_thrash(soak: SoakReport) -> None:
    outage = soak.fault("prometheus-outage")
    # Prometheus away: the operator holds every pool where it is
    assert soak.scale_events_in(outage.start, outage.end + soak.interval_s) == []
    # and the gap restarts the scale-down watch: no pool shrinks until a whole window is watched after it (the
    # first sample after the outage is at most an interval before its end)
    shrinks = [e for e in soak.scale_events_in(outage.start, outage.end + soak.scale_down_window_s
                                               - soak.interval_s - 1) if e[3] < e[2]]
    assert shrinks == []
    for pool in POOLS:
        events = [e for e in soak.scale_events if e[1] == pool]
        lim = soak.limits[pool]
        assert soak.direction_changes(pool) <= 1, events  # no up-down-up under a steady load
        assert len(events) <= lim["max"] - lim["min"] + 1, events
        # the status's lastScale (sampled once a second) tells the same story
        assert soak.last_scale_changes[pool] <= lim["max"] - lim["min"] + 1, (pool, soak.last_scale_changes)


def test_mode_history_has_only_the_flips_the_faults_explain(soak: SoakReport) -> None:
    # the prefill kill explains no flip: its pod is back within the mode window (autoscaling/mode.py)
    assert soak.unexplained_flips() == [], (soak.explained_flips(), [(f.name, f.start, f.end) for f in soak.faults])
    assert soak.timeline_modes == ["Disaggregated"] + [m for _, m in soak.flips()]
    stall = soak.fault("kv-stall")
    stall_flips = [why for _, _, _, why in soak.explained_flips() if why == "kv-stall"]
    assert len(stall_flips) == int(stall.detail["flipped"]), (soak.explained_flips(), stall)


def test_router_restart_lost_nothing(soak: SoakReport) -> None:
    restart = soak.fault("router-restart")
    new = [r for r in soak.results if r.sent_at >= restart.end]
    assert new and all(r.ok for r in new)
    assert restart.detail["new_pod"] != restart.detail["pod"]
