"""spec.autoscaling.policy Predictive on the local stack: the operator (`disagg operator`, given the planner's
sizing by disagg.cli) reads the interval's increments from the real Prometheus scraping the sims and the router,
forecasts and sizes with the performance model, and scales prefill on a long-prompt step — the decision's reason
is the model's, not the proportional rule's fallback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from disagg.demo.acts import LONG_PROMPTS
from disagg.local.harness import REAL_TIME, ModelHarness, serving, started_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelHarness]:
    with (started_stack("predictive", tmp_path_factory.mktemp("predictive-logs"), sim_env=REAL_TIME) as stack,
          serving(stack, {"autoscaling": {"policy": "Predictive", "podStartSeconds": 10}}) as m):
        yield m


def _prefill_reason(model: ModelHarness) -> str:
    return str((model.last_scale()["prefill"] or {}).get("reason") or "")


def test_a_long_prompt_step_is_sized_by_the_model(model: ModelHarness) -> None:
    assert model.desired("prefill") == 1
    phase = model.drive("long-prompt step", LONG_PROMPTS, rate=2.5, seconds=90, seed=4,
                        stop=lambda: _prefill_reason(model).startswith("up:"))
    assert phase.summary.errors == 0
    reason = _prefill_reason(model)
    assert reason.startswith("up: model needs"), (reason, model.last_scale())
    assert "forecast" in reason and "remote" in reason  # the forecast load the model sized, in the reason
    assert "(proportional:" not in reason
    assert model.desired("prefill") >= 2
    scaled = [e.message or "" for e in model.stack.events(model.name) if e.reason == "Scaled"]
    assert scaled and not any("(proportional:" in m for m in scaled), scaled
