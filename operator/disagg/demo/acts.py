"""The demo's three acts, on a model already serving with both pools ready (:class:`ModelHarness`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..load.workload import MIXES, Mix, RequestClass
from ..local.harness import POOLS, ModelHarness, PhaseResult


def say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


# Applied on top of docs/examples/local-demo.yaml by the demo and the e2e test. The demo runs a compressed timeline
# (modePolicy.windowSeconds 15, healthyHoldSeconds 20) and the return to Disaggregated needs successesToReturn
# successful remote-path probes within one window: the API's defaults (6 probes a minute, 5 % of eligible requests)
# cannot give 3 in 15 s, so without this the model would never return. (Belongs in local-demo.yaml itself.)
LONG_PROMPTS = Mix("long-prompts", "long RAG prompts, short answers", (
    RequestClass("rag", 1.0, (6000, 10000), (64, 128), tenant="rag", shared_prefix_tokens=0),))
LONG_OUTPUTS = Mix("long-outputs", "short prompts, long streams", (
    RequestClass("stream", 1.0, (128, 512), (600, 1000), tenant="stream"),))


@dataclass
class LoadStep:
    """What a load step did to the pools: desired replicas before/after, and when each pool first grew."""

    before: dict[str, int]
    after: dict[str, int]
    first_growth_s: dict[str, float | None]
    last_scale: dict[str, Any]

    def line(self) -> str:
        return ", ".join(f"{p} {self.before[p]} → {self.after[p]} (first growth "
                         f"{'—' if self.first_growth_s[p] is None else f'{self.first_growth_s[p]:.0f} s'})"
                         for p in POOLS)


@dataclass
class Outcome:
    """What the acts did (for the report and the e2e assertions)."""

    mixed: PhaseResult
    long_outputs: LoadStep
    long_prompts: LoadStep
    faulty: PhaseResult
    healed: PhaseResult

    def load_steps(self) -> dict[str, LoadStep]:
        return {"long_outputs": self.long_outputs, "long_prompts": self.long_prompts}


def load_step(model: ModelHarness, name: str, mix: Mix, *, rate: float, seconds: float, seed: int) -> LoadStep:
    """Once the signals of what came before have cleared (:meth:`ModelHarness.wait_quiet`), ``mix`` at ``rate`` for
    ``seconds``, then on until the autoscaler has grown a pool (the step's answer), for
    at most 3 × ``seconds`` in all. The autoscaler decides on windows of Prometheus
    samples, so on a loaded machine its decision can come later than a fixed drive would wait; the step runs until
    it comes rather than sampling once and finding none."""
    model.wait_quiet()  # the previous step's scaling is over: this step's growth answers this step
    t = time.monotonic() - model.t0
    before = {p: model.desired(p) for p in POOLS}
    start = time.monotonic()

    def decided() -> bool:  # the timeline is sampled once a second by the harness (no apiserver call here)
        return time.monotonic() - start >= seconds and any(model.timeline.first_growth(p, t) is not None
                                                          for p in POOLS)

    model.drive(name, mix, rate=rate, seconds=3 * seconds, seed=seed, stop=decided)
    model.sample_once()
    return LoadStep(before, {p: model.desired(p) for p in POOLS},
                    {p: model.timeline.first_growth(p, t) for p in POOLS}, model.last_scale())


def run_loop(model: ModelHarness, *, quick: bool = False) -> Outcome:
    """The three acts. Returns what happened (for the report and the e2e assertions)."""
    s = 0.5 if quick else 1.0

    # the first act starts when both pools serve, whatever the start-up took (pod readiness, not a timer)
    model.wait_serving()
    model.timeline.mark(model.t0, "serving")
    say("act 1: mixed traffic (long RAG prompts, short chats, long streams; tenants rag/chat/stream)")
    mixed = model.drive("mixed traffic", MIXES["mixed"], rate=1.5, seconds=30 * s, seed=1)

    say("act 2: a load step of long outputs → the decode pool grows first")
    long_outputs = load_step(model, "long-output load step", LONG_OUTPUTS, rate=4.0, seconds=35 * s, seed=5)
    say("        then a load step of long prompts → the prefill pool grows first")
    long_prompts = load_step(model, "long-prompt load step", LONG_PROMPTS, rate=2.5, seconds=35 * s, seed=4)

    say("act 3: KV transfers stall on the decode workers (12 s > transferTimeoutMs 8 s)")
    model.set_decode_faults(kv_transfer_delay_ms=12000)
    faulty = model.drive("KV transfers failing", MIXES["long-rag"], rate=1.0, seconds=25 * s, seed=2)
    model.wait_for_mode("Aggregated", 60, "flipped to Aggregated")
    say("        the operator flipped the model to Aggregated; healing the KV path")
    model.set_decode_faults(kv_transfer_delay_ms=0)
    say("        traffic goes on: the router probes the remote path, and the operator returns on that evidence")
    healed = model.drive_until_mode("aggregated, healing", MIXES["long-rag"], rate=1.0, mode="Disaggregated",
                                    timeout=120, label="back to Disaggregated", seed=3)
    say("        back to Disaggregated after the healthy hold and successful probes")
    return Outcome(mixed, long_outputs, long_prompts, faulty, healed)
