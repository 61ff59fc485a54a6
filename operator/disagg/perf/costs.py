"""A pool's engine priced for the router's placement (router/placement.py): the roofline (roofline.py) folded
into the few quantities a per-request prediction needs, so the router prices a placement the way the twin that
benchmarks it runs the engine.

vLLM's V1 scheduler with chunked prefill (vllm/v1/core/sched/scheduler.py ``schedule``, 0.33.0) schedules the
running decodes first and fills the rest of the step's token budget (``--max-num-batched-tokens``) with prefill
chunks. So on a worker with ``R`` running streams a prompt of ``n`` uncached tokens behind ``A`` tokens of other
prefills takes ``k = ⌈(A + n) / (budget − R)⌉`` mixed steps, and each of those steps is longer than a decode-only
step by what its prefill chunk costs — the stall a local prefill imposes on the streams already there.

A stream's time per output token on a worker that receives prefill tokens at rate ``r`` (tokens/s): a share
``u = r · t_mixed / (budget − R)`` of the time goes to mixed steps, so its TPOT is the step-weighted mean
``1 / (u / t_mixed + (1 − u) / t_decode)`` (``u`` capped at 1: past that the prefill backlog grows).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

from ..api.contract import EngineProfile, Role
from .presets import PresetError, TransportPreset, get_gpu, get_model, get_transport, infer_model, vllm_batch_defaults
from .roofline import KVCapacityError, PerfModel

DEFAULT_PROFILE = EngineProfile()
DEFAULT_MODEL = "Llama-3.1-8B"


class PrefillCost(NamedTuple):  # a NamedTuple: the router builds several per request (a quarter of a dataclass's cost)
    seconds: float  # the prefill steps until this prompt's first token (own and the tokens ahead)
    steps: int  # how many steps carry a prefill chunk
    step_s: float  # one of those steps (decode tokens + a chunk)
    stall_s: float  # what each such step adds to a decode-only step of the streams running there
    own_stall_s: float = 0.0  # what this prompt's tokens add to the streams' wait (beyond the prefills ahead)
    own_s: float = 0.0  # what this prompt adds to the prefill queue there (beyond the prefills ahead)


NO_PREFILL = PrefillCost(0.0, 0, 0.0, 0.0)


class EngineCost:
    """One engine (a pool's worker) priced: step times, prefill, TPOT under prefill interference, KV transfer."""

    def __init__(self, perf: PerfModel, budget: int, max_num_seqs: int, kv_capacity_tokens: int,
                 transport: TransportPreset) -> None:
        self.perf = perf
        self.budget = max(1, budget)
        self.max_num_seqs = max(1, max_num_seqs)
        self.kv_capacity_tokens = max(1, kv_capacity_tokens)
        self.transport = transport
        self.request_overhead_s = perf.request_overhead_s
        # seconds per prompt token of a full-budget prefill step on an idle engine: the backlog clock's prior
        self.prefill_s_per_token = self.step(self.budget, 1, 1, self.budget * self.budget / 2.0,
                                             float(self.budget)) / self.budget
        # by (batch, mean context): the decode-only step, and the mixed step of a full chunk beside that batch. One
        # placement prices the same worker's steps several times (its TPOT before and after, the stall of each
        # prefill step against it); exact, each cleared when large
        self._decode_memo: dict[tuple[int, float], float] = {}
        self._mixed_memo: dict[tuple[int, float], float] = {}
        self._backlog_memo: dict[tuple[int, float, float], tuple[int, float]] = {}  # (batch, mean context, tokens)
        self._transfer: dict[int | None, tuple[float, float, float]] = {}  # remote TP → latency, bytes/token, B/s
        self._last_prefill: tuple[tuple[int, int, int, float, float] | None, PrefillCost] = (None, NO_PREFILL)

    @classmethod
    def from_profile(cls, profile: EngineProfile | None, served_model: str = "") -> EngineCost:
        """The cost of a pool's engine from its profile (the router config's ``pools.<role>.engine``); unknown
        GPU or model names fall back to the defaults (H100-SXM, Llama-3.1-8B): the online correction from the
        workers' own metrics (router/load.py) then carries the difference."""
        p = profile or DEFAULT_PROFILE
        return _cached(p.model_dump_json(), p.model or served_model)

    def step(self, tokens: float, sampled: int, seqs: int, pairs: float, kv_tokens: float) -> float:
        return self.perf.step_s(math.ceil(tokens), sampled, seqs, pairs, kv_tokens)

    def decode_step(self, batch: int, mean_ctx: float) -> float:
        """A decode-only step of ``batch`` streams with ``mean_ctx`` tokens of context each."""
        if batch <= 0:
            return 0.0
        key = (batch, mean_ctx)
        t = self._decode_memo.get(key)
        if t is None:
            if len(self._decode_memo) >= 4096:
                self._decode_memo.clear()
            t = self._decode_memo[key] = self.step(batch, batch, batch, batch * (mean_ctx + 1.0),
                                                   batch * (mean_ctx + 1.0))
        return t

    def chunked(self, tokens: int, cached: int = 0, decodes: int = 0, mean_ctx: float = 0.0,
                ahead: float = 0.0) -> tuple[int, float]:
        """The mixed steps until ``tokens`` uncached prompt tokens (after ``cached`` ones) behind ``ahead`` tokens
        of other prefills reach their first token, on an engine running ``decodes`` streams: (how many, one's
        seconds); (0, 0.0) for no prefill work. :meth:`prefill` without its breakdown (the router's hot path)."""
        room = self.budget - decodes
        if room < 1:
            room = 1
        total = (ahead if ahead > 0 else 0.0) + (tokens if tokens > 0 else 0)
        if total <= 0:
            return 0, 0.0
        k = math.ceil(total / room)
        if k < 1:  # a total so small (a decayed fraction of a token) that its share of a chunk underflows to 0
            k = 1
        x = total / k
        # attention: this prompt's tokens over its cached part and themselves, the decodes over their context,
        # the tokens ahead over their own chunk (their context is unknown: about half a chunk)
        streams_kv = decodes * (mean_ctx + 1.0)
        pairs = (tokens * (cached + tokens / 2.0) + ahead * (ahead if ahead < room else room) / 2.0) / k + streams_kv
        kv = streams_kv + cached + x
        return k, self.perf.step_s(math.ceil(decodes + x), decodes + 1, decodes + 1, pairs, kv)

    def backlog(self, decodes: int, mean_ctx: float, ahead: float) -> tuple[int, float]:
        """``chunked(0, 0, decodes, mean_ctx, ahead)``: the steps that clear ``ahead`` tokens of queued prefills
        beside ``decodes`` streams — a worker's state, not a request's, so priced once per state (each placement
        that reads the worker's queue prices it: the prefill there, and a remote request's wait on its decode
        worker)."""
        key = (decodes, mean_ctx, ahead)
        r = self._backlog_memo.get(key)
        if r is None:
            if len(self._backlog_memo) >= 4096:
                self._backlog_memo.clear()
            r = self._backlog_memo[key] = self.chunked(0, 0, decodes, mean_ctx, ahead)
        return r

    def prefill(self, tokens: int, cached: int = 0, decodes: int = 0, mean_ctx: float = 0.0,
                ahead: float = 0.0) -> PrefillCost:
        """``tokens`` uncached prompt tokens (after ``cached`` ones the engine holds) behind ``ahead`` tokens of
        other prefills, on an engine running ``decodes`` streams."""
        key = (tokens, cached, decodes, mean_ctx, ahead)
        if key == self._last_prefill[0]:  # one request prices the same prefill worker for two placements
            return self._last_prefill[1]
        k, t = self.chunked(tokens, cached, decodes, mean_ctx, ahead)
        if k == 0:
            return NO_PREFILL
        t_d = self.decode_step(decodes, mean_ctx)
        step_stall = t - t_d if t > t_d else 0.0
        stall, own = k * step_stall, k * t
        if ahead > 0 and tokens > 0:  # the streams wait for the prefills ahead anyway: count this prompt's share
            k_ahead, t_ahead = self.backlog(decodes, mean_ctx, ahead)
            stall -= k_ahead * (t_ahead - t_d if t_ahead > t_d else 0.0)
            own -= k_ahead * t_ahead
        cost = PrefillCost(k * t, k, t, step_stall, stall if stall > 0 else 0.0, own if own > 0 else 0.0)
        self._last_prefill = (key, cost)
        return cost

    def tpot(self, streams: int, mean_ctx: float, prefill_rate: float = 0.0) -> float:
        """Mean time per output token of ``streams`` running streams while prefill tokens arrive at
        ``prefill_rate`` tokens/s (module docstring)."""
        if streams < 1:
            streams = 1
        t_d = self.decode_step(streams, mean_ctx)
        if prefill_rate <= 0:
            return t_d
        return self.tpot_of(streams, t_d, self.mixed_step(streams, mean_ctx), prefill_rate)

    def tpot_of(self, streams: int, t_d: float, t_m: float, prefill_rate: float) -> float:
        """:meth:`tpot` from the streams' decode-only step ``t_d`` and mixed step ``t_m`` (``streams`` ≥ 1), for a
        caller that has them already."""
        if prefill_rate <= 0:
            return t_d
        room = self.budget - streams
        if room < 1:
            room = 1
        u = prefill_rate * t_m / room
        if u > 1.0:
            u = 1.0
        return 1.0 / (u / t_m + (1.0 - u) / t_d)

    def mixed_step(self, streams: int, mean_ctx: float) -> float:
        """One step of ``streams`` decodes beside a full chunk of prefill (the rest of the token budget): the
        longest step they can take, and so the ceiling of their TPOT however many prefills the worker
        receives (every step mixed, :meth:`tpot` at ``u`` = 1)."""
        if streams < 1:
            streams = 1
        key = (streams, mean_ctx)
        t_m = self._mixed_memo.get(key)
        if t_m is None:
            if len(self._mixed_memo) >= 4096:
                self._mixed_memo.clear()
            room = self.budget - streams
            t_m = self._mixed_memo[key] = self.chunked(room if room >= 1 else 1, 0, streams, mean_ctx)[1]
        return t_m

    def transfer(self, tokens: int, remote_tp: int | None = None) -> float:
        """PerfModel.transfer_time over this pool's transport (the same float), its constants kept per remote TP."""
        c = self._transfer.get(remote_tp)
        if c is None:
            perf, transport = self.perf, self.transport
            c = self._transfer[remote_tp] = (transport.latency_s, perf.kv_bytes_per_token,
                                             transport.bandwidth * perf.transfer_lanes(transport, remote_tp))
        return c[0] + tokens * c[1] / c[2]


@functools.lru_cache(maxsize=64)
def _cached(profile_json: str, model: str) -> EngineCost:
    p = EngineProfile.model_validate_json(profile_json)
    try:
        gpu = get_gpu(p.gpu)
    except PresetError:
        gpu = get_gpu(DEFAULT_PROFILE.gpu)
    try:
        preset = get_model(model) if model else get_model(DEFAULT_MODEL)
    except PresetError:
        preset = infer_model(model) or get_model(DEFAULT_MODEL)
    try:
        transport = get_transport(p.transport)
    except PresetError:
        transport = get_transport(DEFAULT_PROFILE.transport)
    tp, pp = p.tensor_parallel_size, p.pipeline_parallel_size
    if preset.layers % pp:
        pp = 1
    perf = PerfModel(gpu, preset, tp, pp)
    seqs, budget = vllm_batch_defaults(gpu)
    seqs, budget = p.max_num_seqs or seqs, p.max_num_batched_tokens or budget
    try:
        blocks = perf.num_kv_blocks(p.gpu_memory_utilization, p.block_size, budget, seqs)
    except KVCapacityError:
        blocks = 0
    return EngineCost(perf, budget, seqs, blocks * p.block_size or 1 << 20, transport)


BUDGET_STEP = 256  # budgets are multiples of this (vLLM accepts any; round numbers read better in a pod spec)


# a prefill worker's chunk may shrink to this share of the best prefill tokens/s its GPU reaches at any budget up to
# vLLM's default, and no further (prefill_chunk_budget): within 1 %, the bound costs its prefill nothing measurable
PLATEAU_SHARE = 0.99


def plateau_chunk_budget(cost: EngineCost, share: float = PLATEAU_SHARE) -> int:
    """The smallest multiple of :data:`BUDGET_STEP`, up to vLLM's default, whose one full prefill chunk runs at
    ``share`` of the best prefill tokens/s over those budgets: past a few thousand tokens a chunk's GEMMs are
    compute-bound and a larger chunk only adds attention over its own tokens (8B on an H100: the best at 2560
    tokens, 6 % less at vLLM's 8192, within 1 % from 1792)."""
    rate = {b: b / cost.prefill(b).step_s for b in range(BUDGET_STEP, cost.budget + 1, BUDGET_STEP)}
    if not rate:
        return cost.budget
    best = max(rate.values())
    return min(b for b, r in rate.items() if r >= share * best)


def pool_chunk_budget(cost: EngineCost, role: Role, tpot_slo_s: float, elastic_fleet: bool,
                      floor: int = BUDGET_STEP) -> int | None:
    """A pool's default ``--max-num-batched-tokens`` (the spec sets none; builders/workers.py ``chunk_budget``, and
    the goodput bench's (c), which builds its pools without a spec): the decode pool's streams bound it
    (:func:`tpot_chunk_budget`); so do the prefill pool's in an elastic fleet, never below the prefill plateau
    (:func:`prefill_chunk_budget`); a prefill pool that only prefills and the aggregated pool: None (vLLM's
    default)."""
    if role == "decode":
        return tpot_chunk_budget(cost, tpot_slo_s, floor)
    if role == "prefill" and elastic_fleet:
        return prefill_chunk_budget(cost, tpot_slo_s, floor)
    return None


def prefill_chunk_budget(cost: EngineCost, tpot_slo_s: float, floor: int = BUDGET_STEP) -> int:
    """The prefill pool's ``--max-num-batched-tokens`` in an elastic fleet (its workers serve whole requests too)
    when the user sets none: the TPOT-bounded chunk (:func:`tpot_chunk_budget`), but never below the prefill
    plateau (:func:`plateau_chunk_budget`) — streams on a prefill worker are its spare capacity, prefill is its
    job. With a TPOT target too tight for a plateau chunk the whole requests it would serve miss TPOT anyway, and
    the placement (router/placement.py) prices them so."""
    return max(tpot_chunk_budget(cost, tpot_slo_s, floor), plateau_chunk_budget(cost))


def tpot_chunk_budget(cost: EngineCost, tpot_slo_s: float, floor: int = BUDGET_STEP) -> int:
    """The ``--max-num-batched-tokens`` of a pool whose workers run streams (decode; prefill in an elastic fleet:
    builders/workers.py ``chunk_budget``) when the user sets none: the largest multiple of :data:`BUDGET_STEP`, up
    to vLLM's default for the GPU, whose one full prefill chunk takes at most the TPOT target
    (spec.slo.tpotP95Ms). Each step that carries a prefill is then no longer than one TPOT target, so the streams
    running beside it keep their mean within it even while every step carries a chunk — the bound that vLLM's
    default (8192 tokens on an H100: ~0.2 s per chunk for an 8B model) does not give. At least ``floor`` (vLLM
    refuses a budget below ``--max-num-seqs``)."""
    best = floor
    for b in range(cost.budget - cost.budget % BUDGET_STEP, BUDGET_STEP - 1, -BUDGET_STEP):
        if cost.prefill(b).step_s <= tpot_slo_s:
            best = b
            break
    return max(floor, min(best, cost.budget))
