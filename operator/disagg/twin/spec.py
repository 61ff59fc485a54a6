"""What a twin cluster is made of (cluster.py builds and runs it): its pools of identical workers (``PoolSpec``: GPU,
model preset, parallelism, vLLM's batch flags) and the cluster around them (``ClusterSpec``: the router's config
and knobs, the scrape interval, the KV transport, the drain), with the YAML shape of ``disagg twin --scenario``
and its errors, each naming the field."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..api.contract import RouterConfig
from ..router.policy_types import Tuning

ROLES = ("prefill", "decode", "aggregated")
DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEFAULT_SCRAPE_INTERVAL_S = 1.0  # disagg router --scrape-interval's default (router/cli.py)
# The router's default drain: requests still unfinished this long after the last arrival are recorded as such.
DEFAULT_DRAIN_S = 3600.0


@dataclass(frozen=True)
class PoolSpec:
    """``count`` identical workers. ``extra_args``: further ``disagg sim`` (vLLM) flags, e.g.
    ``("--no-enable-prefix-caching",)`` or ``("--kv-cache-dtype", "fp8")``."""

    count: int
    gpu: str = "H100-SXM"
    model_preset: str = "Llama-3.1-8B"
    tp: int = 1
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    extra_args: tuple[str, ...] = ()

    def argv(self, model: str) -> list[str]:
        argv = [model, "--gpu", self.gpu, "--model-preset", self.model_preset,
                "--tensor-parallel-size", str(self.tp)]
        if self.max_num_seqs is not None:
            argv += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_num_batched_tokens is not None:
            argv += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        return argv + list(self.extra_args)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> PoolSpec:
        known = {"count", "gpu", "model_preset", "tp", "max_num_seqs", "max_num_batched_tokens", "extra_args"}
        alias = {"modelPreset": "model_preset", "maxNumSeqs": "max_num_seqs",
                 "maxNumBatchedTokens": "max_num_batched_tokens", "extraArgs": "extra_args"}
        kw: dict[str, Any] = {}
        for k, v in data.items():
            name = alias.get(k, k)
            if name not in known:
                raise ValueError(f"{where}.{k}: unknown field (one of {', '.join(sorted(known))})")
            kw[name] = tuple(str(x) for x in v) if name == "extra_args" else v
        if "count" not in kw:
            raise ValueError(f"{where}.count: required")
        return cls(**kw)


@dataclass(frozen=True)
class ClusterSpec:
    """The pools, the router's config and knobs, the KV transport. ``router`` may be a RouterConfig or the dict
    that ``router.yaml`` holds (validated by RouterConfig, so a wrong field is named)."""

    prefill: PoolSpec | None = None
    decode: PoolSpec | None = None
    aggregated: PoolSpec | None = None
    router: RouterConfig | Mapping[str, Any] = field(default_factory=RouterConfig)
    tuning: Tuning = field(default_factory=Tuning)
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
    transport: str = "rdma"  # KV transport preset (perf/presets.py): rdma, nvlink, tcp
    # the decode engines' kv_transfer_config kv_load_failure_policy (spec.kvTransfer.loadFailurePolicy)
    kv_load_failure_policy: str = "recompute"
    model: str = DEFAULT_MODEL
    drain_s: float = DEFAULT_DRAIN_S  # virtual seconds after the last arrival before unfinished requests give up

    def router_config(self) -> RouterConfig:
        if isinstance(self.router, RouterConfig):
            return self.router
        return RouterConfig.model_validate(dict(self.router))

    def pools(self) -> dict[str, PoolSpec]:
        return {r: p for r, p in (("prefill", self.prefill), ("decode", self.decode),
                                  ("aggregated", self.aggregated)) if p is not None and p.count > 0}

    def validate(self) -> None:
        for role, p in (("prefill", self.prefill), ("decode", self.decode), ("aggregated", self.aggregated)):
            if p is not None and p.count < 0:
                raise ValueError(f"{role}.count: must be >= 0, got {p.count}")
        if not self.pools().keys() & {"decode", "aggregated"}:
            raise ValueError("decode.count / aggregated.count: the cluster needs a decode or an aggregated worker")
        if self.scrape_interval_s <= 0:
            raise ValueError(f"scrape_interval_s: must be > 0, got {self.scrape_interval_s}")
        if self.drain_s <= 0:
            raise ValueError(f"drain_s: must be > 0, got {self.drain_s}")
        if self.kv_load_failure_policy not in ("recompute", "fail"):
            raise ValueError(f"kv_load_failure_policy: recompute or fail, got {self.kv_load_failure_policy!r}")
        self.router_config()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClusterSpec:
        """The YAML shape of ``disagg twin --scenario``: pools under their role names, ``router`` (router.yaml),
        ``tuning`` (policy.Tuning fields), ``scrapeIntervalS``, ``transport``, ``kvLoadFailurePolicy``, ``model``,
        ``drainS``."""
        kw: dict[str, Any] = {}
        for k, v in data.items():
            if k in ROLES:
                kw[k] = PoolSpec.from_dict(v or {}, k) if v is not None else None
            elif k == "router":
                kw["router"] = RouterConfig.model_validate(v or {})
            elif k == "tuning":
                kw["tuning"] = Tuning(**(v or {}))
            elif k in ("scrapeIntervalS", "scrape_interval_s"):
                kw["scrape_interval_s"] = float(v)
            elif k in ("drainS", "drain_s"):
                kw["drain_s"] = float(v)
            elif k in ("transport", "model"):
                kw[k] = str(v)
            elif k in ("kvLoadFailurePolicy", "kv_load_failure_policy"):
                kw["kv_load_failure_policy"] = str(v)
            elif k not in ("arrivals", "workload", "slo", "seed"):  # the scenario's other sections (cli.py)
                raise ValueError(f"{k}: unknown cluster field")
        spec = cls(**kw)
        spec.validate()
        return spec

    def gpus(self) -> int:
        return sum(p.count * p.tp for p in self.pools().values())
