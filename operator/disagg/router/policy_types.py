"""What the routing decision (policy.py ``decide``) reads and returns: the request's features, every worker's load
(``WorkerLoad``, one ``LoadSnapshot`` per request), the router's knobs outside the API (``Tuning``) and the
``Decision``. Plain values, no behaviour: the router's request core (core.py), the twin, the benchmarks and the
tests build them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

if TYPE_CHECKING:
    from ..perf.costs import EngineCost

DecisionKind = Literal["remote", "local", "reject"]
DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class RequestFeatures:
    request_id: str
    endpoint: str  # /v1/completions | /v1/chat/completions
    input_tokens: int
    max_tokens: int | None = None  # what the client asked for, if anything
    tenant: str | None = None  # TenantPolicy.name, None when no tenant matched
    canary_fraction: float = 0.0  # features.request_hash_fraction(request_id)


class WorkerLoad(NamedTuple):
    """One worker's load for the policy, built for every ready worker on every request (a NamedTuple: about half
    the cost of a frozen dataclass at 64 workers)."""

    url: str
    compat: str = ""
    inflight: int = 0  # router's own in-flight requests on this worker
    est_wait_ms: float = 0.0  # prefill workers: estimated queue wait for a new prefill
    running: float = 0.0  # vllm:num_requests_running (scraped), or the router's count if higher
    waiting: float = 0.0  # vllm:num_requests_waiting (scraped)
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc (0..1)
    prefix_tokens: int = 0  # tokens of this prompt's prefix the router thinks it holds
    # for the SLO placement (placement.py)
    role: str = "decode"
    queued: float = 0.0  # requests waiting for room (not for their KV) at the last scrape
    ahead_tokens: int = 0  # prompt tokens of the router's prefills in flight there, not yet at their first token
    prefill_rate: float = 0.0  # prefill tokens/s sent there lately
    cost: EngineCost | None = None  # its engine priced (perf/costs.py); None: the default prior
    f_prefill: float = 1.0  # observed ÷ predicted TTFT of its recent prefills
    f_decode: float = 1.0  # observed ÷ predicted TPOT of its recent streams
    avg_prompt_tokens: float = 0.0  # other clients' queued prompts are priced at this size
    # prefill workers: seconds since the router last sent them a prefill leg (or the SLO placement a whole prompt
    # longer than their chunk: load.py ``Worker.remote_prefill_at``)
    remote_idle_s: float = math.inf
    stream_tpot_s: float = 0.0  # its recent streams' TPOT, geometric mean (observed; 0: not yet known)
    stream_spread: float = 0.0  # … the standard deviation of their log TPOT
    # the prefills sent there lately: the mean residual size of the one in progress at a random moment, tokens
    # (E[n²] ÷ 2E[n]: Pollaczek–Khinchine's residual; placement.py ``_backlog_then``)
    prefill_residual_tokens: float = 0.0
    prefill_size_tokens: float = 0.0  # … and their mean size, tokens


@dataclass(frozen=True)
class LoadSnapshot:
    prefill: tuple[WorkerLoad, ...] = ()
    decode: tuple[WorkerLoad, ...] = ()
    aggregated: tuple[WorkerLoad, ...] = ()  # optional aggregated pool: serves mode Aggregated when present
    tenant_avg_output_tokens: float | None = None  # observed average output of this request's tenant
    # Circuit breakers (breaker.py) that would not let a remote request through now: decode URLs and
    # (prefill URL, decode URL) pairs. Local prefill on such a decode worker is still fine.
    blocked_decode: frozenset[str] = frozenset()
    blocked_pairs: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Tuning:
    """Router knobs outside the API (CLI flags), with defaults."""

    decode_pressure_kv_usage: float = 0.5  # decode worker under pressure at this KV-cache usage …
    # one elastic fleet (Thresholds): a request the ladder keeps local may run whole on a prefill worker that has
    # had no remote prefill (nor a long whole prompt the SLO placement put there) for this long (its steps are free
    # of long chunks) and is less loaded than the decode worker. 0: off.
    elastic_idle_s: float = 5.0
    decode_pressure_running: int = 8  # … or this many running + waiting sequences
    prefix_affinity_slack: int = 4  # prefer the prefix-holding decode worker unless it has this many more in flight
    # A slow KV hand-off is a routing event (core.py "hedge"): a remote stream whose first token has not come this
    # many times the decode worker's recent remote first-token time after its decode leg started (and at least
    # hedge_min_s) gets a local prefill on another worker beside it; the first to answer serves. 0: off.
    hedge_factor: float = 8.0
    hedge_min_s: float = 0.25
    # SLO placement (placement.py): the output a stream is assumed to have when nothing says more, and by how many
    # expected misses a placement must beat the ladder's choice by to overrule it: one in a hundred, a noise floor.
    # Any clear saving overrules (the placement predicted to keep the most requests within the SLO wins); a
    # difference within the model's own error at light load keeps the ladder's choice (docs/router.md "How much an
    # overrule must save": the goodput benchmark at margins of 0.5/0.2, 0.01 and 0)
    default_output_tokens: int = 256
    slo_override: float = 0.01
    # … and by how many when the ladder's rule is in its grey zone (GREY_REASONS: a prompt between the local and
    # the remote thresholds, a long prompt with a short answer), where a static rule knows least
    slo_override_grey: float = 0.01
    # … but the ladder's choice stands, whatever another placement saves, while its own expected misses stay below
    # this: a choice predicted to keep this request and those it would slow within the SLO needs no overrule. At
    # light load every placement meets, and the differences left (a long prompt's KV transfer against its prefill
    # on an idle decode worker) are in the logistic's tail, not in the SLO: there the ladder's intent — long
    # prompts on the prefill pool, decode steps free of their chunks — holds (docs/router.md "How much an overrule
    # must save"). 0: the margin alone decides
    slo_keep: float = 0.1


DEFAULT_TUNING = Tuning()


@dataclass(frozen=True)
class Decision:
    decision: DecisionKind
    reason: str
    decode: str | None = None  # decode worker URL (both paths)
    prefill: str | None = None  # prefill worker URL (remote only)
    tenant: str = DEFAULT_TENANT
    bucket: str | None = None
    est_prefill_wait_ms: float | None = None
    prefix_tokens: int = 0
    status: int = 200  # HTTP status for reject
    # Decode worker choice for a local path if the remote decision must fall back (compat group may differ).
    local_decode: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
