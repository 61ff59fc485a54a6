"""Queueing for the planner's performance model (plan/model.py): the M/G/c wait (Erlang C, Allen–Cunneen's G/G/c
approximation), the arrival variability of a split stream, the normal CDF. Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Queue:
    """M/G/c waiting time: P(W > t) = c_wait · exp(−t / theta)."""

    rho: float  # utilisation per server
    c_wait: float  # probability of waiting (Erlang C)
    theta: float  # mean wait of those who wait, s
    saturated: bool

    def p_wait_le(self, t: float) -> float:
        if self.saturated:
            return 0.0
        if t < 0:
            return 0.0
        if self.c_wait <= 0 or self.theta <= 0:
            return 1.0
        return 1.0 - self.c_wait * math.exp(-t / self.theta)

    @property
    def mean_wait(self) -> float:
        return math.inf if self.saturated else self.c_wait * self.theta


IDLE = Queue(0.0, 0.0, 0.0, False)


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits in M/M/c with offered load a = λ/μ (a < c)."""
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return c * b / (c - a * (1 - b))


def mgc(lam: float, es: float, es2: float, c: int, ca2: float = 1.0) -> Queue:
    """G/G/c, Allen–Cunneen: E[W] ≈ ErlangC · E[S] / (c − a) · (ca² + cs²) / 2 — the M/M/c wait scaled by the
    arrivals' and the service's variability (Allen 1990; Kingman 1961 for c = 1). ``ca2`` = 1 (Poisson) is M/G/c."""
    if lam <= 0 or es <= 0:
        return IDLE
    a = lam * es
    rho = a / c
    if rho >= 1:
        return Queue(rho, 1.0, math.inf, True)
    cw = erlang_c(c, a)
    cs2 = max(0.0, es2 / (es * es) - 1)
    wq = cw * es / (c - a) * (max(0.0, ca2) + cs2) / 2
    return Queue(rho, cw, wq / cw if cw > 0 else 0.0, False)


def split_ca2(ca2: float, share: float) -> float:
    """The arrival variability a pool sees when it gets a random share of a stream with ``ca2`` (Whitt 1983's QNA
    splitting rule: p · ca² + 1 − p; thinning makes any stream more Poisson-like)."""
    p = min(1.0, max(0.0, share))
    return p * ca2 + 1.0 - p


def phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))
