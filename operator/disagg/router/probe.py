"""Evidence before return (DESIGN §9): remote-path probes while the operator holds a model Aggregated.

While ``RouterConfig.probing()`` (spec.mode Auto, activeMode Aggregated, probes configured), a request that the
Disaggregated policy would send remote is sent remote as a *probe* (decision ``remote``, reason ``mode_probe``,
with the normal fallback), when both limits allow it:

* a token bucket of ``probe.ratePerMinute`` per router (burst 1: probes are spread out, never a burst), and
* a share of eligible requests: each eligible request earns ``probe.maxShare`` credit (capped at 1), a probe costs
  1, and the first eligible request starts with a full credit. Over any stretch, probes ≤ 1 + maxShare × eligible.

A pinned ``spec.mode: Aggregated`` never probes (``probing()`` is false). Outcomes are counted by the router as
``disagg_mode_probes_total{outcome="ok"|"failed"}``: ok when the probe was served by the remote path.
The limiter is pure (the caller passes ``now``); ``probe_decision`` is pure apart from the limiter's state.
"""

from __future__ import annotations

import dataclasses

from ..api.contract import RouterConfig
from ..api.models import ActiveMode
from .policy import decide
from .policy_types import Decision, LoadSnapshot, RequestFeatures, Tuning

PROBE_REASON = "mode_probe"
_EPS = 1e-9


class ProbeLimiter:
    """``rate_scale``: this limiter's part of ``ratePerMinute`` (1/N in each of ``disagg router --workers N``, so
    that the replica as a whole keeps to the configured rate)."""

    __slots__ = ("credit", "last", "rate_scale", "tokens")

    def __init__(self, rate_scale: float = 1.0) -> None:
        self.rate_scale = rate_scale
        self.reset()

    def reset(self) -> None:
        self.tokens = 1.0
        self.credit = 1.0
        self.last: float | None = None

    def admit(self, rate_per_minute: float, max_share: float, now: float) -> bool:
        """One eligible request at ``now``: may it be a probe? (Consumes a token and credit when it may.)"""
        if rate_per_minute <= 0 or max_share <= 0:
            return False
        if self.last is not None:
            self.tokens = min(1.0, self.tokens + max(now - self.last, 0.0) * rate_per_minute * self.rate_scale / 60.0)
            self.credit = min(1.0, self.credit + max_share)
        self.last = now
        if self.tokens >= 1.0 - _EPS and self.credit >= 1.0 - _EPS:  # sums of fractions: allow rounding
            self.tokens -= 1.0
            self.credit -= 1.0
            return True
        return False


def probe_decision(cfg: RouterConfig, f: RequestFeatures, snap: LoadSnapshot, tuning: Tuning,
                   limiter: ProbeLimiter, now: float) -> Decision | None:
    """The probe decision for a request the Aggregated mode would serve locally, or None (stay local)."""
    if not cfg.probing():
        return None
    d = decide(cfg.model_copy(update={"active_mode": ActiveMode.DISAGGREGATED}), f, snap, tuning)
    if d.decision != "remote":
        return None
    if not limiter.admit(cfg.probe.rate_per_minute, cfg.probe.max_share, now):
        return None
    return dataclasses.replace(d, reason=PROBE_REASON)
