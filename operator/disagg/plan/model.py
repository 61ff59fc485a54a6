"""The planner's analytic model: per-pool quantities from the simulator's roofline (perf/roofline.py), then queueing.

Pure functions, no I/O. docs/planning.md derives every formula; in brief:

- **Classes.** Input and output lengths are binned per tenant (independent within a tenant); a request's prefill
  tokens are its input × (1 − prefixCacheHitShare).
- **Prefill work.** A prompt's *work* is its share of a full engine step of ``maxNumBatchedTokens`` tokens of
  like prompts (short prompts batch; long ones are chunked); its *own time* is the roofline prefill alone.
- **Queues.** Prefill waits are G/G/c (c = replicas; the router's least-loaded choice approximates one queue):
  the Allen–Cunneen approximation E[W] ≈ (ca² + cs²) / 2 · E[W(M/M/c)] (Allen 1990, *Probability, Statistics and
  Queueing Theory*, 2nd ed., §6; for c = 1 it is Kingman's 1961 heavy-traffic formula), ca the arrivals' and cs
  the service times' coefficient of variation, Erlang C for M/M/c, and an exponential tail:
  P(W > t) = C · exp(−t / θ), θ = E[W] / C. With Poisson arrivals (ca = 1) it is the M/G/c form used before
  burstiness was modelled. A pool that sees a share p of the arrivals (the remote or the local prompts) sees
  ca² = p · ca² + 1 − p (Whitt 1983, the QNA splitting rule).
- **Decode.** Concurrency per decode replica solves Little's law n = λ_d · E[out] · TPOT(n) (fixed point);
  TPOT = step(n) / (1 − ρ_p) where ρ_p is the share of the replica's time spent on local prefill chunks
  (aggregated and conditional serving); a request's TPOT varies with the prefill work that lands in its lifetime
  (compound renewal: variance λ·t·(E[X²] + (ca² − 1)·E[X]²), normal approximation), and with the decode batch it
  runs in (the occupancy and the streams' contexts move the step's KV read: :func:`occupancy_sd`, averaged over
  the stream's life, :func:`life_average`).
- **TTFT** = wait + own prefill (+ KV transfer + the first decode step on the remote path; + the decode batch
  that rides along every local chunk step).
- **Goodput** = Σ tenants share · P(TTFT ≤ SLO) · P(TPOT ≤ SLO), TTFT and TPOT independent within a tenant.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ..perf.presets import GPUPreset, ModelPreset, TransportPreset, vllm_batch_defaults
from ..perf.roofline import PerfModel, SeqWork
from .profile import Profile, TokenDist
from .queueing import IDLE, Queue, mgc, phi, split_ca2

INPUT_BINS = 10
OUTPUT_BINS = 8


# ----------------------------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Workload:
    """Binned traffic. Input bins and output bins are flat lists; ``*_tenant`` says whose bin each is, and the
    weights include the tenant's share (they sum to 1 over all bins)."""

    tenants: tuple[str, ...]
    shares: tuple[float, ...]
    in_tokens: tuple[float, ...]
    in_prefill: tuple[float, ...]  # tokens that need computing (after prefix-cache hits)
    in_weight: tuple[float, ...]
    in_tenant: tuple[int, ...]
    out_tokens: tuple[float, ...]
    out_weight: tuple[float, ...]
    out_tenant: tuple[int, ...]
    mean_rps: float
    peak_rps: float
    mean_out: float
    mean_in: float
    decode_context: float  # time-weighted mean context of a decoding sequence
    ca2: float = 1.0  # squared coefficient of variation of the inter-arrival times (1: Poisson)
    # time-weighted mean squared context of a decoding sequence (0: unknown, taken as decode_context²)
    decode_context_sq: float = 0.0

    @property
    def context_cv2(self) -> float:
        """The squared coefficient of variation of a decoding sequence's context (time-weighted)."""
        c = self.decode_context
        return max(0.0, self.decode_context_sq / (c * c) - 1.0) if c > 0 and self.decode_context_sq > 0 else 0.0

    def remote_share(self, threshold: float) -> float:
        return sum(w for t, w in zip(self.in_tokens, self.in_weight, strict=True) if t >= threshold)


