"""A traffic profile → the twin's arrivals (``disagg plan --verify``, ``--arrivals``, bench/plan_accuracy.py):
Poisson (or given) arrival times, tenants by share, token counts drawn from the distributions the planner bins, and
a shared prefix per tenant for its prefix-cache hit share."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from ..twin import Arrival
from .profile import Z95, Profile, Tenant, TokenDist


def _sampler(d: TokenDist) -> Any:
    """A function rng → tokens drawing from the distribution the planner bins (profile.TokenDist.bins)."""
    if d.fixed is not None:
        n = d.fixed
        return lambda _rng: n
    if d.histogram is not None:
        toks = [b.tokens for b in d.histogram]
        cum, acc = [], 0.0
        total = sum(b.share for b in d.histogram)
        for b in d.histogram:
            acc += b.share / total
            cum.append(acc)

        def hist(rng: random.Random) -> int:
            u = rng.random()
            for t, c in zip(toks, cum, strict=True):
                if u <= c:
                    return t
            return toks[-1]
        return hist
    assert d.mean is not None
    if d.p95 is None or d.p95 == d.mean:
        m = max(1, round(d.mean))
        return lambda _rng: m
    s = Z95 - math.sqrt(Z95**2 - 2 * math.log(d.p95 / d.mean))
    mu = math.log(d.mean) - s * s / 2
    return lambda rng: max(1, round(rng.lognormvariate(mu, s)))


def profile_arrivals(p: Profile, duration_s: float, *, rate: float | None = None, seed: int = 0,
                     max_input: int | None = None, times: Sequence[float] | None = None) -> list[Arrival]:
    """Poisson arrivals at ``rate`` (default the profile's peak) for ``duration_s``: tenants by share, their token
    distributions, and a shared prefix per tenant covering ``prefixCacheHitShare`` of each prompt (requests of a
    tenant share that many leading tokens, so the engines' prefix caches hit about that share).

    ``times``: arrival times (seconds from the start, sorted) to use instead of Poisson ones (``--arrivals``: the
    recorded times; bench/plan_accuracy.py: a bursty renewal process); those up to ``duration_s`` are used."""
    rng = random.Random(seed)
    given = iter(times) if times is not None else None
    tr = p.traffic
    lam = rate if rate is not None else tr.rate.peak
    tenants = tr.tenants
    names: list[str | None] = [t.name for t in tenants] or [None]
    shares = [t.share for t in tenants] or [1.0]
    samplers = []
    each: list[Tenant | None] = list(tenants) or [None]
    for t in each:
        ind = t.input_tokens if t is not None and t.input_tokens else tr.input_tokens
        outd = t.output_tokens if t is not None and t.output_tokens else tr.output_tokens
        hit = t.prefix_cache_hit_share if t is not None and t.prefix_cache_hit_share is not None \
            else tr.prefix_cache_hit_share
        samplers.append((_sampler(ind), _sampler(outd), hit))
    out: list[Arrival] = []
    at = 0.0
    i = 0
    while True:
        if given is None:
            at += rng.expovariate(lam)
        else:
            at = next(given, math.inf)
        if at > duration_s:
            break
        k = rng.choices(range(len(names)), weights=shares)[0] if len(names) > 1 else 0
        sin, sout, hit = samplers[k]
        n_in = sin(rng)
        if max_input is not None:
            n_in = min(n_in, max_input)
        n_out = sout(rng)
        key = f"tenant:{names[k] or 'default'}" if hit > 0 else None
        out.append(Arrival(at=at, input_tokens=n_in, output_tokens=n_out, tenant=names[k], prefix_key=key,
                           prefix_tokens=int(n_in * hit), request_id=f"plan-{i:06d}", cls=names[k] or "default"))
        i += 1
    return out
