"""Workers the router knows, their load (router in-flight counts + scraped vLLM metrics), and estimates.

Estimates (docs/router.md):

* prefill queue wait of a worker = max(the router's own backlog on it, other clients' queue) where
  backlog: a virtual "busy until" clock, pushed forward by tokens × seconds-per-token for every prefill leg sent
  and reset when the worker has no leg of ours in flight; other clients' queue: vllm:num_requests_waiting ×
  average prompt tokens × seconds-per-token. Seconds per prompt token: the router's own observation (EWMA of
  prefill-leg time ÷ tokens ahead and own), else Δ vllm:request_prefill_time_seconds_sum ÷
  Δ vllm:request_prompt_tokens_sum between scrapes (EWMA), else a prior (0.1 ms).
* per-worker averages of vLLM histograms (queue time, prefill time, NIXL transfer/post time, TPOT) from
  Δsum / Δcount between scrapes, kept until the next scrape with new observations.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ..perf.costs import EngineCost
from .policy_types import WorkerLoad

GAUGES = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
          "vllm:num_requests_waiting_by_reason")
# Families read per value of one label, as '<name>{<label>="<value>"}' (the others are summed over their labels):
# vLLM ≥ 0.20 splits the waiting requests into those waiting for room ("capacity") and those waiting for their
# remote KV ("deferred"; vllm/v1/metrics/loggers.py); only the first is a queue.
BY_LABEL = {"vllm:num_requests_waiting_by_reason": "reason"}
WAITING_FOR_CAPACITY = 'vllm:num_requests_waiting_by_reason{reason="capacity"}'
HISTOGRAMS = (
    "vllm:request_prefill_time_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prompt_tokens",
    "vllm:nixl_xfer_time_seconds",
    "vllm:nixl_post_time_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:request_time_per_output_token_seconds",
)
_WANTED = {*GAUGES, *(h + s for h in HISTOGRAMS for s in ("_sum", "_count"))}
DEFAULT_SEC_PER_PROMPT_TOKEN = 0.0001  # 0.1 ms/token (≈10k tokens/s) until measured, without a cost model
EWMA_ALPHA = 0.3
# The placement's online correction (observed ÷ predicted, per worker and phase): a slow EWMA, bounded so that one
# outlier (a stall, a preemption) cannot make a worker look free or unusable.
CORRECTION_ALPHA = 0.1
CORRECTION_BOUNDS = (0.5, 4.0)
RATIO_LOG_CLAMP = math.log(4.0)
PREFILL_RATE_WINDOW_S = 5.0  # the prefill token rate's time constant (seconds)
# an average started at zero reads a share 1 − e^(−age/τ) of a steady rate (39 % 2.5 s after the worker joined):
# read over the time watched instead, and over one second at least (a single prefill is not a rate)
RATE_MIN_AGE_S = 1.0
TPOT_HISTOGRAM = "vllm:request_time_per_output_token_seconds"  # per request, at its end (vllm/v1/metrics/loggers.py)
REMOTE_TTFB_RISE = 0.05  # how fast the healthy hand-off floor follows slower observations
# the TPOT of a worker's recent streams (observe_stream): EWMAs of its log and its log's square, a memory of about
# 1/α streams (seconds of a busy worker's endings); read once this many streams have ended there
STREAM_ALPHA = 0.05
STREAM_MIN_SEEN = 20


def parse_prometheus(text: str, wanted: set[str] = _WANTED) -> dict[str, float]:
    """Sum of the samples of the wanted metric names (over all label sets). Tolerant of anything else."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        if space < 0:
            continue
        if 0 <= brace < space:
            name = line[:brace]
            end = line.rfind("}")
            rest = line[end + 1:].split()
            label = BY_LABEL.get(name)
            if label is not None and name in wanted:
                m = re.search(label + r'="([^"]*)"', line[brace:end])
                if m is None:
                    continue
                name = f'{name}{{{label}="{m.group(1)}"}}'
        else:
            name = line[:space]
            rest = line[space + 1:].split()
        if (name not in wanted and name.partition("{")[0] not in BY_LABEL) or not rest:
            continue
        try:
            v = float(rest[0])
        except ValueError:
            continue
        if math.isfinite(v):
            out[name] = out.get(name, 0.0) + v
    return out


