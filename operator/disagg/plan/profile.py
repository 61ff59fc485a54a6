"""The traffic profile ``disagg plan`` reads: what the traffic is, what it must meet, what it may run on.

YAML on the wire (camelCase, unknown fields refused, like the DisaggregatedModel API); every error names its field
(``traffic.rate.meanRps: Field required``) and, where it helps, what to write instead. docs/planning.md shows a
whole profile; docs/examples/profiles/profile-chat.yaml and profile-rag.yaml are two.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from ..perf.presets import GPUS, MODELS, GPUPreset, ModelPreset, PresetError, get_gpu, get_model

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
Z95 = 1.6448536269514722  # standard normal 95th percentile


class ProfileError(ValueError):
    """A profile that cannot be planned; ``str()`` is one line per problem, each naming its field."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


# ------------------------------------------------------------------------------------------ distributions


class Bin(_Model):
    tokens: int = Field(ge=1, le=10_485_760, description="Token count of this bin.")
    share: float = Field(gt=0, description="Relative weight of this bin (normalised over the histogram).")


class TokenDist(_Model):
    """A token-length distribution: ``mean`` + ``p95`` (a lognormal fit), ``fixed``, or a ``histogram``."""

    mean: float | None = Field(default=None, gt=0, description="Mean tokens per request.")
    p95: float | None = Field(default=None, gt=0, description="95th percentile tokens per request.")
    fixed: int | None = Field(default=None, ge=1, description="Every request has exactly this many tokens.")
    histogram: list[Bin] | None = Field(default=None, min_length=1, max_length=64,
                                        description="Bins of {tokens, share}.")

    @model_validator(mode="after")
    def _one_form(self) -> TokenDist:
        forms = [f for f, v in (("mean/p95", self.mean), ("fixed", self.fixed), ("histogram", self.histogram))
                 if v is not None]
        if self.p95 is not None and self.mean is None:
            raise ValueError("p95 needs mean too (mean + p95 fit a lognormal)")
        if len(forms) != 1:
            raise ValueError("give exactly one of: mean (+ optional p95), fixed, histogram"
                             + (f" (got {', '.join(forms)})" if forms else ""))
        if self.mean is not None and self.p95 is not None:
            if self.p95 < self.mean:
                raise ValueError(f"p95 ({self.p95:g}) is below mean ({self.mean:g}): a lognormal cannot have that; "
                                 "give a histogram")
            if math.log(self.p95 / self.mean) > Z95**2 / 2:
                raise ValueError(f"p95/mean = {self.p95 / self.mean:.1f} is more than a lognormal allows (3.87); "
                                 "give a histogram for a tail this heavy")
        return self

    def bins(self, n: int = 10) -> list[tuple[float, float]]:
        """``(tokens, weight)`` pairs, weights summing to 1: the histogram, or ``n`` equal-mass quantile bins."""
        if self.fixed is not None:
            return [(float(self.fixed), 1.0)]
        if self.histogram is not None:
            total = sum(b.share for b in self.histogram)
            return [(float(b.tokens), b.share / total) for b in self.histogram]
        assert self.mean is not None
        if self.p95 is None or self.p95 == self.mean:
            return [(self.mean, 1.0)]
        # lognormal: mean = exp(mu + s²/2), p95 = exp(mu + z s) → z s - s²/2 = ln(p95/mean), smaller root
        s = Z95 - math.sqrt(Z95**2 - 2 * math.log(self.p95 / self.mean))
        mu = math.log(self.mean) - s * s / 2
        out = []
        for k in range(n):
            z = _norm_ppf((k + 0.5) / n)
            out.append((max(1.0, math.exp(mu + s * z)), 1.0 / n))
        # rescale so that the bins keep the requested mean exactly
        m = sum(t * w for t, w in out)
        return [(max(1.0, t * self.mean / m), w) for t, w in out]


