"""The autoscaler's sizing with the planner's performance model (plan/model.py, the one ``disagg plan`` uses).

:class:`ModelSizer` implements :class:`disagg.autoscaling.predictive.Sizer`: for a forecast
:class:`~disagg.autoscaling.forecast.Load` (remote and local request rates, their mean prompt lengths, the mean
output length) it builds the planner's binned :class:`~disagg.plan.model.Workload` (one input bin per path, one
output bin), the pool models of the prefill and decode engines (GPU × TP, the roofline), and finds

* **prefill**: the fewest replicas whose G/G/c queue (Allen–Cunneen, model.py ``prefill_queue``) keeps
  P(remote TTFT ≤ target) ≥ :data:`QUANTILE`, TTFT = queue wait + own prefill + KV transfer + the first decode step
  (the queue wait counts in TTFT), target = headroom × SLO ÷ the observed/expected TTFT correction;
* **decode**: the fewest replicas whose decode side (model.py ``decode_side``: Little's-law batch, TPOT with the
  local prefill chunks' interference, KV-cache and maxNumSeqs limits) is not saturated, has a mean TPOT ≤ headroom ×
  SLO ÷ the TPOT correction, and keeps P(local TTFT ≤ target) ≥ :data:`QUANTILE`.

Both searches are bisections (more replicas never hurt in the model). Pure; the pool models are rebuilt per call
(two input bins: a few roofline evaluations).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..api.models import DisaggregatedModelSpec
from ..autoscaling.forecast import Load
from ..autoscaling.predictive import Expected, Need
from ..perf.presets import GPUPreset, ModelPreset, TransportPreset, vllm_batch_defaults
from .model import PoolModel, Workload, context_sq_sum, decode_side, pool_model, prefill_queue, transfers

QUANTILE = 0.95  # the share of requests whose TTFT the sizing keeps within the target (the SLO is a p95)
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization


@dataclass(frozen=True)
class ModelSizer:
    gpu: GPUPreset
    model: ModelPreset
    transport: TransportPreset
    ttft_slo_s: float
    tpot_slo_s: float
    prefill_tp: int = 1
    decode_tp: int = 1
    max_replicas: int = 64
    # the pools' --max-num-batched-tokens as the operator renders them (builders/workers.py ``chunk_budget``);
    # None: vLLM's default for the GPU
    prefill_chunk: int | None = None
    decode_chunk: int | None = None

    def _workload(self, load: Load) -> Workload:
        rps = max(load.rps, 1e-9)
        wr, wl = load.remote_rps / rps, load.local_rps / rps
        if wr + wl <= 0:
            wr, wl = 0.0, 1.0
        ctx = (wr * load.remote_in + wl * load.local_in) + load.out / 2
        o = max(load.out, 1e-9)  # one answer length: E[out·ctx²] ÷ out is the mean squared context
        ctx_sq = context_sq_sum(((load.remote_in, wr), (load.local_in, wl)), ((o, 1.0),)) / o
        return Workload(("all",), (1.0,), (load.remote_in, load.local_in), (load.remote_in, load.local_in),
                        (wr, wl), (0, 0), (load.out,), (1.0,), (0,), rps, rps, load.out,
                        wr * load.remote_in + wl * load.local_in, ctx, decode_context_sq=ctx_sq)

    def _pools(self, wl: Workload) -> tuple[PoolModel, PoolModel]:
        _, default = vllm_batch_defaults(self.gpu)
        pm = pool_model(self.gpu, self.prefill_tp, 1.0, self.model, wl, self.prefill_chunk or default,
                        GPU_MEMORY_UTILIZATION)
        dm = pool_model(self.gpu, self.decode_tp, 1.0, self.model, wl, self.decode_chunk or default,
                        GPU_MEMORY_UTILIZATION)
        return pm, dm

    def _prefill_ok(self, pm: PoolModel, dm: PoolModel, wl: Workload, p: int, tau: float,
                    step_s: float) -> bool:
        if wl.in_weight[0] <= 0:
            return True
        q = prefill_queue(pm, p, wl, wl.mean_rps, (True, False))
        if q.saturated:
            return False
        fixed = pm.solo[0] + transfers(dm, wl, self.transport, self.prefill_tp)[0] + step_s
        return q.p_wait_le(tau - fixed) >= QUANTILE

    def _decode_ok(self, dm: PoolModel, wl: Workload, d: int, tau_ttft: float, tau_tpot: float) -> bool:
        side = decode_side(dm, d, wl, wl.mean_rps, (False, True), tau_tpot)
        if side.saturated or side.tpot_ok[0] < QUANTILE:
            return False
        if wl.in_weight[1] <= 0:
            return True
        return side.local_queue.p_wait_le(tau_ttft - side.local_fixed[1]) >= QUANTILE

    def size(self, load: Load, headroom: float, ttft_corr: float, tpot_corr: float) -> Need:
        if load.rps <= 0:
            return Need(1, 1, "no load")
        wl = self._workload(load)
        pm, dm = self._pools(wl)
        tau_ttft = headroom * self.ttft_slo_s / max(ttft_corr, 1e-3)
        # TPOT has a floor (one decode step at batch 1 streams the weights): the headroom applies to half the SLO
        tau_tpot = (1 + headroom) / 2 * self.tpot_slo_s / max(tpot_corr, 1e-3)
        d = _fewest(lambda n: self._decode_ok(dm, wl, n, tau_ttft, tau_tpot), self.max_replicas)
        side = decode_side(dm, d, wl, wl.mean_rps, (False, True), self.tpot_slo_s)
        step_s = side.step_s if math.isfinite(side.step_s) else 0.0
        p = _fewest(lambda n: self._prefill_ok(pm, dm, wl, n, tau_ttft, step_s), self.max_replicas)
        return Need(p, d, f"model: {p}P + {d}D")

    def expected(self, load: Load, prefill: int, decode: int) -> Expected:
        if load.rps <= 0:
            return Expected(None, None)
        wl = self._workload(load)
        pm, dm = self._pools(wl)
        side = decode_side(dm, max(1, decode), wl, wl.mean_rps, (False, True), self.tpot_slo_s)
        tpot = None if side.saturated else side.tpot_mean_s
        ttft = None
        if load.remote_rps > 0 and prefill > 0 and not side.saturated:
            q = prefill_queue(pm, prefill, wl, wl.mean_rps, (True, False))
            if not q.saturated:
                ttft = q.mean_wait + pm.solo[0] + transfers(dm, wl, self.transport, self.prefill_tp)[0] + side.step_s
        return Expected(ttft, tpot)

    def per_replica(self, load: Load, ttft_corr: float, tpot_corr: float) -> tuple[float, float]:
        """The highest rate (of ``load``'s mix) one replica holds at the SLA: the remote requests/s one prefill
        replica holds, and the requests/s (all) one decode replica holds — Dynamo's profiled throughput per
        replica, here from the model (bisection on the rate)."""
        if load.rps <= 0:
            return 0.0, 0.0
        unit = load.scaled(1.0 / load.rps)  # the mix at 1 req/s

        def holds(pool: str, rate: float) -> bool:
            n = self.size(unit.scaled(rate), 1.0, ttft_corr, tpot_corr)
            return (n.prefill if pool == "prefill" else n.decode) <= 1

        out = []
        for pool in ("prefill", "decode"):
            lo, hi = 0.0, 1.0
            while holds(pool, hi) and hi < 1e4:
                lo, hi = hi, hi * 2
            for _ in range(20):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if holds(pool, mid) else (lo, mid)
            out.append(lo)
        share = unit.remote_rps
        return out[0] * share, out[1]


def _fewest(ok: Callable[[int], bool], hi: int) -> int:
    """The smallest n in [1, hi] with ok(n) (monotone); hi when none."""
    if ok(1):
        return 1
    if not ok(hi):
        return hi
    lo = 1  # not ok
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def sizer_for_spec(spec: DisaggregatedModelSpec) -> tuple[ModelSizer, float] | str:
    """The predictive autoscaler's sizing for a model (``spec.autoscaling.policy: Predictive``) and its pod start
    (``spec.autoscaling.podStartSeconds``, else the twin's estimate from the model's size), or why the performance
    model cannot size it (the operator then scales proportionally and says so in each decision's reason)."""
    from ..builders.workers import chunk_budget
    from ..perf.presets import PresetError, get_gpu, get_transport, infer_model
    from ..plan.verify import TRANSPORTS
    from ..twin.autoscaler import pod_start_s

    model = infer_model(spec.model.name)
    if model is None:
        return f"spec.model.name {spec.model.name!r} matches no model of the performance model (disagg plan's presets)"
    products = {spec.prefill.gpu.product, spec.decode.gpu.product}
    if len(products) != 1 or None in products:
        return ("spec.prefill.gpu.product and spec.decode.gpu.product must name the same GPU for the predictive "
                f"sizing (got {spec.prefill.gpu.product!r} and {spec.decode.gpu.product!r})")
    for where, pool in (("spec.prefill", spec.prefill), ("spec.decode", spec.decode)):
        if pool.parallelism.pipeline != 1 or pool.parallelism.data != 1 or pool.nodes_per_replica != 1:
            return f"{where}: the performance model sizes tensor-parallel single-node replicas only"
    try:
        gpu = get_gpu(str(spec.decode.gpu.product))
        transport = get_transport(TRANSPORTS.get(str(spec.kv_transfer.transport), "rdma"))
    except PresetError as e:
        return f"spec.decode.gpu.product: {e}"
    sizer = ModelSizer(gpu, model, transport, spec.slo.ttft_p95_ms / 1000.0, spec.slo.tpot_p95_ms / 1000.0,
                       prefill_tp=spec.prefill.parallelism.tensor, decode_tp=spec.decode.parallelism.tensor,
                       max_replicas=max(spec.prefill.max_replicas, spec.decode.max_replicas),
                       prefill_chunk=chunk_budget(spec, "prefill"), decode_chunk=chunk_budget(spec, "decode"))
    start = spec.autoscaling.pod_start_seconds
    return sizer, float(start) if start is not None else pod_start_s(model.name, tp=spec.decode.parallelism.tensor)