def _ewma(old: float | None, new: float, alpha: float = EWMA_ALPHA) -> float:
    return new if old is None else old + alpha * (new - old)


@dataclass
class Worker:
    url: str
    role: str  # prefill | decode | aggregated
    compat: str = ""
    inflight: int = 0
    inflight_tokens: int = 0
    down_until: float = 0.0  # passive health: skipped until then (monotonic), or until a scrape succeeds
    scraped: dict[str, float] = field(default_factory=dict)
    scraped_at: float = 0.0
    avg: dict[str, float] = field(default_factory=dict)  # histogram name → recent average
    sec_per_token: float | None = None  # prefill seconds per prompt token (scraped)
    observed_sec_per_token: float | None = None  # from the router's own prefill legs
    avg_prompt_tokens: float | None = None
    busy_until: float = 0.0  # monotonic time the router's own prefill backlog on this worker should clear
    # its remote decode legs' healthy time to first token (the KV hand-off) per prompt token (observe_remote_ttfb)
    remote_ttfb_per_token: float | None = None
    cost: EngineCost | None = None  # the pool's engine priced (perf/costs.py), set from the router config
    # prefill tokens sent to it (prefill legs and local prefills): a rate with time constant PREFILL_RATE_WINDOW_S
    prefill_rate_tps: float = 0.0
    prefill_rate_at: float = 0.0
    # … and the size of those prefills (tokens each): EWMAs of it and of its square (prefill_started)
    prefill_size: float | None = None
    prefill_size2: float | None = None
    since: float = -math.inf  # when the router began to watch it (its WorkerSet's clock; prefill_rate)
    # the placement's corrections: observed ÷ predicted TTFT of the requests it prefilled, TPOT of those it decoded
    f_prefill: float = 1.0
    f_decode: float = 1.0
    # when the router last sent it a prefill leg, or the SLO placement a whole prompt longer than its chunk (clock of
    # the core; core.py ``prefill`` and ``relay``): its steps carried long chunks then (policy.py ``elastic``)
    remote_prefill_at: float = -math.inf
    # the TPOT of the streams it decoded lately (observe_stream): EWMAs of log TPOT and of its square
    stream_log: float = 0.0
    stream_log2: float = 0.0
    streams_seen: int = 0
    # their geometric mean TPOT (s) and the standard deviation of its log; (0, 0) until STREAM_MIN_SEEN have ended
    stream_tpot: tuple[float, float] = (0.0, 0.0)
    # the scrape's gauges the policy reads on every request (running, waiting, KV usage, queued), read once per scrape
    _gauges: tuple[float, float, float, float] = field(default=(0.0, 0.0, 0.0, 0.0), init=False, repr=False,
                                                       compare=False)
    _gauges_of: dict[str, float] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def up(self) -> bool:
        return self.down_until <= time.monotonic()

    def update_scrape(self, values: dict[str, float], now: float | None = None) -> None:
        """A scrape of the worker's ``/metrics`` taken at ``now`` (the clock its prefills are timed on: the
        WorkerSet's; default time.monotonic())."""
        prev = self.scraped
        fresh: set[str] = set()
        for h in HISTOGRAMS:
            s, c = values.get(h + "_sum"), values.get(h + "_count")
            ps, pc = prev.get(h + "_sum"), prev.get(h + "_count")
            if s is None or c is None or ps is None or pc is None:
                continue
            dc, ds = c - pc, s - ps
            if dc > 0 and ds >= 0:
                self.avg[h] = ds / dc
                fresh.add(h)
        if TPOT_HISTOGRAM in fresh:
            self._correct_decode(values, self.avg[TPOT_HISTOGRAM], time.monotonic() if now is None else now)
        pt_s, pt_c = values.get("vllm:request_prompt_tokens_sum"), values.get("vllm:request_prompt_tokens_count")
        pf = values.get("vllm:request_prefill_time_seconds_sum")
        if prev and pt_s is not None and pf is not None:
            dtok = pt_s - prev.get("vllm:request_prompt_tokens_sum", pt_s)
            dtime = pf - prev.get("vllm:request_prefill_time_seconds_sum", pf)
            if dtok > 0 and dtime > 0:
                self.sec_per_token = _ewma(self.sec_per_token, dtime / dtok)
        if pt_s and pt_c:
            self.avg_prompt_tokens = pt_s / pt_c
        self.scraped = values
        self.scraped_at = time.monotonic()
        self.down_until = 0.0

    def _correct_decode(self, values: dict[str, float], tpot: float, now: float) -> None:
        """The decode correction from the worker's own metrics: the mean TPOT of the requests that finished since
        the last scrape ÷ what the cost model gives for the batch it runs now (its running requests, their context
        from the KV-cache usage, the prefill traffic it receives) — the engine against the prior, not one request
        against a load that changed after it was placed."""
        running = int(values.get("vllm:num_requests_running", 0.0))
        if self.cost is None or running < 1 or tpot <= 0:
            return
        ctx = values.get("vllm:kv_cache_usage_perc", 0.0) * self.cost.kv_capacity_tokens / running
        model = self.cost.tpot(running, ctx, self.prefill_rate(now))  # the rate the placement prices with
        if model > 0:
            self.correct("decode", tpot / (model * self.f_decode))  # against the corrected prediction

    def observe_prefill_leg(self, seconds: float, tokens_ahead_and_own: int) -> None:
        if tokens_ahead_and_own > 0 and seconds > 0:
            self.observed_sec_per_token = _ewma(self.observed_sec_per_token, seconds / tokens_ahead_and_own)

    @property
    def queued(self) -> float:
        """Requests waiting for room at the last scrape: vLLM's waiting count less those waiting for their remote
        KV (``reason="deferred"``) where the release splits it, else all waiting ones."""
        return self.gauges()[3]

    def gauges(self) -> tuple[float, float, float, float]:
        """The last scrape's running and waiting requests, KV-cache usage and :attr:`queued`, read from it once."""
        sc = self.scraped
        if sc is not self._gauges_of:
            waiting = sc.get("vllm:num_requests_waiting", 0.0)
            capacity = sc.get(WAITING_FOR_CAPACITY)
            self._gauges = (sc.get("vllm:num_requests_running", 0.0), waiting,
                            sc.get("vllm:kv_cache_usage_perc", 0.0), waiting if capacity is None else capacity)
            self._gauges_of = sc
        return self._gauges

    def observe_remote_ttfb(self, seconds: float, tokens: int) -> None:
        """The healthy hand-off time per prompt token, what a hedge waits against: a floor that falls to a faster
        observation at once and rises slowly (α = REMOTE_TTFB_RISE), so that a spell of decode queueing (a load
        step) or of slow transfers does not teach the hedge to wait past the transfer timeout."""
        if seconds >= 0 and tokens > 0:
            v, old = seconds / tokens, self.remote_ttfb_per_token
            self.remote_ttfb_per_token = v if old is None or v < old else old + REMOTE_TTFB_RISE * (v - old)

    def observe_stream(self, tpot_s: float) -> None:
        """A stream this worker decoded ended with mean time per output token ``tpot_s``: folded into the recent
        streams' TPOT (:attr:`stream_tpot`), what the placement reads as the streams a prefill there would stall
        (placement.py ``_harm``)."""
        if not tpot_s > 0:
            return
        x = math.log(tpot_s)
        if self.streams_seen == 0:
            self.stream_log, self.stream_log2 = x, x * x
        else:
            a = STREAM_ALPHA if self.streams_seen * STREAM_ALPHA >= 1.0 else 1.0 / (self.streams_seen + 1)
            self.stream_log += a * (x - self.stream_log)
            self.stream_log2 += a * (x * x - self.stream_log2)
        self.streams_seen += 1
        if self.streams_seen >= STREAM_MIN_SEEN:  # read on every request (load): priced here, once per stream
            var = self.stream_log2 - self.stream_log * self.stream_log
            self.stream_tpot = (math.exp(self.stream_log), math.sqrt(var) if var > 0 else 0.0)

    def spt(self) -> float:
        prior = self.cost.prefill_s_per_token if self.cost is not None else DEFAULT_SEC_PER_PROMPT_TOKEN
        return self.observed_sec_per_token or self.sec_per_token or prior

    def _decayed_rate(self, now: float) -> float:
        if not self.prefill_rate_tps:
            return 0.0
        return self.prefill_rate_tps * math.exp(-max(0.0, now - self.prefill_rate_at) / PREFILL_RATE_WINDOW_S)

    def prefill_rate(self, now: float) -> float:
        """Prefill tokens per second sent here lately (decayed to ``now``): the exponential average over the time
        the router has watched the worker (since :attr:`since`, one second at least), so that a worker that joined
        a few seconds ago reads the rate it receives, not the share of it that an average started at zero has
        reached (a fleet's first seconds, a router restart, a new replica)."""
        r = self._decayed_rate(now)
        if r:
            age = now - self.since
            if age < 8 * PREFILL_RATE_WINDOW_S:  # beyond, the factor is 1 within 0.04 %
                r /= -math.expm1(-max(age, RATE_MIN_AGE_S) / PREFILL_RATE_WINDOW_S)
        return r

    def prefill_started(self, tokens: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.busy_until = max(now, self.busy_until) + tokens * self.spt()
        self.prefill_rate_tps = self._decayed_rate(now) + tokens / PREFILL_RATE_WINDOW_S
        self.prefill_rate_at = now
        self.prefill_size = _ewma(self.prefill_size, float(tokens))
        self.prefill_size2 = _ewma(self.prefill_size2, float(tokens * tokens))

    def correct(self, phase: str, ratio: float) -> None:
        """Fold one observed ÷ predicted ratio of ``phase`` (prefill | decode) into the worker's correction: an
        EWMA of log ratios (so a 3× miss and a 1/3 miss cancel, and a tail of slow requests cannot ratchet the
        factor up), bounded to CORRECTION_BOUNDS."""
        if not (ratio > 0 and math.isfinite(ratio)):
            return
        lo, hi = CORRECTION_BOUNDS
        name = "f_prefill" if phase == "prefill" else "f_decode"
        step = max(-RATIO_LOG_CLAMP, min(RATIO_LOG_CLAMP, math.log(ratio)))  # one outlier moves it at most 4×^α
        setattr(self, name, min(hi, max(lo, getattr(self, name) * math.exp(CORRECTION_ALPHA * step))))

    def prefill_ended(self, others_in_flight: int, now: float | None = None) -> None:
        if others_in_flight <= 0:
            self.busy_until = min(self.busy_until, time.monotonic() if now is None else now)

    def est_prefill_wait_s(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        others = self.scraped.get("vllm:num_requests_waiting", 0.0) * (self.avg_prompt_tokens or 0.0) * self.spt()
        return max(self.busy_until - now, others, 0.0)

    def load(self, prefix_tokens: int = 0, now: float | None = None) -> WorkerLoad:
        """This worker's load for the policy; ``now``: the clock (default time.monotonic(); the twin's virtual)."""
        now = time.monotonic() if now is None else now
        running, waiting, kv_usage, queued = self.gauges()
        # positional, in WorkerLoad's field order (a third of the keywords' cost: one per worker per request;
        # tests/router/test_workers.py checks every field against the keyword form)
        return WorkerLoad(
            self.url, self.compat, self.inflight,  # url, compat, inflight
            self.est_prefill_wait_s(now) * 1000.0 if self.role == "prefill" else 0.0,  # est_wait_ms
            max(running, float(self.inflight)) if self.scraped else float(self.inflight),  # running
            waiting, kv_usage, prefix_tokens, self.role, queued,  # waiting, kv_usage, prefix_tokens, role, queued
            max(0, self.inflight_tokens), self.prefill_rate(now), self.cost,  # ahead_tokens, prefill_rate, cost
            self.f_prefill, self.f_decode, self.avg_prompt_tokens or 0.0,  # f_prefill, f_decode, avg_prompt_tokens
            now - self.remote_prefill_at,  # remote_idle_s
            *self.stream_tpot,  # stream_tpot_s, stream_spread
            self.prefill_size2 / (2.0 * self.prefill_size) if self.prefill_size and self.prefill_size2 else 0.0,
            self.prefill_size or 0.0,  # prefill_residual_tokens (above), prefill_size_tokens
        )


class WorkerSet:
    """The workers of each pool. Updated by static flags or discovery; stats survive updates."""

    ROLES = ("prefill", "decode", "aggregated")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: what passive-health marks (``Worker.down_until``) are compared with (the twin's virtual
        time in the twin)."""
        self.pools: dict[str, dict[str, Worker]] = {r: {} for r in self.ROLES}
        self.clock = clock
        # role moves (issue 28): how many workers of the other KV pool serve each role, and which do (url → role)
        self.moves: dict[str, int] = {}
        self.lent: dict[str, str] = {}
        self.removed: list[Callable[[str], None]] = []  # called with the URL of a worker that left every pool

    def set_pool(self, role: str, endpoints: Iterable[tuple[str, str]]) -> None:
        old = self.pools[role]
        new: dict[str, Worker] = {}
        for url, compat in endpoints:
            w = old.get(url) or Worker(url=url, role=role, since=self.clock())
            w.compat = compat
            new[url] = w
        self.pools[role] = new
        if self.moves or self.lent:
            self._lend()
        for url in old:
            if url not in new and self.get(url) is None:
                for f in self.removed:
                    f(url)

    def lend(self, moves: Mapping[str, int]) -> None:
        """Role moves (issue 28; the autoscaler's ``status.roleMoves`` through the router config): ``moves["decode"]``
        prefill-pool workers serve the decode role, ``moves["prefill"]`` decode-pool workers the prefill role. A
        lent worker stays in its pool (its engine, its GPU, its pod) and leaves that role's :meth:`ready` for the
        other's: the policy sends it the other role's work, and what it holds finishes where it is. The same
        workers stay lent while the count holds; a rise lends the lender's idlest (fewest in flight), a fall returns
        the last lent first; a pool never lends its last worker. vLLM's NixlConnector acts per request (its
        ``kv_transfer_params``), not per ``kv_role`` (builders/transport.py), so any worker can take either leg."""
        self.moves = {r: max(0, int(moves.get(r, 0))) for r in ("prefill", "decode") if moves.get(r, 0)}
        self._lend()

    def _lend(self) -> None:
        lent: dict[str, str] = {}
        for role, other in (("decode", "prefill"), ("prefill", "decode")):
            pool = self.pools[other]
            want = min(self.moves.get(role, 0), max(0, len(pool) - 1))
            kept = [u for u, r in self.lent.items() if r == role and u in pool][:want]
            idle = sorted((w for u, w in pool.items() if u not in kept), key=lambda w: (w.inflight, w.url))
            for u in [*kept, *(w.url for w in idle)][:want]:
                lent[u] = role
        self.lent = lent

    def role_of(self, w: Worker) -> str:
        """The role ``w`` serves now: its pool's, or the one it is lent to."""
        return self.lent.get(w.url, w.role)

    def get(self, url: str) -> Worker | None:
        for pool in self.pools.values():
            if url in pool:
                return pool[url]
        return None

    def ready(self, role: str) -> list[Worker]:
        """Workers of the pool not marked down. For decode/aggregated, when all are marked down, all of them
        (the mark is advisory: trying a worker beats refusing the request; prefill has the local path)."""
        now = self.clock()
        serving = self._serving(role)
        up = [w for w in serving if w.down_until <= now]
        if not up and role != "prefill":
            return list(serving)
        return up

    def _serving(self, role: str) -> Iterable[Worker]:
        if not self.lent:
            return self.pools[role].values()
        lent = self.lent
        own = [w for w in self.pools[role].values() if w.url not in lent]
        other = {"prefill": "decode", "decode": "prefill"}.get(role)
        if other is None:
            return own
        return own + [w for u, w in self.pools[other].items() if lent.get(u) == role]

    def all(self) -> list[Worker]:
        return [w for pool in self.pools.values() for w in pool.values()]


class TenantStats:
    """Observed average output tokens per tenant (EWMA), for requests without max_tokens."""

    def __init__(self) -> None:
        self.avg: dict[str, float] = {}

    def observe(self, tenant: str, output_tokens: int) -> None:
        self.avg[tenant] = _ewma(self.avg.get(tenant), float(output_tokens), 0.1)

    def get(self, tenant: str) -> float | None:
        return self.avg.get(tenant)


def parse_worker_arg(value: str) -> tuple[str, str]:
    """``URL`` or ``URL#compat-hash`` → (base URL without trailing slash, compat hash or "")."""
    url, _, compat = value.partition("#")
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url, compat.strip()
