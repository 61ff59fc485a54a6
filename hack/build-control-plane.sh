#!/usr/bin/env bash
# Build a real Kubernetes control plane (kube-apiserver, kube-controller-manager) and etcd
# from Go module sources through the Go module proxy. No Docker, no downloads of prebuilt binaries.
#
# Output: $DISAGG_CACHE/control-plane/k8s-$K8S_VERSION-etcd-$ETCD_VERSION/{kube-apiserver,kube-controller-manager,etcd}
# A second run with the same versions finds the binaries and does nothing.
# Prints the bin directory on its last line of stdout.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
CACHE="${DISAGG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/disagg}"
BIN="$CACHE/control-plane/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
WORK="$CACHE/control-plane/src-k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
BINARIES=(kube-apiserver kube-controller-manager etcd)

log() { printf '[control-plane] %s\n' "$*" >&2; }

have_all() { for b in "${BINARIES[@]}"; do [[ -x "$BIN/$b" ]] || return 1; done; }
if have_all; then log "cached: $BIN"; echo "$BIN"; exit 0; fi

command -v go >/dev/null || { log "go is required (Go >= 1.24) to build the control plane"; exit 1; }
export GOFLAGS="${GOFLAGS:--buildvcs=false}" CGO_ENABLED=0
mkdir -p "$BIN" "$WORK/k8s" "$WORK/etcd"
# One build at a time per cache (two `make test` runs on one machine must not race on the same files);
# whoever waited finds the binaries the first one built.
exec 9>"$CACHE/control-plane/.build.lock"
flock 9
if have_all; then log "cached: $BIN"; echo "$BIN"; exit 0; fi

# ---------- kube-apiserver + kube-controller-manager ----------
if [[ ! -x "$BIN/kube-apiserver" || ! -x "$BIN/kube-controller-manager" ]]; then
  # shellcheck source=hack/lib/k8s-commands.sh
  source "$(dirname "${BASH_SOURCE[0]}")/lib/k8s-commands.sh"
  k8s_build_commands "$WORK/k8s" disagg.dev/controlplane "$BIN" control-plane kube-apiserver kube-controller-manager
fi

# ---------- etcd ----------
if [[ ! -x "$BIN/etcd" ]]; then
  cd "$WORK/etcd"
  cat > go.mod <<GOMOD
module disagg.dev/etcd

go 1.24

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
  cat > main.go <<'GO'
// Command etcd: etcd's own entry point, built from go.etcd.io/etcd/server/v3.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  log "go mod tidy for etcd $ETCD_VERSION"
  go mod tidy >&2
  log "building etcd $ETCD_VERSION"
  go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" . >&2
  mv "$BIN/etcd.tmp" "$BIN/etcd"
fi

have_all || { log "missing binaries in $BIN"; exit 1; }
log "built: $BIN"
echo "$BIN"
