#!/usr/bin/env bash
# Build the node half of a real Kubernetes cluster (kubelet, kube-scheduler) from Go module sources, with the
# same technique and the same k8s.io/kubernetes version as hack/build-control-plane.sh: a wrapper module that
# requires k8s.io/kubernetes and maps every staging module to its v0.X.Y tag. No prebuilt binaries.
#
# Output: $DISAGG_CACHE/node/k8s-$K8S_VERSION/{kubelet,kube-scheduler}
# A second run with the same version finds the binaries and does nothing (cold: ~7 min on 2 cores; warm: ~1 min).
# Prints the bin directory on its last line of stdout.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.3}"
CACHE="${DISAGG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/disagg}"
BIN="$CACHE/node/k8s-$K8S_VERSION"
WORK="$CACHE/node/src-k8s-$K8S_VERSION"
BINARIES=(kubelet kube-scheduler)

log() { printf '[node] %s\n' "$*" >&2; }

have_all() { for b in "${BINARIES[@]}"; do [[ -x "$BIN/$b" ]] || return 1; done; }
if have_all; then log "cached: $BIN"; echo "$BIN"; exit 0; fi

command -v go >/dev/null || { log "go is required (Go >= 1.24) to build kubelet and kube-scheduler"; exit 1; }
export GOFLAGS="${GOFLAGS:--buildvcs=false}" CGO_ENABLED=0
mkdir -p "$BIN" "$WORK"
exec 9>"$CACHE/node/.build.lock"
flock 9
if have_all; then log "cached: $BIN"; echo "$BIN"; exit 0; fi

# shellcheck source=hack/lib/k8s-commands.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/k8s-commands.sh"
k8s_build_commands "$WORK" disagg.dev/node "$BIN" node "${BINARIES[@]}"

have_all || { log "missing binaries in $BIN"; exit 1; }
log "built: $BIN"
echo "$BIN"