MAX_INPUT_BINS = 40  # over all tenants: the search's cost grows with it (≤ 10 s for 3 GPU types × 16 GPUs)


def _dist_bins(d: TokenDist, n: int) -> list[tuple[float, float]]:
    """At most ``n`` bins: a histogram with more is merged into consecutive groups of about equal mass (each group
    keeps its weighted mean length, so the mean is exact)."""
    bins = sorted(d.bins(n))
    if len(bins) <= n:
        return bins
    out: list[tuple[float, float]] = []
    acc_w = acc_t = 0.0
    done = 0.0
    for tok, w in bins:
        acc_w += w
        acc_t += tok * w
        if done + acc_w >= (len(out) + 1) / n - 1e-9:
            out.append((acc_t / acc_w, acc_w))
            done += acc_w
            acc_w = acc_t = 0.0
    if acc_w > 0:
        out.append((acc_t / acc_w, acc_w))
    return out


def context_sq_sum(ins: Sequence[tuple[float, float]], outs: Sequence[tuple[float, float]]) -> float:
    """E[out · ctx²] over (tokens, weight) bins of prompts and answers, independent: over a stream's life its
    context runs from in to in + out, so weighted by its time (out) the mean of ctx² is E[(in + x)²] with x uniform
    on [0, out] — out·in² + out²·in + out³/3. Divided by E[out]: the time-weighted mean squared context."""
    e_in = sum(t * w for t, w in ins)
    e_in2 = sum(t * t * w for t, w in ins)
    e_out = sum(t * w for t, w in outs)
    e_out2 = sum(t * t * w for t, w in outs)
    e_out3 = sum(t ** 3 * w for t, w in outs)
    return e_out * e_in2 + e_out2 * e_in + e_out3 / 3


