"""The whole loop, headless, with assertions: real control plane + operator + local pod runtime (sims, router)
+ real Prometheus. Route per request, fall back with zero client errors, flip to Aggregated and back, and scale
prefill and decode independently (issue 6 integration, issue 8 e2e)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from disagg.demo.acts import run_loop
from disagg.local.harness import REAL_TIME, ModelHarness, serving, started_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelHarness]:
    with (started_stack("e2e", tmp_path_factory.mktemp("e2e-logs"), sim_env=REAL_TIME) as stack,
          serving(stack) as model):
        yield model


def test_the_loop(demo: ModelHarness) -> None:
    out = run_loop(demo, quick=True)

    mixed = out.mixed
    assert mixed.summary.errors == 0
    decisions = {r.decision for r in mixed.results}
    assert {"remote", "local"} <= decisions, decisions  # conditional: both paths taken on a mixed workload
    reasons = {r.reason for r in mixed.results if r.decision == "local"}
    assert "short_prompt" in reasons
    # the first act started once both pools served: no request saw a starting pool or a start-up flip
    assert not reasons & {"prefill_pool_starting", "mode_aggregated"}, reasons

    # KV transfers stalled: requests fell back, none failed, and the operator flipped the mode and back
    faulty = out.faulty
    assert faulty.summary.errors == 0
    assert any(r.path == "fallback" for r in faulty.results), [(r.decision, r.path) for r in faulty.results]
    modes = demo.timeline.modes()
    assert modes[:3] == ["Disaggregated", "Aggregated", "Disaggregated"], modes
    assert out.healed.summary.errors == 0

    # load steps: on long prompts prefill scales before decode (decode may follow: it must hold their KV; in the
    # tick prefill grows, decode's TPOT — stalled by the prefill pool's spill and its released queue — is the
    # prefill pool's signal, policy.py); on long outputs decode scales before prefill
    grew = out.long_prompts.first_growth_s
    assert grew["prefill"] is not None, out.long_prompts
    assert grew["decode"] is None or grew["prefill"] < grew["decode"], out.long_prompts
    grew = out.long_outputs.first_growth_s
    assert grew["decode"] is not None, out.long_outputs
    assert grew["prefill"] is None or grew["decode"] < grew["prefill"], out.long_outputs
