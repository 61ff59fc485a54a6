"""The workers a request would use (policy.py's ladder and slo_policy.py's placement read the same picks): the
least loaded decode worker (or the one holding the prompt's prefix, within a slack), the prefill worker with the
least estimated wait, the remote pair with closed circuit breakers. PURE; the hot path: every request, up to 64
workers, one pass each."""

from __future__ import annotations

from .policy_types import DEFAULT_TUNING, LoadSnapshot, Tuning, WorkerLoad


def decode_load(w: WorkerLoad) -> float:
    """A worker's load as the choosers compare it: the router's requests in flight there, or the scraped running
    and waiting ones when they are more."""
    return max(float(w.inflight), w.running + w.waiting)


def choose_decode(workers: tuple[WorkerLoad, ...], tuning: Tuning = DEFAULT_TUNING) -> WorkerLoad | None:
    """Least loaded decode worker; the one holding the longest prefix wins unless it is `slack` busier."""
    if not workers:
        return None
    # one pass (the hot path: every request, up to 64 workers): the least loaded by (load, KV usage, url), and the
    # longest prefix by (prefix tokens, least load, url) — the tuples' order, compared field by field without
    # building them (most workers lose on the first field)
    least = best_prefix = workers[0]
    l_load = decode_load(least)
    l_kv, l_url = least.kv_usage, least.url
    p_tokens, p_load, p_url = least.prefix_tokens, l_load, least.url
    for w in workers[1:]:
        load = w.running + w.waiting
        inflight = float(w.inflight)
        if inflight >= load:  # decode_load(w), inlined: the call per worker was a third of the ladder's cost
            load = inflight
        if load < l_load or (load == l_load and (w.kv_usage < l_kv or (w.kv_usage == l_kv and w.url < l_url))):
            least, l_load, l_kv, l_url = w, load, w.kv_usage, w.url
        tokens = w.prefix_tokens
        if tokens > p_tokens or (tokens == p_tokens and (load < p_load or (load == p_load and w.url > p_url))):
            best_prefix, p_tokens, p_load, p_url = w, tokens, load, w.url
    if p_tokens > 0 and p_load <= l_load + tuning.prefix_affinity_slack:
        return best_prefix
    return least


def choose_prefill(workers: tuple[WorkerLoad, ...], compat: str | None) -> WorkerLoad | None:
    """Least estimated queue wait among prefill workers with the given compat hash (None: any), less the compute
    of the prompt's prefix a worker holds (its own KV events: router/kvindex.py; 0 without them)."""
    best, best_wait = None, 0.0
    for w in workers:  # one pass (the hot path: every request that may go remote), by (wait, inflight, url)
        if compat is not None and w.compat != compat:
            continue
        wait = w.est_wait_ms - _saved_ms(w) if w.prefix_tokens > 0 else w.est_wait_ms
        if (best is None or wait < best_wait
                or (wait == best_wait and (w.inflight, w.url) < (best.inflight, best.url))):
            best, best_wait = w, wait
    return best


def _saved_ms(w: WorkerLoad) -> float:
    """The prefill compute a worker's cached prefix saves (its tokens' prefill alone on that engine)."""
    if w.prefix_tokens <= 0 or w.cost is None:
        return 0.0
    return w.cost.prefill(w.prefix_tokens).seconds * 1000.0 * w.f_prefill


def choose_pair(decodes: tuple[WorkerLoad, ...], snap: LoadSnapshot, tuning: Tuning = DEFAULT_TUNING,
                first: WorkerLoad | None = None) -> tuple[WorkerLoad, WorkerLoad] | None:
    """The preferred decode worker and its prefill worker, skipping decode workers and pairs whose circuit
    breaker is open; None when every candidate is blocked. ``first``: ``choose_decode(decodes)`` when the caller
    has it already (no breaker open on a decode worker)."""
    cands = decodes
    if snap.blocked_decode:
        cands, first = tuple(w for w in cands if w.url not in snap.blocked_decode), None
    while cands:
        d = first or choose_decode(cands, tuning)
        first = None
        assert d is not None
        prefills = snap.prefill
        if snap.blocked_pairs:
            prefills = tuple(w for w in prefills if (w.url, d.url) not in snap.blocked_pairs)
        p = choose_prefill(prefills, d.compat)
        if p is not None:
            return d, p
        cands = tuple(w for w in cands if w is not d)
    return None


def under_pressure(w: WorkerLoad, tuning: Tuning) -> bool:
    return w.kv_usage >= tuning.decode_pressure_kv_usage or decode_load(w) >= tuning.decode_pressure_running


class Picks:
    """The workers a request would use — the least loaded decode worker, the remote pair — each chosen once per
    request and shared by the ladder and the SLO placement (the hot path: every request, up to 64 workers)."""

    __slots__ = ("_one_compat", "_pair", "_paired", "local_d", "remote_decodes", "snap", "tuning")

    def __init__(self, snap: LoadSnapshot, tuning: Tuning) -> None:
        self.snap, self.tuning = snap, tuning
        self.local_d = choose_decode(snap.decode, tuning) or choose_decode(snap.aggregated, tuning)
        self.remote_decodes: tuple[WorkerLoad, ...] = ()
        self._pair: tuple[WorkerLoad, WorkerLoad] | None = None
        self._paired = self._one_compat = False

    def pair(self) -> tuple[WorkerLoad, WorkerLoad] | None:
        """The preferred decode worker with a compatible prefill worker (closed breakers), or None."""
        if not self._paired:
            compat_groups = {w.compat for w in self.snap.prefill}
            self._one_compat = len(compat_groups) == 1
            self.remote_decodes = tuple([w for w in self.snap.decode if w.compat in compat_groups])
            # every decode worker compatible (one compat hash: the usual case): the first candidate is local_d
            first = self.local_d if len(self.remote_decodes) == len(self.snap.decode) else None
            self._pair = (choose_pair(self.remote_decodes, self.snap, self.tuning, first) if self.remote_decodes
                          else None)
            self._paired = True
        return self._pair

    def any_prefill(self) -> WorkerLoad | None:
        """The least busy prefill worker of any compat hash (``choose_prefill(snap.prefill, None)``): the pair's
        when every prefill worker shares one hash and no pair is blocked, as the pair chose among them all."""
        pair = self.pair()
        if pair is not None and self._one_compat and not self.snap.blocked_pairs:
            return pair[1]
        return choose_prefill(self.snap.prefill, None)
