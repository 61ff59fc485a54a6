"""Helpers for the digital-twin tests: start real ``disagg sim`` processes on free loopback ports, read metrics."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from disagg.local.procs import free_port, free_port_block, wait_http
from disagg.poll import wait_for

__all__ = ["MODEL", "SimFactory", "SimProc", "free_port", "kv_config", "metric", "prompt_of", "wait_for"]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _dp_size(args: tuple[str, ...]) -> int:
    for i, a in enumerate(args):
        if a in ("-dp", "--data-parallel-size") and i + 1 < len(args):
            return int(args[i + 1])
        if a.startswith("--data-parallel-size="):
            return int(a.split("=", 1)[1])
    return 1


@dataclass
class SimProc:
    proc: subprocess.Popen
    port: int
    side_port: int
    log_path: Path
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def post(self, path: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def post_raw(self, path: str, body: dict, headers: dict | None = None) -> tuple[int, str, bytes]:
        """(status, content type, body bytes exactly as sent) — for byte-level wire checks."""
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.headers.get("Content-Type", ""), r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type", ""), e.read()

    def state(self) -> dict:
        return json.loads(self.get("/sim/state")[1])

    def metrics(self) -> dict[str, float]:
        return parse_metrics(self.get("/metrics")[1].decode())

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def parse_metrics(text: str) -> dict[str, float]:
    """'name{labels}' → value; also 'name' → sum over label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        out[name + labels] = value
        out[name] = out.get(name, 0.0) + value
    return out


def metric(ms: dict[str, float], name: str, **labels: str) -> float:
    """Sum of the series of ``name`` whose labels include ``labels``."""
    total = 0.0
    for key, v in ms.items():
        if not key.startswith(name + "{"):
            continue
        if all(f'{k}="{val}"' in key for k, val in labels.items()):
            total += v
    return total


class SimFactory:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[SimProc] = []

    def start(self, *args: str, env: dict[str, str] | None = None, model: str = MODEL, time_scale: float = 0.2,
              expect_ready: bool = True) -> SimProc:
        dp = _dp_size(args)
        port = free_port()
        side = free_port_block(dp)
        while side <= port < side + dp:
            side = free_port_block(dp)
        argv = [sys.executable, "-m", "disagg.sim", model, "--host", "127.0.0.1", "--port", str(port),
                "--time-scale", str(time_scale), *args]
        full_env = {**os.environ, "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                    "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side), **(env or {})}
        log_path = self.tmp / f"sim-{port}.log"
        with open(log_path, "wb") as f:
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=full_env)
        sp = SimProc(proc, port, side, log_path, argv)
        self.procs.append(sp)
        if expect_ready:
            self.wait_ready(sp)
        return sp

    def wait_ready(self, sp: SimProc, timeout: float = 30.0) -> None:
        try:
            wait_http(sp.url + "/health", timeout, sp.proc)
        except (RuntimeError, TimeoutError) as e:
            raise AssertionError(f"disagg sim not healthy ({e}):\n{sp.log()}") from None

    def stop_all(self) -> None:
        for sp in self.procs:
            if sp.proc.poll() is None:
                sp.proc.terminate()
        for sp in self.procs:
            try:
                sp.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                sp.proc.kill()
                sp.proc.wait()


def kv_config(role: str, policy: str = "recompute", **extra) -> str:
    cfg: dict[str, object] = {"kv_connector": "NixlConnector", "kv_role": role, "kv_load_failure_policy": policy}
    if extra:
        cfg["kv_connector_extra_config"] = extra
    return json.dumps(cfg)


def prompt_of(tokens: int, tag: str = "") -> str:
    """A prompt of about ``tokens`` tokens for the sim's tokenizer (word + digit = 2 tokens). A distinct
    ``tag`` makes the first block distinct, so no prefix-cache hit from other tests' prompts."""
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
    head = f"{tag} " if tag else ""
    return head + " ".join(words[i % len(words)] + str(i % 7) for i in range(tokens // 2))
