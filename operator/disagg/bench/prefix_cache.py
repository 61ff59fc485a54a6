"""``disagg bench prefix-cache`` (issue 30): prefix-cache-aware placement from the engines' own KV events, against
the router's estimate and against no prefix awareness, in the twin (virtual time), at equal GPUs.

The workload is multi-turn (:func:`workload`, seeded): chat conversations that extend their earlier turns (each
turn re-sends the history: the previous prompt, the assistant's answer, a new user message) over a few shared
system prompts, and agent sessions that re-send a long tool context with a growing scratchpad at short intervals.
Prompts are token ids (completions bodies), as a tokenizing gateway or an agent framework sends them: the router
then knows the ids (router/server.py sets ``ctx.token_ids``), which the exact index needs.

Three runs of the same arrivals on the same cluster (decode workers serving whole requests):

* ``events`` — each simulated engine publishes vLLM-format KV events from its block pool (sim/kvevents.py) into the
  router core's exact index in process (router/kvindex.py ``sink_for``, what twin/cluster.py wires), and the
  request carries its token ids;
* ``estimate`` — the router's own record of what it sent where (router/prefix.py), today's default;
* ``none`` — no prefix awareness in routing (every worker's match is 0; the engines still cache).

Per run: the prefix-cache hit rate against an oracle that knows every engine's cache at the decision (per request,
the longest prefix any worker holds then; the hit is what the serving engine actually reused: its
``num_cached``), and TTFT p50/p95. Beside them, the index's own costs (:func:`index_costs`): CPU per 1,000 events
applied at 64 workers (msgpack decode included), the per-request lookup at 64 workers, and memory per million
indexed blocks (tracemalloc).

Results: docs/results/prefix-cache.json; :func:`render_tables` (``placement``, ``costs``).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

COMMAND = "disagg bench prefix-cache"
RESULTS = Path("docs") / "results" / "prefix-cache.json"
# (placement from, router processes): the estimate is per process (each replica of the router, each --workers
# process keeps its own record of what it sent where); the events reach every process alike
VARIANTS = (("events", 1), ("events", 2), ("estimate", 1), ("estimate", 2), ("none", 1))
KV_BLOCKS = 3000  # per worker (48k tokens): a 2-minute workload fills it as hours of traffic fill a real engine
TARGET_HIT = 0.95  # issue 30: ≥ 95 % of the oracle's hits
VOCAB_LO, VOCAB_HI = 1000, 120_000  # token ids inside Llama-3's vocabulary (128 256)


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(n)]


def workload(seed: int = 0, conversations: int = 60, agents: int = 12, window_s: float = 120.0) -> list[Any]:
    """Seeded multi-turn arrivals (completions bodies of token ids), sorted by time."""
    from ..twin.arrivals import Arrival

    rng = random.Random(seed)
    systems = [_ids(rng, rng.randint(600, 1500)) for _ in range(4)]  # shared system prompts
    out: list[Arrival] = []

    def add(at: float, prompt: list[int], output: int, cls: str, rid: str) -> None:
        out.append(Arrival(at=at, input_tokens=len(prompt), output_tokens=output, cls=cls, request_id=rid,
                           endpoint="/v1/completions", stream=True,
                           body={"prompt": list(prompt), "max_tokens": output}))

    for c in range(conversations):  # chat: 3-8 turns, 10-40 s apart (reading, typing)
        at = rng.uniform(0, window_s * 0.6)
        history = list(rng.choice(systems)) + _ids(rng, rng.randint(50, 300))
        for t in range(rng.randint(3, 8)):
            out_tokens = rng.randint(60, 300)
            add(at, history, out_tokens, "chat", f"chat-{c}-{t}")
            # the next turn re-sends everything: this prompt, the answer, a new message
            history = history + _ids(rng, out_tokens) + _ids(rng, rng.randint(20, 200))
            at += rng.uniform(10.0, 40.0)
    for g in range(agents):  # agents: a 3-8k-token tool context re-sent every 2-6 s with a growing scratchpad
        at = rng.uniform(0, window_s * 0.6)
        context = list(rng.choice(systems)) + _ids(rng, rng.randint(3000, 8000))
        for t in range(rng.randint(6, 14)):
            out_tokens = rng.randint(20, 120)
            add(at, context, out_tokens, "agent", f"agent-{g}-{t}")
            context = context + _ids(rng, out_tokens) + _ids(rng, rng.randint(100, 600))  # tool result
            at += rng.uniform(2.0, 6.0)
    out.sort(key=lambda a: a.at)
    return out


def _controller(variant: str, oracle: dict[str, int], ids_of: dict[str, tuple[int, ...]], replicas: int) -> Any:
    """The twin controller that wires a variant in (run at the start, beside the traffic). ``replicas``: router
    processes (replicas of the router Deployment, or ``--workers``), each with its own estimate of what it sent
    where; the requests spread over them by id. (KV events reach every replica alike: one index stands for all.)"""
    from ..router.kvindex import sink_for
    from ..router.prefix import PrefixIndex
    from ..sim.kv import block_hashes

    async def ctl(cluster: Any) -> None:
        core = cluster.core
        for url, w in cluster.workers.items():
            if variant == "events":  # the twin's in-process path (what twin/cluster.py wires, issue 30)
                w.engine.enable_kv_events(sink_for(core.kv, url), clock=cluster.loop.time)
            else:  # no events: the estimate (or nothing) is all the router has
                w.engine.kv_sink, w.engine.pool.kv_events = None, None
                core.kv.forget(url)
        if variant == "none":
            core.prefix.match_tokens = lambda _url, _hashes: 0
        admit = core.admit
        estimates = [PrefixIndex() for _ in range(replicas)]

        async def admit_with_ids(ctx: Any, cfg: Any, tenant: Any, max_tokens: Any, hashes: Any) -> Any:
            ids = ids_of[ctx.request_id]
            if variant == "estimate":  # this request's router replica (its relay reads core.prefix before yielding)
                core.prefix = estimates[zlib.crc32(ctx.request_id.encode()) % replicas]
            if variant == "events":
                ctx.token_ids = ids  # router/server.py does this for a prompt of token ids
            best = 0
            for w in cluster.workers.values():  # the oracle: every engine's cache, now
                w.engine.sync()
                pool = w.engine.pool
                best = max(best, len(pool.lookup(block_hashes(ids, pool.block_size), len(ids) - 1))
                           * pool.block_size)
            oracle[ctx.request_id] = best
            return await admit(ctx, cfg, tenant, max_tokens, hashes)

        core.admit = admit_with_ids
        await asyncio.Event().wait()

    return ctl


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run_variant(variant: str, arrivals: list[Any], decode_workers: int = 4, seed: int = 0, replicas: int = 1,
                kv_blocks: int | None = None, prefill_workers: int = 0) -> dict[str, Any]:
    from ..twin.run import simulate
    from ..twin.spec import ClusterSpec, PoolSpec

    ids_of = {a.request_id: tuple(a.body["prompt"]) for a in arrivals}
    oracle: dict[str, int] = {}
    extra = ("--num-gpu-blocks-override", str(kv_blocks), "--max-model-len", "16384") if kv_blocks else ()
    spec = ClusterSpec(decode=PoolSpec(decode_workers, extra_args=extra),
                       prefill=PoolSpec(prefill_workers, extra_args=extra) if prefill_workers else None)
    t0 = time.perf_counter()
    res = simulate(spec, arrivals, seed=seed, controller=_controller(variant, oracle, ids_of, replicas))
    wall = time.perf_counter() - t0
    ok = [r for r in res.records if r.status == 200]
    hits = sum(r.cached_tokens for r in ok)
    best = sum(oracle.get(r.request_id, 0) for r in ok)
    prompt = sum(r.input_tokens for r in ok)
    row: dict[str, Any] = {"variant": variant, "router_processes": replicas, "requests": len(res.records),
                           "ok": len(ok),
                           "hit_tokens": hits, "oracle_tokens": best, "prompt_tokens": prompt,
                           "hit_rate": round(hits / prompt, 4) if prompt else 0.0,
                           "oracle_hit_rate": round(best / prompt, 4) if prompt else 0.0,
                           "vs_oracle": round(hits / best, 4) if best else 1.0, "wall_s": round(wall, 1),
                           "remote": sum(1 for r in ok if r.decision == "remote"),
                           "prefix_cache_hit": sum(1 for r in ok if r.reason == "prefix_cache_hit")}
    for cls in ("all", "chat", "agent"):
        tt = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None and cls in ("all", r.cls)]
        row[cls] = {"ttft_p50_ms": round(_pct(tt, 0.5), 1), "ttft_p95_ms": round(_pct(tt, 0.95), 1),
                    "ttft_mean_ms": round(statistics.fmean(tt), 1) if tt else 0.0}
    return row


# ------------------------------------------------------------------------------------ the index's own costs
def _batches(workers: int, blocks_per_worker: int, seed: int) -> tuple[list[tuple[str, bytes]], list[list[int]]]:
    """Event payloads as a fleet of simulated engines publishes them: each worker's pool (2,000 blocks of 16)
    serving chat-like prompts until it has stored ``blocks_per_worker`` blocks (evictions included)."""
    from ..sim import kvevents as sim_events
    from ..sim.kv import BlockPool, block_hashes

    rng = random.Random(seed)
    out: list[tuple[str, bytes]] = []
    shared = [_ids(rng, 1024) for _ in range(4)]
    for w in range(workers):
        pool = BlockPool(2000, 16)
        pool.kv_events = []
        stored = 0
        held: list[list[int]] = []
        while stored < blocks_per_worker:
            if held and (len(held) > 8 or pool.num_free < 400):
                pool.release(held.pop(0))
            ids = rng.choice(shared) + _ids(rng, rng.randint(200, 3000))
            hs = block_hashes(ids, 16)
            hit = pool.lookup(hs, len(ids) - 1)
            pool.touch(hit)
            new = pool.allocate(pool.blocks_for(len(ids)) - len(hit))
            if new is None:
                pool.release(hit)
                continue
            pool.commit(hit + new, hs, len(ids) // 16)
            held.append(hit + new)
            events = pool.take_events()
            stored += sum(len(e["block_hashes"]) for e in events if e["type"] == "BlockStored")
            out.append((f"http://w{w}", sim_events.pack(sim_events.encode_batch(0.0, events))))
    return out, shared


def index_costs(workers: int = 64, blocks_per_worker: int = 3000, memory_blocks: int = 1_000_000,
                seed: int = 0) -> dict[str, Any]:
    from ..router import features
    from ..router.kvevents import BlockRemoved, BlockStored, decode_payload
    from ..router.kvindex import KVIndex

    batches, shared = _batches(workers, blocks_per_worker, seed)
    rng = random.Random(seed)
    rng.shuffle(batches)  # workers interleave, as their streams arrive
    idx = KVIndex()
    events = 0
    blocks = 0
    c0 = time.thread_time_ns()
    for url, payload in batches:
        b = decode_payload(payload)
        idx.apply(url, b)
        events += len(b.events)
        blocks += sum(len(e.block_hashes) for e in b.events if isinstance(e, (BlockStored, BlockRemoved)))
    cpu_ns = time.thread_time_ns() - c0
    # lookups at 64 workers: a shared system prompt (1,024 tokens, held by every worker that served it lately) and
    # 3,000 tokens of its own
    prompts = [[*rng.choice(shared), *_ids(rng, 3000)] for _ in range(50)]
    keyed = [features.token_block_keys(p, 16) for p in prompts]  # the router has them: its estimate hashes
    wall: list[float] = []
    matched = 0
    for p, k in zip(prompts * 4, keyed * 4, strict=True):
        given = _given(k)
        t = time.perf_counter_ns()
        m = idx.match(p, keys_of=given)
        wall.append((time.perf_counter_ns() - t) / 1000)
        matched = max(matched, len(m))
    held = max(idx.workers(), key=idx.blocks)
    # memory: one million distinct blocks over 64 workers, stored as vLLM announces them (runs of 32 blocks)
    tracemalloc.start()
    mi = KVIndex()
    before = tracemalloc.take_snapshot()
    per = memory_blocks // workers
    for w in range(workers):
        url = f"http://m{w}"
        for start in range(0, per, 32):
            n = min(32, per - start)
            ids = tuple(range(w * 10_000_000 + start * 16, w * 10_000_000 + (start + n) * 16))
            mi.apply(url, _batch_of(BlockStored(tuple(range(w * per + start, w * per + start + n)),
                                               (w * per + start - 1) if start else None, ids, 16)))
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    mem = sum(s.size_diff for s in after.compare_to(before, "filename"))
    del mi
    return {"workers": workers, "events": events, "blocks_in_events": blocks,
            "cpu_us_per_1000_events": round(cpu_ns / 1000 / events * 1000, 1),
            "cpu_us_per_1000_blocks": round(cpu_ns / 1000 / blocks * 1000, 1),
            "indexed_blocks": idx.total_blocks(), "largest_worker_blocks": idx.blocks(held),
            "lookup_us_p50": round(_pct(wall, 0.5), 1), "lookup_us_p95": round(_pct(wall, 0.95), 1),
            "lookup_prompt_tokens": 4024, "lookup_workers_matched": matched, "memory_blocks": memory_blocks,
            "memory_mib_per_million_blocks": round(mem / 2**20 * 1_000_000 / memory_blocks, 1),
            "bytes_per_block": round(mem / memory_blocks, 1),
            "request_keys_us": _keys_cost(features)}


def _given(keys: list[int]) -> Any:
    return lambda _bs: keys


def _batch_of(e: Any) -> Any:
    from ..router.kvevents import Batch

    return Batch(0.0, (e,))


def _keys_cost(features: Any) -> float:
    """µs to key a 4,096-token prompt (features.token_block_keys: once per request and block size)."""
    ids = list(range(4096))
    t = time.perf_counter_ns()
    for _ in range(20):
        features.token_block_keys(ids, 16)
    return round((time.perf_counter_ns() - t) / 20 / 1000, 1)


def run(seed: int = 0, conversations: int = 120, agents: int = 20, decode_workers: int = 4,
        kv_blocks: int = KV_BLOCKS, out: Path | None = RESULTS) -> dict[str, Any]:
    from ..results import machine_facts, results_doc, write_results

    t0 = time.perf_counter()
    arrivals = workload(seed, conversations, agents)
    rows = [run_variant(v, arrivals, decode_workers, seed, replicas=n, kv_blocks=kv_blocks) for v, n in VARIANTS]
    # the same arrivals on a disaggregated cluster (2 prefill + decode − 1 workers: as many GPUs): the remote path
    # too; the hit rate is left out there (a remote request's reuse is the prefill engine's, the twin's records
    # carry the decode engine's)
    disagg = [run_variant(v, arrivals, decode_workers - 1, seed, replicas=n, kv_blocks=kv_blocks, prefill_workers=2)
              for v, n in VARIANTS if (v, n) != ("events", 2)]
    costs = index_costs(seed=seed)
    by = {(r["variant"], r["router_processes"]): r for r in rows}
    events = min(by[("events", 1)]["vs_oracle"], by[("events", 2)]["vs_oracle"])
    results = {"settings": {"seed": seed, "conversations": conversations, "agents": agents,
                            "decode_workers": decode_workers, "gpu": "H100-SXM", "model": "Llama-3.1-8B",
                            "kv_blocks_per_worker": kv_blocks, "block_size": 16, "requests": len(arrivals)},
               "rows": rows, "disaggregated": disagg, "costs": costs,
               "target": {"name": f"hit rate ≥ {TARGET_HIT:.0%} of the oracle's (events)",
                          "vs_oracle": events, "met": events >= TARGET_HIT}}
    cmd = (f"{COMMAND} --seed {seed} --conversations {conversations} --agents {agents} --decode {decode_workers} "
           f"--kv-blocks {kv_blocks}")
    doc = results_doc("prefix-cache", cmd, results, machine_facts(wall_s=round(time.perf_counter() - t0, 1)))
    if out is not None:
        write_results(out, doc)
    return doc


def render_tables(doc: dict[str, Any]) -> dict[str, str]:
    res = doc["results"]
    st = res["settings"]
    lines = ["| placement from | router processes | hit rate | oracle's | of the oracle's | TTFT p50 ms | "
             "TTFT p95 ms | chat p95 ms | agents p95 ms |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    names = {"events": "KV events (exact)", "estimate": "estimate (what it sent where)",
             "none": "no prefix awareness"}
    for r in res["rows"]:
        lines.append(f"| {names.get(r['variant'], r['variant'])} | {r['router_processes']} | {r['hit_rate']:.1%} | "
                     f"{r['oracle_hit_rate']:.1%} | {r['vs_oracle']:.1%} | {r['all']['ttft_p50_ms']:g} | "
                     f"{r['all']['ttft_p95_ms']:g} | "
                     f"{r['chat']['ttft_p95_ms']:g} | {r['agent']['ttft_p95_ms']:g} |")
    t = res["target"]
    placement = (f"{st['requests']} requests ({st['conversations']} chat conversations, {st['agents']} agent "
                 f"sessions; seed {st['seed']}) on {st['decode_workers']} × {st['gpu']} decode workers "
                 f"({st['model']}, {st['kv_blocks_per_worker']} KV blocks of {st['block_size']} tokens each), virtual "
                 "time. Hit rate: prompt tokens the serving engine reused ÷ prompt "
                 "tokens; the oracle's: the longest prefix any engine held at each decision.\n\n"
                 + "\n".join(lines)
                 + f"\n\nTarget — {t['name']}: {t['vs_oracle']:.1%}, {'met' if t['met'] else '**missed**'}.")
    c = res["costs"]
    costs = ("| measure | value |\n|---|---:|\n"
             f"| CPU per 1,000 events applied ({c['workers']} workers, msgpack decode included) | "
             f"{c['cpu_us_per_1000_events']:g} µs |\n"
             f"| CPU per 1,000 blocks in those events | {c['cpu_us_per_1000_blocks']:g} µs |\n"
             f"| lookup of a {c['lookup_prompt_tokens']}-token prompt at {c['workers']} workers "
             f"({c['lookup_workers_matched']} holding its first 1,024 tokens; keys given), p50 / p95 | "
             f"{c['lookup_us_p50']:g} / {c['lookup_us_p95']:g} µs |\n"
             f"| keying a 4,096-token prompt (once per request and block size; the router reuses its estimate "
             f"hashes of a token-id prompt at 16 tokens) | {c['request_keys_us']:g} µs |\n"
             f"| index memory per million blocks | {c['memory_mib_per_million_blocks']:g} MiB "
             f"({c['bytes_per_block']:g} B/block) |")
    dl = ["| placement from | router processes | remote | local, prefix hit | TTFT p50 ms | TTFT p95 ms | "
          "chat p95 ms | agents p95 ms |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res.get("disaggregated", []):
        dl.append(f"| {names.get(r['variant'], r['variant'])} | {r['router_processes']} | {r['remote']} | "
                  f"{r['prefix_cache_hit']} | {r['all']['ttft_p50_ms']:g} | {r['all']['ttft_p95_ms']:g} | "
                  f"{r['chat']['ttft_p95_ms']:g} | {r['agent']['ttft_p95_ms']:g} |")
    disagg = (f"The same {st['requests']} requests on 2 prefill + {st['decode_workers'] - 1} decode workers (as many "
              "GPUs), the SLO placement choosing local or remote per request: how many went remote, how many "
              "stayed local on a prefix hit, and the TTFT.\n\n" + "\n".join(dl))
    return {"placement": placement, "disaggregated": disagg, "costs": costs}
