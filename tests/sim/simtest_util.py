"""Helpers for the digital-twin tests: start real ``disagg sim`` processes on free loopback ports, read metrics."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from disagg.local.procs import HOST, Processes, disagg_argv, free_port, free_port_block, wait_http

__all__ = ["MODEL", "SimFactory", "SimProc", "kv_config", "metric", "prompt_of"]

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
    proc: subprocess.Popen[bytes]
    port: int
    side_port: int
    log_path: Path
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

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

    @contextlib.contextmanager
    def faults(self, **faults: Any) -> Iterator[None]:
        """Inject runtime faults (POST /sim/faults) for the block; switch them off again (0 / False) after it."""
        status, body = self.post("/sim/faults", faults)
        assert status == 200, body
        try:
            yield
        finally:
            self.post("/sim/faults", {k: False if isinstance(v, bool) else 0 for k, v in faults.items()})


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
    """Starts `disagg sim` processes through disagg.local.procs.Processes (each in its own process group, its log
    in a file, all stopped when the Processes context ends)."""

    def __init__(self, procs: Processes) -> None:
        self.procs = procs

    def start(self, *args: str, env: dict[str, str] | None = None, model: str = MODEL, time_scale: float = 0.2,
              expect_ready: bool = True) -> SimProc:
        dp = _dp_size(args)
        port = free_port()
        side = free_port_block(dp)
        while side <= port < side + dp:
            side = free_port_block(dp)
        argv = [*disagg_argv(), "sim", model, "--host", HOST, "--port", str(port), "--time-scale", str(time_scale),
                *args]
        p = self.procs.spawn(f"sim-{port}", argv, f"http://{HOST}:{port}",
                             env={"VLLM_NIXL_SIDE_CHANNEL_HOST": HOST, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side),
                                  **(env or {})})
        sp = SimProc(p.proc, port, side, p.log_path, argv)
        if expect_ready:
            try:
                wait_http(sp.url + "/health", 30, sp.proc)
            except (RuntimeError, TimeoutError) as e:
                raise AssertionError(f"disagg sim not healthy ({e}):\n{sp.log()}") from None
        return sp


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
