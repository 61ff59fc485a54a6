"""The virtual day's traffic (``disagg bench autoscale --virtual``, bench/autoscale_day.py): the diurnal rate with
its bursts, the mix that shifts with the hour, the request classes, and the Poisson arrivals drawn from them; the
expected load of a mix for the model's sizing. The day's shape and its references: autoscale_day.py's docstring."""

from __future__ import annotations

import math
import random
from typing import Protocol

from ..autoscaling.forecast import Load
from ..twin import Arrival


class DayShape(Protocol):
    """The settings the day's traffic is drawn from (autoscale_day.py ``DaySettings``)."""

    day_s: float
    peak_rps: float
    trough_share: float
    burst_factor: float
    burst_s: float
    seed: int


RAG = ("rag", (6000, 10000), (128, 384))
CHAT = ("chat", (100, 800), (100, 400))
# the mix swing (role moves): long prompts with short answers (prefill-heavy) against short prompts with long
# answers (decode-heavy), at one rate; the short answers stay above the remote rule's minExpectedOutputTokens 64
SUMMARISE = ("summarise", (6000, 10000), (96, 224))
STREAM = ("stream", (100, 400), (1200, 2000))
Class = tuple[str, tuple[int, int], tuple[int, int]]


def diurnal_rate(t: float, s: DayShape) -> float:
    x = ((1 - math.cos(2 * math.pi * t / s.day_s)) / 2) ** 2
    rate = s.peak_rps * (s.trough_share + (1 - s.trough_share) * x)
    for at in (0.30, 0.75):
        if at * s.day_s <= t < at * s.day_s + s.burst_s:
            rate *= s.burst_factor
    return rate


def rag_share(t: float, s: DayShape) -> float:
    return 0.2 + 0.6 * (1 - math.cos(2 * math.pi * t / s.day_s)) / 2


def _arrival(rng: random.Random, t: float, rag: float, i: int, classes: tuple[Class, Class] = (RAG, CHAT)) -> Arrival:
    name, (i0, i1), (o0, o1) = classes[0] if rng.random() < rag else classes[1]
    return Arrival(at=t, input_tokens=rng.randint(i0, i1), output_tokens=rng.randint(o0, o1), tenant=name,
                   cls=name, request_id=f"day-{i}")


def day_arrivals(s: DayShape) -> list[Arrival]:
    """Non-homogeneous Poisson arrivals of the day (thinning from the burst peak), deterministic for the seed."""
    rng = random.Random(s.seed)
    top = s.peak_rps * s.burst_factor
    out: list[Arrival] = []
    t = 0.0
    while True:
        t += rng.expovariate(top)
        if t >= s.day_s:
            return out
        if rng.random() < diurnal_rate(t, s) / top:
            out.append(_arrival(rng, t, rag_share(t, s), len(out)))


def steady_arrivals(rate: float, rag: float, duration_s: float, seed: int, t0: float = 0.0,
                    classes: tuple[Class, Class] = (RAG, CHAT), first_id: int = 0) -> list[Arrival]:
    """Poisson arrivals at ``rate``, a share ``rag`` of the first class (RAG) and the rest of the second (chat)."""
    rng = random.Random(seed)
    out: list[Arrival] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return out
        out.append(_arrival(rng, t0 + t, rag, first_id + len(out), classes))


def mix_load(rate: float, rag: float, classes: tuple[Class, Class] = (RAG, CHAT)) -> Load:
    """The expected Load of ``rate`` req/s with a share ``rag`` of the first class (class means; the first class's
    prompts prefill remotely, the second's stay local: Thresholds at 2048 tokens)."""
    (_, a_in, a_out), (_, b_in, b_out) = classes
    return Load(rate * rag, rate * (1 - rag), sum(a_in) / 2, sum(b_in) / 2,
                rag * sum(a_out) / 2 + (1 - rag) * sum(b_out) / 2)
