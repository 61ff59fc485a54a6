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
  log "resolving k8s.io/kubernetes@$K8S_VERSION through the module proxy"
  modjson="$(cd "$WORK" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION")"
  gomod="$(printf '%s' "$modjson" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -f "$gomod" ]] || { log "could not download k8s.io/kubernetes@$K8S_VERSION: $modjson"; exit 1; }
  staging_tag="v0.${K8S_VERSION#v1.}"
  cd "$WORK/k8s"
  {
    echo "module disagg.dev/controlplane"
    echo
    echo "go 1.24"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    # every staging module that kubernetes' own go.mod replaces with ./staging/... -> its v0.X.Y tag
    grep -E '^[[:space:]]*k8s\.io/[^ ]+ => \./staging/' "$gomod" \
      | awk -v tag="$staging_tag" '{print "replace " $1 " => " $1 " " tag}'
  } > go.mod
  log "$(grep -c '^replace' go.mod) staging modules mapped to $staging_tag"
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
GO
  log "go mod tidy (downloads a few hundred modules the first time)"
  go mod tidy -e >&2
  ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
  ld="$ld -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
  ld="$ld -X k8s.io/component-base/version.gitTreeState=clean"
  for b in kube-apiserver kube-controller-manager; do
    log "building $b $K8S_VERSION (several minutes on 2 cores)"
    go build -v -trimpath -ldflags "$ld" -o "$BIN/$b.tmp" "k8s.io/kubernetes/cmd/$b" 2>&1 \
      | awk '{n++; if (n % 100 == 0) {printf "[control-plane]   %d packages compiled (%s)\n", n, $0 > "/dev/stderr"}}'
    [[ ${PIPESTATUS[0]} -eq 0 ]] || { log "build of $b failed"; exit 1; }
    mv "$BIN/$b.tmp" "$BIN/$b"
  done
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
