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

log "resolving k8s.io/kubernetes@$K8S_VERSION through the module proxy"
modjson="$(cd "$WORK" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION")"
gomod="$(printf '%s' "$modjson" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
[[ -f "$gomod" ]] || { log "could not download k8s.io/kubernetes@$K8S_VERSION: $modjson"; exit 1; }
staging_tag="v0.${K8S_VERSION#v1.}"
cd "$WORK"
{
  echo "module disagg.dev/node"
  echo
  echo "go 1.24"
  echo
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  grep -E '^[[:space:]]*k8s\.io/[^ ]+ => \./staging/' "$gomod" \
    | awk -v tag="$staging_tag" '{print "replace " $1 " => " $1 " " tag}'
} > go.mod
log "$(grep -c '^replace' go.mod) staging modules mapped to $staging_tag"
cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
log "go mod tidy"
go mod tidy -e >&2
ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
ld="$ld -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
ld="$ld -X k8s.io/component-base/version.gitTreeState=clean"
for b in "${BINARIES[@]}"; do
  [[ -x "$BIN/$b" ]] && continue
  log "building $b $K8S_VERSION (several minutes on 2 cores the first time)"
  go build -v -trimpath -ldflags "$ld" -o "$BIN/$b.tmp" "k8s.io/kubernetes/cmd/$b" 2>&1 \
    | awk '{n++; if (n % 100 == 0) {printf "[node]   %d packages compiled (%s)\n", n, $0 > "/dev/stderr"}}'
  [[ ${PIPESTATUS[0]} -eq 0 ]] || { log "build of $b failed"; exit 1; }
  mv "$BIN/$b.tmp" "$BIN/$b"
done

have_all || { log "missing binaries in $BIN"; exit 1; }
log "built: $BIN"
echo "$BIN"
