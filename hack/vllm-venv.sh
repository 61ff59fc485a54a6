#!/usr/bin/env bash
# The vLLM parser tier's own venv (.venv-vllm): vLLM's `vllm serve` parser and EngineArgs, CPU only, no GPU.
# vLLM is installed --no-deps over its pinned torch (the CUDA wheel from PyPI imports on a machine without a GPU),
# plus the pure-Python packages its argument parser imports. ~7 GB; pip's cache makes a second build quick.
# Versions: vLLM 0.33.0 = disagg.vllm_versions.DEFAULT_VERSION (newest on PyPI on 2026-11-30); torch==2.14.0 is its pin.
set -euo pipefail
VENV="${1:-.venv-vllm}"
VLLM_VERSION="${VLLM_VERSION:-0.33.0}"
TORCH_VERSION="${TORCH_VERSION:-2.14.0}"
STAMP="$VENV/.installed-vllm-$VLLM_VERSION"
[[ -f "$STAMP" ]] && exit 0
python3 -m venv "$VENV"
pip=("$VENV/bin/pip" install --quiet --disable-pip-version-check)
"${pip[@]}" "torch==$TORCH_VERSION"
"${pip[@]}" --no-deps "vllm==$VLLM_VERSION"
"${pip[@]}" "transformers>=5.16.1,<5.21" "huggingface_hub>=1.31" "tokenizers>=0.23.2" \
  "fastapi>=0.133,<0.137" "starlette>=1.0.1" "openai>=2.25" "oss-harmony>=0.0.11" xgrammar==0.2.8 \
  "llguidance>=1.7,<1.8" regex cachetools psutil sentencepiece numpy requests tqdm blake3 py-cpuinfo \
  prometheus_client prometheus-fastapi-instrumentator msgspec pyzmq cloudpickle partial-json-parser \
  pybase64 cbor2 ijson setproctitle einops aiohttp orjson pillow tiktoken jsonschema python-json-logger \
  watchfiles uvloop
"${pip[@]}" -e '.[test]'
touch "$STAMP"
