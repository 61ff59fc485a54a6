"""Structure of the Dockerfiles (no Docker engine here): pinned bases, non-root, the CLI as entrypoint,
a .dockerignore per Dockerfile, and what they copy exists."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from tests.paths import REPO

from disagg.api.models import DEFAULT_VLLM_IMAGE
from disagg.builders.security import NON_ROOT_UID
from disagg.builders.settings import DEFAULT_ROUTER_IMAGE
from disagg.builders.workers import HOME_DIR

IMAGES = REPO / "images"
DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def parse(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages) of a Dockerfile; continuation lines joined, comments dropped."""
    lines: list[str] = []
    buf = ""
    for raw in path.read_text().splitlines():
        if raw.lstrip().startswith("#") and not buf:
            continue
        if raw.rstrip().endswith("\\"):
            buf += raw.rstrip()[:-1] + " "
            continue
        buf += raw
        if buf.strip():
            lines.append(buf.strip())
        buf = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            parts = rest.split()
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], parts[0])
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        elif op == "ARG" and not stages:
            key, _, default = rest.partition("=")
            args[key.strip()] = default.strip()
        elif stages:
            stages[-1].instructions.append((op, rest))
    return args, stages


def final(path: Path) -> Stage:
    return parse(path)[1][-1]


def last(stage: Stage, op: str) -> str | None:
    found = [rest for o, rest in stage.instructions if o == op]
    return found[-1] if found else None


def test_the_images_exist() -> None:
    assert {p.parent.name for p in DOCKERFILES} >= {"operator", "vllm", "sim"}
    assert (IMAGES / "router" / "README.md").exists()  # the router ships in the operator image


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_bases_are_pinned(dockerfile: Path) -> None:
    _, stages = parse(dockerfile)
    names = {s.name for s in stages if s.name}
    for s in stages:
        if s.base in names:
            continue
        ref = s.base.split("@", 1)[0]
        repo_part, _, tag = ref.rpartition(":")
        assert repo_part and "/" not in tag, f"{s.base}: no tag"
        assert tag != "latest" and re.search(r"\d", tag), f"{s.base}: pin a version tag, not {tag!r}"
        if "@" in s.base:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", s.base.split("@", 1)[1])
    assert ":latest" not in dockerfile.read_text()


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_runs_as_numeric_non_root_user(dockerfile: Path) -> None:
    user = last(final(dockerfile), "USER")
    assert user is not None, "final stage has no USER"
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER {user}: use a numeric non-root UID (runAsNonRoot)"
    # The pods the operator renders (and the chart's operator pod) run as this uid: the image's home and files
    # belong to it.
    assert user == f"{NON_ROOT_UID}:{NON_ROOT_UID}", f"USER {user}: the pods run as {NON_ROOT_UID}"


def test_vllm_image_home_is_the_workers_home() -> None:
    """The vLLM image keeps its caches under the home the worker pods mount writable (an emptyDir)."""
    env = " ".join(rest for op, rest in final(IMAGES / "vllm" / "Dockerfile").instructions if op == "ENV")
    assert f"HOME={HOME_DIR}" in env
    for var in ("HF_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR"):
        assert re.search(rf"{var}={re.escape(HOME_DIR)}/", env), var


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_entrypoint_exec_form(dockerfile: Path) -> None:
    entry = last(final(dockerfile), "ENTRYPOINT")
    assert entry is not None
    entry_list = json.loads(entry)  # exec form: a JSON array (signals reach the process)
    expected = {"operator": ["disagg"], "sim": ["vllm", "serve"], "vllm": ["vllm", "serve"]}
    assert entry_list == expected[dockerfile.parent.name]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerignore_and_copied_paths(dockerfile: Path) -> None:
    ignore = dockerfile.with_name("Dockerfile.dockerignore")
    assert ignore.exists(), "BuildKit's per-Dockerfile ignore file is missing"
    patterns = [ln.strip() for ln in ignore.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert patterns[0] == "*", "deny by default, then allow what the build copies"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    for stage in parse(dockerfile)[1]:
        for op, rest in stage.instructions:
            if op not in ("COPY", "ADD") or "--from" in rest:
                continue
            parts = [p for p in shlex.split(rest) if not p.startswith("--")]
            for src in parts[:-1]:
                assert (REPO / src).exists(), f"COPY {src}: not in the repository"
                assert any(src.rstrip("/") == a or src.startswith(a + "/") for a in allowed), \
                    f"COPY {src} is excluded by {ignore.name}"


def test_operator_image_is_the_router_image() -> None:
    chart = yaml.safe_load((REPO / "charts" / "disagg-operator" / "Chart.yaml").read_text())
    values = yaml.safe_load((REPO / "charts" / "disagg-operator" / "values.yaml").read_text())
    assert f"{values['image']['repository']}:{chart['appVersion']}" == DEFAULT_ROUTER_IMAGE
    text = (IMAGES / "operator" / "Dockerfile").read_text()
    assert f"-t {DEFAULT_ROUTER_IMAGE} " in text
    cmd = last(final(IMAGES / "operator" / "Dockerfile"), "CMD")
    assert cmd is not None and json.loads(cmd)[0] == "operator"


def test_vllm_image_matches_the_default_engine_image() -> None:
    assert final(IMAGES / "vllm" / "Dockerfile").base == DEFAULT_VLLM_IMAGE
    text = (IMAGES / "vllm" / "Dockerfile").read_text()
    assert re.search(r"ARG NIXL_VERSION=\d+\.\d+\.\d+", text), "pin NIXL"
    assert "from nixl._api import nixl_agent" in text  # the build fails when NIXL/UCX cannot load


def test_sim_shim_runs_disagg_sim(tmp_path: Path) -> None:
    """images/sim/vllm turns `vllm serve ARGS` into `disagg sim ARGS`, verbatim."""
    shim = IMAGES / "sim" / "vllm"
    assert os.access(shim, os.X_OK)
    fake = tmp_path / "disagg"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    args = ["meta-llama/Llama-3.1-8B-Instruct", "--kv-transfer-config", '{"kv_connector": "NixlConnector"}',
            "--port", "8000"]
    res = subprocess.run([str(shim), "serve", *args], capture_output=True, text=True, env=env, timeout=10)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["sim", *args]
    res = subprocess.run([str(shim), "bench"], capture_output=True, text=True, env=env, timeout=10)
    assert res.returncode == 2 and "only `vllm serve" in res.stderr


def test_vllm_image_has_the_rdma_userspace_before_its_user() -> None:
    """NIXL's UCX loads libibverbs and the vendor providers at run time: without them an rdma model falls back to
    TCP silently. They are installed as root, in a layer before USER, unless built with RDMA=false."""
    stage = final(IMAGES / "vllm" / "Dockerfile")
    ops = [op for op, _ in stage.instructions]
    rdma = next(i for i, (op, rest) in enumerate(stage.instructions) if op == "RUN" and "ibverbs-providers" in rest)
    assert rdma < ops.index("USER")
    run = stage.instructions[rdma][1]
    for package in ("rdma-core", "libibverbs1", "ibverbs-providers", "librdmacm1", "ibverbs-utils"):
        assert package in run.split(), package
    assert "CDLL('libibverbs.so.1')" in run  # the build fails when the library cannot load
    assert ("ARG", "RDMA=true") in stage.instructions
