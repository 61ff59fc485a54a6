"""Real processes (issue 30): two `disagg sim` workers publishing their KV cache events (``--kv-events-config``,
vLLM's format) and a `disagg router` subscribed to both. Each conversation's first turn is sent straight to one
worker, behind the router's back: only the engines' own events can tell the router where it is cached. Every
follow-up turn through the router must land on that worker and reuse the conversation there."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from disagg.local.procs import Processes, free_port
from disagg.poll import wait_for

from .conftest import ROUTER_ARGS, SIM_TIME_SCALE

BLOCK = 16  # the sims' --block-size (vLLM's default)


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _value(ms: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in ms.items() if n == name and all((k, x) in ls for k, x in labels.items()))


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


def _until_sync(cond: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    wait_for(cond, timeout, what, interval=0.05)


def _at_least(f: Callable[[], float], n: float) -> Callable[[], bool]:
    return lambda: f() >= n


def _hits(url: str) -> float:
    return _value(_metrics(url), "vllm:prefix_cache_hits_total")


def test_a_follow_up_turn_goes_to_the_worker_that_holds_the_conversation(tmp_path: Any) -> None:
    with Processes(tmp_path) as procs:
        workers = []
        endpoints = []
        for _ in range(2):
            pub, replay = free_port(), free_port()
            cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{pub}",
                   "replay_endpoint": f"tcp://127.0.0.1:{replay}", "topic": "kv-events"}
            w = procs.sim("aggregated", time_scale=SIM_TIME_SCALE, gpu=None, model_preset=None, wait=True,
                          extra=["--kv-events-config", json.dumps(cfg), "--enable-prompt-tokens-details"])
            workers.append(w)
            endpoints += ["--kv-events-endpoint", f"{w.url}=tcp://127.0.0.1:{pub},tcp://127.0.0.1:{replay}"]
        router = procs.router(decode=[w.url for w in workers], extra=[*ROUTER_ARGS, *endpoints], wait=True)

        def indexed(url: str) -> Callable[[], float]:
            return lambda: _value(_metrics(router.url), "disagg_kv_index_blocks", worker=url)

        for turn in range(4):
            holder, other = workers[turn % 2], workers[1 - turn % 2]
            first = [1000 + 37 * turn + i for i in range(40 * BLOCK)]
            before = indexed(holder.url)()
            _post(holder.url, {"prompt": first, "max_tokens": 2})  # not through the router
            _until_sync(_at_least(indexed(holder.url), before + 40), "the router to index turn 1")
            hits_holder, hits_other = _hits(holder.url), _hits(other.url)
            follow = [*first, *range(5000, 5000 + 3 * BLOCK)]
            answer = _post(router.url, {"prompt": follow, "max_tokens": 2})
            assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 40 * BLOCK
            assert _hits(holder.url) - hits_holder >= 40 * BLOCK, f"turn {turn}: not served from the holder's cache"
            assert _hits(other.url) == hits_other
        # the log line: what the router expected cached on the worker it chose, and what the engine reused
        def request_lines() -> list[dict[str, Any]]:
            out = []
            for x in router.log_path.read_text(errors="replace").splitlines():
                if '"request"' in x:
                    try:
                        obj = json.loads(x)
                    except json.JSONDecodeError:
                        continue
                    if obj.get("event") == "request":
                        out.append(obj)
            return out

        _until_sync(lambda: len(request_lines()) >= 4, "the router's request log lines")
        lines = request_lines()
        assert len(lines) == 4
        for line in lines:
            assert (line["expected_cached_tokens"], line["cache_source"], line["reused_tokens"]) == (
                40 * BLOCK, "events", 40 * BLOCK)
        # vLLM's POST /reset_prefix_cache → AllBlocksCleared: the router forgets that worker's blocks
        req = urllib.request.Request(workers[0].url + "/reset_prefix_cache", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
        _until_sync(lambda: indexed(workers[0].url)() == 0, "the cleared worker's entries to go")
        assert indexed(workers[1].url)() > 0
        rm = _metrics(router.url)
        assert _value(rm, "disagg_kv_events_total", type="cleared") == 1
        assert _value(rm, "disagg_prefix_expected_cached_tokens_total", source="events") >= 4 * 40 * BLOCK
        assert _value(rm, "disagg_kv_events_total", type="stored") > 0
        assert _value(rm, "disagg_kv_event_lag_seconds_count") > 0