def _norm_ppf(p: float) -> float:
    """Inverse standard normal CDF (Acklam's rational approximation, |error| < 1.2e-9)."""
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
         -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
         -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00,
         4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    if p < 0.02425:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
            (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - 0.02425:
        return -_norm_ppf(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / (
        ((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


# ------------------------------------------------------------------------------------------------ traffic


class Rate(_Model):
    mean_rps: float = Field(gt=0, le=1_000_000, description="Average arrivals, requests per second.")
    peak_rps: float | None = Field(default=None, gt=0, le=1_000_000,
                                   description="Peak arrivals the SLO must hold at (default: meanRps).")

    @model_validator(mode="after")
    def _peak(self) -> Rate:
        if self.peak_rps is not None and self.peak_rps < self.mean_rps:
            raise ValueError(f"peakRps ({self.peak_rps:g}) is below meanRps ({self.mean_rps:g})")
        return self

    @property
    def peak(self) -> float:
        return self.peak_rps if self.peak_rps is not None else self.mean_rps


class Burstiness(_Model):
    """How bursty the arrivals are beyond their mean and peak rates (``disagg plan --from-log`` measures it; plan/
    burst.py). Unknown → Poisson: ``interarrivalCv`` 1, and a short window's peak is what arrivals at peakRps show in
    one such window in twenty (``window_peak``)."""

    interarrival_cv: float = Field(default=1.0, ge=0, le=100,
                                   description="Coefficient of variation of the gaps between arrivals (1: Poisson, "
                                   "0: evenly spaced, > 1: bursty); the queues wait (ca² + cs²) / 2 × the M/M/c "
                                   "wait, ca = this.")
    peak_rps_1s: float | None = Field(default=None, alias="peakRps1s", gt=0, le=1_000_000,
                                      description="Most arrivals in any 1-s window, per second.")
    peak_rps_10s: float | None = Field(default=None, alias="peakRps10s", gt=0, le=1_000_000,
                                       description="Most arrivals in any 10-s window, per second.")
    peak_rps_60s: float | None = Field(default=None, alias="peakRps60s", gt=0, le=1_000_000,
                                       description="Most arrivals in any 60-s window, per second.")

    @model_validator(mode="after")
    def _ordered(self) -> Burstiness:
        given = [(w, v) for w, v in (("1s", self.peak_rps_1s), ("10s", self.peak_rps_10s),
                                     ("60s", self.peak_rps_60s)) if v is not None]
        for (w1, v1), (w2, v2) in itertools.pairwise(given):
            if v1 < v2:
                raise ValueError(f"peakRps{w1} ({v1:g}) is below peakRps{w2} ({v2:g}): the busiest short window is "
                                 "at least as busy as the busiest longer one")
        return self

    def peak(self, window: str) -> float | None:
        return {"1s": self.peak_rps_1s, "10s": self.peak_rps_10s, "60s": self.peak_rps_60s}.get(window)

    @property
    def ca2(self) -> float:
        return self.interarrival_cv ** 2


class Tenant(_Model):
    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL)
    share: float = Field(gt=0, le=1, description="Share of the arrivals (normalised over the tenants).")
    input_tokens: TokenDist | None = Field(default=None, description="Overrides traffic.inputTokens.")
    output_tokens: TokenDist | None = Field(default=None, description="Overrides traffic.outputTokens.")
    prefix_cache_hit_share: float | None = Field(default=None, ge=0, lt=1,
                                                 description="Overrides traffic.prefixCacheHitShare.")


class Traffic(_Model):
    input_tokens: TokenDist = Field(description="Prompt tokens per request.")
    output_tokens: TokenDist = Field(description="Generated tokens per request.")
    rate: Rate = Field(description="Arrival rate: meanRps and peakRps.")
    prefix_cache_hit_share: float = Field(default=0.0, ge=0, lt=1,
                                          description="Share of prompt tokens served from the prefix cache.")
    tenants: list[Tenant] = Field(default_factory=list, max_length=16)
    burstiness: Burstiness = Field(default_factory=Burstiness,
                                   description="Inter-arrival variability and short-window peaks (default Poisson).")

    @model_validator(mode="after")
    def _peaks_above_mean(self) -> Traffic:
        b = self.burstiness
        for w in ("1s", "10s", "60s"):
            v = b.peak(w)
            if v is not None and v < self.rate.mean_rps:
                raise ValueError(f"burstiness.peakRps{w} ({v:g}) is below rate.meanRps ({self.rate.mean_rps:g}): a "
                                 "window's peak is at least the mean")
        return self

    @field_validator("tenants")
    @classmethod
    def _unique(cls, v: list[Tenant]) -> list[Tenant]:
        names = [t.name for t in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"tenant names must be unique: {', '.join(dup)}")
        return v


# ----------------------------------------------------------------------------------------- slo, model, gpus


class SLO(_Model):
    ttft_p95_ms: int = Field(ge=1, le=600_000, description="p95 time to first token, ms.")
    tpot_p95_ms: int = Field(ge=1, le=60_000, description="p95 time per output token, ms.")
    goodput_target: float = Field(default=0.9, gt=0, le=1,
                                  description="Share of requests that must meet both targets.")


class ModelConfig(_Model):
    """A model's shapes, as in its config.json (dense SwiGLU or MoE)."""

    layers: int = Field(ge=1, le=1024)
    hidden: int = Field(ge=64, le=131072, description="hidden_size")
    heads: int = Field(ge=1, le=1024, description="num_attention_heads")
    kv_heads: int = Field(ge=1, le=1024, description="num_key_value_heads")
    head_dim: int | None = Field(default=None, ge=8, le=1024, description="default hidden / heads")
    intermediate: int = Field(default=0, ge=0, description="intermediate_size (dense MLP; 0 for all-MoE)")
    vocab: int = Field(default=128256, ge=1, description="vocab_size")
    max_position: int = Field(default=131072, ge=1, description="max_position_embeddings")
    tie_embeddings: bool = False
    num_experts: int = Field(default=0, ge=0)
    experts_per_token: int = Field(default=0, ge=0)
    moe_intermediate: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _shape(self) -> ModelConfig:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kvHeads ({self.kv_heads})")
        if self.num_experts:
            if not (0 < self.experts_per_token <= self.num_experts) or not self.moe_intermediate:
                raise ValueError("an MoE model needs expertsPerToken (1..numExperts) and moeIntermediate")
        elif not self.intermediate:
            raise ValueError("a dense model needs intermediate (its MLP width); an MoE model needs numExperts, "
                             "expertsPerToken and moeIntermediate")
        return self


class ModelChoice(_Model):
    preset: str | None = Field(default=None, description=f"One of perf/presets.py: {', '.join(MODELS)}.")
    config: ModelConfig | None = Field(default=None, description="Shapes, for a model without a preset.")
    name: str | None = Field(default=None, max_length=253,
                             description="What vLLM serves (spec.model.name); default the preset's hub id.")
    served_name: str | None = Field(default=None, max_length=253)
    max_model_len: int | None = Field(default=None, ge=1, le=10_485_760)

    @model_validator(mode="after")
    def _one(self) -> ModelChoice:
        if (self.preset is None) == (self.config is None):
            raise ValueError("give exactly one of preset (a name from perf/presets.py) or config (the model's shapes)")
        if self.config is not None and not self.name:
            raise ValueError("a model given by config needs name (the hub id or path vLLM serves)")
        if self.preset is not None:
            try:
                get_model(self.preset)
            except PresetError as e:
                raise ValueError(f"{e}; or describe the model under config") from None
        return self

    def resolve(self) -> ModelPreset:
        if self.preset is not None:
            return get_model(self.preset)
        c = self.config
        assert c is not None and self.name is not None
        return ModelPreset(
            name=self.name.rsplit("/", 1)[-1], hf_id=self.name, hidden=c.hidden, layers=c.layers, heads=c.heads,
            kv_heads=c.kv_heads, head_dim=c.head_dim or c.hidden // c.heads, intermediate=c.intermediate,
            vocab=c.vocab, max_position=c.max_position, tie_embeddings=c.tie_embeddings, num_experts=c.num_experts,
            experts_per_token=c.experts_per_token, moe_intermediate=c.moe_intermediate)

    @property
    def served_model(self) -> str:
        return self.name or self.resolve().hf_id


class GPUOffer(_Model):
    type: str = Field(description=f"A GPU preset of perf/presets.py: {', '.join(GPUS)}.")
    count: int = Field(ge=1, le=100_000, description="GPUs of this type on offer.")
    cost: float = Field(default=1.0, gt=0, description="Relative cost of one GPU-hour.")
    product: str | None = Field(default=None, max_length=253,
                                description="Node-label value for spec.<pool>.gpu.product "
                                "(e.g. NVIDIA-H100-80GB-HBM3).")
    resource_name: str | None = Field(default=None, max_length=253,
                                      description="Extended resource (default nvidia.com/gpu).")

    @field_validator("type")
    @classmethod
    def _known(cls, v: str) -> str:
        try:
            return get_gpu(v).name
        except PresetError as e:
            raise ValueError(f"{e}; add a preset to perf/presets.py or offer one of these") from None

    @property
    def preset(self) -> GPUPreset:
        return get_gpu(self.type)


TP = Literal[1, 2, 4, 8]
ModeName = Literal["aggregated", "disaggregated", "conditional"]


def _all_tps() -> list[TP]:
    return [1, 2, 4, 8]


def _all_modes() -> list[ModeName]:
    return ["aggregated", "disaggregated", "conditional"]


class Search(_Model):
    max_gpus: int = Field(default=16, ge=1, le=64, description="Most GPUs one candidate may use.")
    tensor_parallel: list[TP] = Field(default_factory=_all_tps, min_length=1)
    modes: list[ModeName] = Field(default_factory=_all_modes, min_length=1)
    max_num_batched_tokens: int = Field(default=8192, ge=256, le=1_048_576,
                                        description="Prefill chunk per engine step (vLLM's default 8192).")
    gpu_memory_utilization: float = Field(default=0.9, gt=0.1, le=1)
    cover_peak: Literal["none", "1s", "10s", "60s"] = Field(
        default="10s", description="Headroom: a candidate must also meet the SLOs at traffic.burstiness's peak over "
        "this window when the profile declares it, else at the rate arrivals at peakRps (with the declared "
        "interarrivalCv) exceed in one such window in twenty; none: at peakRps only.")
    extra_headroom: float = Field(default=0.0, ge=0, le=10,
                                  description="Headroom: the rate covered is (1 + this) × the larger of peakRps and "
                                  "the coverPeak window's peak.")


WINDOW_S = {"1s": 1.0, "10s": 10.0, "60s": 60.0}


def window_peak(rate: float, window_s: float, ca2: float = 1.0) -> float:
    """The rate one window of ``window_s`` seconds in twenty exceeds when arrivals come at ``rate`` with inter-arrival
    cv² ``ca2``: a renewal process's count over a window of length t has mean λt and variance ≈ ca²·λt (Cox 1962,
    *Renewal Theory*, §4.5), taken as normal. Poisson arrivals at a declared peak rate are not at that rate in every
    window, and a queue near its limit keeps the backlog of the busier windows into the next."""
    if rate <= 0 or window_s <= 0:
        return rate
    return rate + Z95 * math.sqrt(ca2 * rate / window_s)


class Profile(_Model):
    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL, description="metadata.name of the plan.")
    namespace: str | None = Field(default=None, max_length=63, pattern=DNS_LABEL)
    model: ModelChoice
    traffic: Traffic
    slo: SLO
    gpus: list[GPUOffer] = Field(min_length=1, max_length=8)
    kv_transport: Literal["rdma", "nvlink", "tcp"] = Field(default="rdma")
    prometheus_url: str | None = Field(default=None, pattern=r"^https?://",
                                       description="Enables autoscaling in the emitted spec.")
    search: Search = Field(default_factory=Search)

    @field_validator("gpus")
    @classmethod
    def _distinct(cls, v: list[GPUOffer]) -> list[GPUOffer]:
        names = [g.type for g in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"each GPU type once: {', '.join(dup)} listed twice (sum the counts)")
        return v

    def cover_rate(self) -> tuple[float, str]:
        """The arrival rate a plan must meet the SLOs at, and what it is: the larger of ``peakRps`` and the peak over
        ``search.coverPeak`` — the declared one, else what arrivals at ``peakRps`` with the declared inter-arrival
        cv show in one window of that length in twenty (:func:`window_peak`) — times (1 + ``search.extraHeadroom``)."""
        peak = self.traffic.rate.peak
        w = self.search.cover_peak
        b = self.traffic.burstiness
        short = b.peak(w) if w != "none" else None
        what = f"traffic.burstiness.peakRps{w}"
        if short is None and w != "none":
            short = window_peak(peak, WINDOW_S[w], b.ca2)
            what = f"peakRps's own {w} windows (p95, cv {b.interarrival_cv:g})"
        base, what = (short, what) if short is not None and short > peak else (peak, "peakRps")
        x = self.search.extra_headroom
        if x > 0:
            return base * (1 + x), f"{what} + {x:.0%}"
        return base, what


# ------------------------------------------------------------------------------------------------ loading

_HINTS = {
    "traffic.rate": "give meanRps (requests/s) and optionally peakRps",
    "traffic": "give inputTokens, outputTokens and rate",
    "slo": "give ttftP95Ms and tpotP95Ms (and optionally goodputTarget)",
    "gpus": "list GPU types on offer: - {type: H100-SXM, count: 16, cost: 1.0}",
    "model": "give preset: Llama-3.1-8B (a perf/presets.py name) or config: {layers, hidden, heads, kvHeads, ...}",
}


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).startswith(("function-", "literal[")):
            out += f".{part}" if out else str(part)
    return out


def parse_profile(data: Any) -> Profile:
    """A validated Profile, or ProfileError with one ``field: message`` line per problem."""
    if not isinstance(data, dict):
        raise ProfileError([f"a profile must be a YAML mapping, not {type(data).__name__}"])
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = _loc(tuple(err["loc"])) or "(profile)"
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "missing" and where in _HINTS:
                msg += f": {_HINTS[where]}"
            elif err["type"] == "extra_forbidden":
                msg = "unknown field"
            problems.append(f"{where}: {msg}")
        raise ProfileError(problems) from None


def load_profile(path: Path) -> Profile:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ProfileError([f"{path}: {e.strerror or e}"]) from None
    except yaml.YAMLError as e:
        raise ProfileError([f"{path}: not YAML: {e}"]) from None
    return parse_profile(data)