def build_workload(p: Profile) -> Workload:
    tr = p.traffic
    tenants = tr.tenants or []
    names: list[str] = [t.name for t in tenants] or ["default"]
    raw_shares = [t.share for t in tenants] or [1.0]
    total = sum(raw_shares)
    shares = [s / total for s in raw_shares]
    in_tokens: list[float] = []
    in_prefill: list[float] = []
    in_weight: list[float] = []
    in_tenant: list[int] = []
    out_tokens: list[float] = []
    out_weight: list[float] = []
    out_tenant: list[int] = []
    ctx_num = ctx_sq_num = out_sum = in_sum = 0.0
    for k, share in enumerate(shares):
        t = tenants[k] if tenants else None
        ind = (t.input_tokens if t and t.input_tokens else tr.input_tokens)
        outd = (t.output_tokens if t and t.output_tokens else tr.output_tokens)
        hit = t.prefix_cache_hit_share if t and t.prefix_cache_hit_share is not None else tr.prefix_cache_hit_share
        ib = _dist_bins(ind, max(3, min(INPUT_BINS, MAX_INPUT_BINS // len(shares))))
        ob = _dist_bins(outd, max(3, min(OUTPUT_BINS, MAX_INPUT_BINS // len(shares))))
        for tok, w in ib:
            in_tokens.append(tok)
            in_prefill.append(max(1.0, tok * (1.0 - hit)))
            in_weight.append(w * share)
            in_tenant.append(k)
        for tok, w in ob:
            out_tokens.append(tok)
            out_weight.append(w * share)
            out_tenant.append(k)
        e_in = sum(tok * w for tok, w in ib)
        e_out = sum(tok * w for tok, w in ob)
        e_out2 = sum(tok * tok * w for tok, w in ob)
        ctx_num += share * (e_out * e_in + e_out2 / 2)
        ctx_sq_num += share * context_sq_sum(ib, ob)
        out_sum += share * e_out
        in_sum += share * e_in
    return Workload(tuple(names), tuple(shares), tuple(in_tokens), tuple(in_prefill), tuple(in_weight),
                    tuple(in_tenant), tuple(out_tokens), tuple(out_weight), tuple(out_tenant),
                    p.traffic.rate.mean_rps, p.traffic.rate.peak, out_sum, in_sum, ctx_num / out_sum,
                    p.traffic.burstiness.ca2, ctx_sq_num / out_sum)


# ------------------------------------------------------------------------------------------------- pools


@dataclass
class PoolModel:
    """One engine shape (GPU × TP) for one workload: what the roofline says, computed once and reused."""

    gpu: GPUPreset
    tp: int
    cost: float  # per GPU-hour
    perf: PerfModel
    fits: bool
    why_not: str
    kv_tokens: float
    max_seqs: int
    chunk: int
    work: tuple[float, ...] = ()
    solo: tuple[float, ...] = ()
    chunks: tuple[int, ...] = ()  # engine steps a prompt occupies
    chunk_frac: tuple[float, ...] = ()  # its share of those steps' token budget
    context: float = 0.0
    _tdec: dict[int, float] = field(default_factory=dict)

    def t_dec(self, n: float) -> float:
        """Decode step time at (fractional) batch n, at the workload's mean decode context."""
        lo = max(1, int(n))
        a = self._int_step(lo)
        if n <= lo:
            return a
        b = self._int_step(lo + 1)
        return a + (b - a) * (n - lo)

    def _int_step(self, n: int) -> float:
        t = self._tdec.get(n)
        if t is None:
            t = self.perf.step([SeqWork(1, int(self.context))] * n).total_s
            self._tdec[n] = t
        return t

    def transfer(self, tokens: float, transport: TransportPreset, remote_tp: int) -> float:
        return self.perf.transfer_time(int(tokens), transport, remote_tp=remote_tp)


def pool_model(gpu: GPUPreset, tp: int, cost: float, model: ModelPreset, wl: Workload, chunk: int,
               gmu: float) -> PoolModel:
    perf = PerfModel(gpu, model, tp)
    max_seqs, _ = vllm_batch_defaults(gpu)  # vLLM's default sequence limit on this GPU (the simulator's too)
    free = perf.kv_cache_bytes_per_gpu(gmu, chunk, max_seqs)
    kv_tokens = max(0.0, free / perf.kv_bytes_per_token_per_gpu)
    pm = PoolModel(gpu, tp, cost, perf, True, "", kv_tokens, max_seqs, chunk, context=wl.decode_context)
    longest = max(wl.in_tokens) + max(wl.out_tokens)
    if free <= 0:
        pm.fits, pm.why_not = False, (f"weights {perf.weight_bytes_per_gpu / 1e9:.0f} GB per GPU leave no KV cache "
                                      f"on {gpu.name} at TP{tp}")
        return pm
    if kv_tokens < longest:
        pm.fits = False
        pm.why_not = f"KV cache holds {kv_tokens:,.0f} tokens, less than one {longest:,.0f}-token request"
        return pm
    work, solo, chunks, frac = [], [], [], []
    for tok, todo in zip(wl.in_tokens, wl.in_prefill, strict=True):
        cached = int(tok - todo)
        n = max(1, round(todo))
        solo.append(perf.prefill_time(n + cached, chunk, cached=cached))
        if n < chunk:
            k = max(1, chunk // n)
            work.append(perf.step([SeqWork(n, cached)] * k).total_s / k)
        else:
            work.append(solo[-1])
        chunks.append(math.ceil(n / chunk))
        frac.append(n / chunk)
    pm.work, pm.solo, pm.chunks, pm.chunk_frac = tuple(work), tuple(solo), tuple(chunks), tuple(frac)
    return pm


# ----------------------------------------------------------------------------------------------- sides


@dataclass(frozen=True)
class DecodeSide:
    """The decode pool (which also prefills the local requests) at one rate and one routing threshold."""

    replicas: int
    saturated: str  # "" or why
    batch: float  # running sequences per replica
    batch_limit: float
    step_s: float
    tpot_mean_s: float
    prefill_share: float  # ρ_p: share of the replica's time on local prefill chunks
    interference_m2: float  # per-replica rate × E[work²] of local prefills (variance of the interference)
    local_queue: Queue
    local_fixed: tuple[float, ...]  # per input bin (NaN-free; unused for remote bins)
    tpot_ok: tuple[float, ...]  # per output bin: P(TPOT ≤ SLO)
    # the decode batch's KV moves with its occupancy and its streams' contexts: the standard deviation of TPOT
    # that moves a step (:func:`occupancy_sd`) before a stream's life averages it, and the mean output over which
    # that averaging is reckoned (a stream as long as the mean lives one correlation time of the occupancy)
    occupancy_sd_s: float = 0.0
    mean_out: float = 0.0

    def tpot_cdf(self, wl: Workload, tau: float) -> list[float]:
        return [_tpot_ok(self, out, tau) for out in wl.out_tokens]


def life_average(r: float) -> float:
    """The share of a stationary process's variance left in its mean over a window ``r`` correlation times long,
    for an exponential autocorrelation (the occupancy of an M/M/∞ system: Cov(u) ∝ e^(−u/L), L the mean life):
    2·(r − 1 + e^(−r)) / r²; 1 for a window that is short against the process, 2/r for a long one."""
    if r < 1e-3:
        return 1.0 - r / 3.0
    return 2.0 * (r - 1.0 + math.exp(-r)) / (r * r)


def _tpot_ok(d: DecodeSide, out: float, tau: float, stall_s: float = 0.0) -> float:
    """P(TPOT ≤ tau) of a stream of ``out`` tokens; ``stall_s``: one more stall of its steps (a prefill placed
    beside it) spread over its output. Two independent spreads, normal: the prefill work that lands in its
    lifetime (compound renewal), and the decode batch it runs in (its occupancy and its streams' contexts, averaged
    over the stream's life)."""
    if d.saturated:
        return 0.0
    if out <= 1:
        return 1.0
    m = d.tpot_mean_s + stall_s / out
    var = d.interference_m2 * m / out  # TPOT² (the work in a lifetime out·m, spread over out tokens)
    if d.occupancy_sd_s > 0:
        var += d.occupancy_sd_s ** 2 * life_average(out / d.mean_out if d.mean_out > 0 else 1.0)
    if var <= 0:
        return 1.0 if m <= tau + 1e-12 else 0.0
    return phi((tau - m) / math.sqrt(var))


def occupancy_sd(dm: PoolModel, wl: Workload, n: float, replicas: int, rho_p: float) -> float:
    """The standard deviation of the decode step time, as TPOT, that the batch's KV moves it by. Per replica the KV
    read is the sum of its streams' contexts. Their count is Poisson-like: an infinite-server occupancy of mean
    ``n``, variance ``z·n`` with peakedness z = (1 + ca²)/2 (Whitt 1984, *Heavy-traffic approximations for service
    systems with blocking*, the GI/M/∞ peakedness), of which the router's least-loaded choice leaves each of
    ``replicas`` a 1/replicas share. Each stream's context spreads around the mean (``wl.context_cv2``). In units
    of mean-context streams: Var = n·(z/replicas + cv²); a stream costs the step's slope at ``n``."""
    if n <= 0 or rho_p >= 1:
        return 0.0
    z = (1.0 + wl.ca2) / 2.0
    var = n * (z / max(1, replicas) + wl.context_cv2)
    slope = dm.t_dec(n + 1.0) - dm.t_dec(n)
    return slope * math.sqrt(var) / (1.0 - rho_p)


def decode_side(dm: PoolModel, replicas: int, wl: Workload, rate: float, local: Sequence[float],
                tpot_slo_s: float) -> DecodeSide:
    """The decode pool at ``rate`` when the share ``local[i]`` of input bin i prefills there (1 or True: every
    prompt of the bin; a fraction: those the router sends local, e.g. the prefill queue's overflow)."""
    per = rate / replicas
    ew = sum(w * loc * x for w, x, loc in zip(wl.in_weight, dm.work, local, strict=True) if loc)
    ew2 = sum(w * loc * x * x for w, x, loc in zip(wl.in_weight, dm.work, local, strict=True) if loc)
    rho_p = per * ew
    loc_w = sum(w * loc for w, loc in zip(wl.in_weight, local, strict=True) if loc)
    ca2_local = split_ca2(wl.ca2, loc_w)
    # compound renewal: the work landing in a lifetime L has variance (λ/D)·L·(E[X²] + (ca² − 1)·E[X]²), per arrival
    m2 = per * ew2 + (per * (ca2_local - 1) * ew * ew / loc_w if loc_w > 0 else 0.0)
    limit = min(float(dm.max_seqs), dm.kv_tokens / max(1.0, wl.decode_context))
    zero = tuple(0.0 for _ in wl.out_tokens)
    nofix = tuple(math.inf for _ in wl.in_tokens)
    if rho_p >= 1:
        return DecodeSide(replicas, f"local prefill needs {rho_p:.0%} of each decode replica", math.inf, limit,
                          math.inf, math.inf, rho_p, m2, Queue(rho_p, 1.0, math.inf, True), nofix, zero)
    a = per * wl.mean_out / (1 - rho_p)  # n = a · step(n)

    def f(n: float) -> float:
        return a * dm.t_dec(max(n, 1.0)) - n

    if f(limit) > 0:
        why = ("KV cache" if limit < dm.max_seqs else "maxNumSeqs") + f" caps the batch at {limit:.0f}"
        return DecodeSide(replicas, f"decode saturated: {why}", limit, limit, dm.t_dec(limit), math.inf, rho_p, m2,
                          Queue(1.0, 1.0, math.inf, True), nofix, zero)
    lo, hi = 0.0, limit
    for _ in range(40):
        mid = (lo + hi) / 2
        if f(mid) > 0:
            lo = mid
        else:
            hi = mid
    n = hi
    step = dm.t_dec(max(n, 1.0))
    tpot = step / (1 - rho_p)
    # local prefill queue: service = own work + the decode batch riding along its chunk steps
    if loc_w > 0:
        s = [x + fr * step for x, fr in zip(dm.work, dm.chunk_frac, strict=True)]
        es = sum(w * loc * x for w, x, loc in zip(wl.in_weight, s, local, strict=True) if loc) / loc_w
        es2 = sum(w * loc * x * x for w, x, loc in zip(wl.in_weight, s, local, strict=True) if loc) / loc_w
        q = mgc(rate * loc_w, es, es2, replicas, ca2_local)
    else:
        q = IDLE
    fixed = tuple(so + ch * step for so, ch in zip(dm.solo, dm.chunks, strict=True))
    d = DecodeSide(replicas, "", n, limit, step, tpot, rho_p, m2, q, fixed, zero,
                   occupancy_sd(dm, wl, n, replicas, rho_p), wl.mean_out)
    return replace(d, tpot_ok=tuple(_tpot_ok(d, out, tpot_slo_s) for out in wl.out_tokens))


def prefill_queue(pm: PoolModel, replicas: int, wl: Workload, rate: float, remote: Sequence[bool]) -> Queue:
    rw = sum(w for w, r in zip(wl.in_weight, remote, strict=True) if r)
    if rw <= 0 or replicas <= 0:
        return IDLE
    es = sum(w * x for w, x, r in zip(wl.in_weight, pm.work, remote, strict=True) if r) / rw
    es2 = sum(w * x * x for w, x, r in zip(wl.in_weight, pm.work, remote, strict=True) if r) / rw
    return mgc(rate * rw, es, es2, replicas, split_ca2(wl.ca2, rw))


def transfers(dm: PoolModel, wl: Workload, transport: TransportPreset, remote_tp: int) -> tuple[float, ...]:
    """Per input bin: the decode engine's pull of the whole prompt's KV from a prefill engine of TP ``remote_tp``."""
    return tuple(dm.transfer(tok, transport, remote_tp) for tok in wl.in_tokens)


def remote_fixed(pm: PoolModel, xfer: Sequence[float], d: DecodeSide) -> tuple[float, ...]:
    """Per input bin: own prefill + KV transfer + the first decode step (the remote TTFT without queueing)."""
    return tuple(so + x + d.step_s for so, x in zip(pm.solo, xfer, strict=True))


def fixed_p95(rfixed: Sequence[float], weights: Sequence[float], remote: Sequence[bool]) -> float:
    """The 95th percentile of the remote path's fixed part (own prefill + transfer + first step) over the prompts
    that go remote."""
    pairs = sorted((f, w) for f, w, r in zip(rfixed, weights, remote, strict=True) if r)
    total = sum(w for _, w in pairs)
    acc, fixed = 0.0, 0.0
    for f, w in pairs:
        acc += w
        fixed = f
        if acc >= 0.95 * total - 1e-12:
            break
    return fixed


def stall_harm(d: DecodeSide, wl: Workload, stall_s: float, tau: float) -> float:
    """The streams on a decode replica pushed over the TPOT target by one prefill stalling them ``stall_s``: its
    batch × the fall of P(TPOT ≤ tau) over the output mix (router/placement.py ``_harm``, the router's own
    measure of the same thing)."""
    if d.saturated or stall_s <= 0:
        return 0.0
    fall = sum(w * (ok - _tpot_ok(d, out, tau, stall_s))
               for w, out, ok in zip(wl.out_weight, wl.out_tokens, d.tpot_ok, strict=True))
    return d.batch * fall


def overflow_share(pq: Queue, budget_s: float) -> float:
    """The share of the prompts whose prefill-queue wait would pass ``budget_s`` (search.spills: those the router
    prefills on their decode worker instead). 0 for a saturated queue: that candidate fails on its prefill side."""
    if pq.saturated or pq.c_wait <= 0 or pq.theta <= 0:
        return 0.0
    return 1.0 - pq.p_wait_le(max(0.0, budget_s))


def ttft_ok(remote: Sequence[bool], d: DecodeSide, pq: Queue, rfixed: Sequence[float],
            tau: float) -> list[float]:
    """P(TTFT ≤ tau) per input bin."""
    out = []
    for i, r in enumerate(remote):
        if r:
            out.append(0.0 if d.saturated else pq.p_wait_le(tau - rfixed[i]))
        else:
            out.append(0.0 if d.saturated else d.local_queue.p_wait_le(tau - d.local_fixed[i]))
    return out


def by_tenant(wl: Workload, probs: Sequence[float], which: str) -> list[float]:
    """Per tenant: Σ weight·p / tenant share over its input (``in``) or output (``out``) bins."""
    acc = [0.0] * len(wl.tenants)
    weights, owners = (wl.in_weight, wl.in_tenant) if which == "in" else (wl.out_weight, wl.out_tenant)
    for w, k, p in zip(weights, owners, probs, strict=True):
        acc[k] += w * p
    return [a / s for a, s in zip(acc, wl.shares, strict=True)]


def quantile(weights: Sequence[float], cdf_at: Callable[[float], Sequence[float]], q: float, hi: float) -> float:
    """Smallest t in [0, hi] with Σ weights · cdf(t) ≥ q (bisection); inf when even ``hi`` is not enough."""

    def mass(t: float) -> float:
        return sum(w * p for w, p in zip(weights, cdf_at(t), strict=True))

    if mass(hi) < q:
        return math.inf
    lo = 0.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if mass(mid) >= q:
            hi = mid
        else:
            lo = mid
    return hi
