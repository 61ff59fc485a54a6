"""Role moves before pods (autoscaling/roles.py, the predictive policy's step 6, the status record): the short role
borrows the other pool's spare ready workers at once, the pods follow, the lend returns."""

from __future__ import annotations

import pytest

from disagg.api.status import RoleMoves
from disagg.autoscaling.forecast import Load
from disagg.autoscaling.predictive import Observation, PredictivePolicy
from disagg.autoscaling.roles import plan_moves
from disagg.controller.autoscaler import role_moves_patch

from .test_predictive import LinearSizer, settings


@pytest.mark.parametrize(("need", "ready", "moves"), [
    ((1, 5), (4, 2), (3, 0)),  # decode short by 3, prefill spares 3
    ((1, 3), (4, 2), (1, 0)),  # decode short by 1: one lent, not the whole spare
    ((2, 6), (4, 2), (2, 0)),  # prefill keeps what it needs itself
    ((4, 1), (1, 3), (0, 2)),  # prefill short by 3, decode spares 2
    ((3, 3), (2, 2), (0, 0)),  # both short: nothing to lend
    ((1, 1), (3, 3), (0, 0)),  # neither short
    ((1, 4), (1, 2), (0, 0)),  # a pool with one worker lends nothing (decode short, prefill's only worker)
    ((0, 4), (1, 2), (0, 0)),  # … even when it needs none
])
def test_plan_moves(need, ready, moves) -> None:
    m = plan_moves(*need, *ready)
    assert (m.prefill_to_decode, m.decode_to_prefill) == moves
    assert bool(m.reason) == bool(m.lent)


def obs(t: float, remote: float, local: float, p: int, d: int) -> Observation:
    return Observation(t, Load(remote, local, 8000, 400, 250), p, p, d, d, 1.0, 0.02)


def test_the_policy_lends_at_once_and_returns_when_the_pods_are_ready() -> None:
    # the stand-in sizer: prefill = ⌈remote ÷ (2 × 0.8)⌉, decode = ⌈all ÷ (2 × 0.8)⌉
    pol = PredictivePolicy(LinearSizer(), settings())
    pol.step(obs(0.0, 6.0, 0.0, 4, 4))  # 6 remote req/s: 4P + 4D hold it
    assert pol.moves == RoleMoves()
    out = pol.step(obs(30.0, 1.0, 7.0, 4, 4))  # the mix turns local: prefill needs 1, decode 5
    assert out["decode"].desired > 4  # the pods follow …
    assert pol.moves.prefill_to_decode == 1 and pol.moves.decode_to_prefill == 0  # … and a lend covers them now
    assert "decode needs 5 and has 4 ready" in pol.moves.reason
    pol.step(obs(60.0, 1.0, 7.0, 4, out["decode"].desired))  # the decode pods are ready: the lend returns
    assert pol.moves == RoleMoves()


def test_role_moves_off_lends_nothing() -> None:
    pol = PredictivePolicy(LinearSizer(), settings(role_moves=False))
    pol.step(obs(0.0, 6.0, 0.0, 4, 4))
    pol.step(obs(30.0, 1.0, 7.0, 4, 4))
    assert pol.moves == RoleMoves()


def test_an_interval_served_with_lent_workers_does_not_correct_the_model() -> None:
    class Off(LinearSizer):  # the model expects half the latency observed: a correction of ×2 if it were taken
        def expected(self, load, prefill, decode):  # noqa: ARG002
            from disagg.autoscaling.predictive import Expected
            return Expected(0.5, 0.01)

    pol = PredictivePolicy(Off(), settings())
    pol.step(obs(0.0, 1.0, 1.0, 4, 1))  # decode short (needs 2), prefill spares 3: a lend
    assert pol.moves.prefill_to_decode == 1
    pol.step(obs(30.0, 1.0, 1.0, 4, 2))
    assert pol.state.ttft.samples == 0 and pol.state.tpot.samples == 0
    pol.step(obs(60.0, 1.0, 1.0, 4, 2))  # the interval after one without a lend: corrected
    assert pol.state.ttft.samples == 1 and pol.state.ttft.value == pytest.approx(2.0)


def test_status_records_a_change_of_the_counts_only() -> None:
    m = RoleMoves(prefill_to_decode=2, reason="decode short")
    assert role_moves_patch(None, m, "T") == {"roleMoves": {"prefillToDecode": 2, "decodeToPrefill": 0,
                                                            "reason": "decode short", "time": "T"}}
    assert role_moves_patch({"prefillToDecode": 2, "reason": "x", "time": "S"}, m, "T") == {}
    back = role_moves_patch({"prefillToDecode": 2}, RoleMoves(), "T")["roleMoves"]
    assert back["prefillToDecode"] == 0 and back["reason"]
    assert role_moves_patch(None, RoleMoves(), "T") == {}  # nothing lent, nothing recorded: no write
    assert role_moves_patch({"prefillToDecode": 1}, None, "T") == {"roleMoves": None}  # no predictive policy
    assert role_moves_patch(None, None, "T") == {}
