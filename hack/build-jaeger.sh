#!/usr/bin/env bash
# Build Jaeger (the v2 all-in-one binary: OTLP receivers, in-memory storage, query API/UI) from Go module
# sources through the Go module proxy, like hack/build-control-plane.sh. No Docker, no prebuilt downloads.
#
# Output: $DISAGG_CACHE/jaeger/$JAEGER_VERSION/jaeger
# A second run with the same version finds the binary and does nothing.
# Prints the binary's path on its last line of stdout.
set -euo pipefail

JAEGER_VERSION="${JAEGER_VERSION:-v1.76.0}"
CACHE="${DISAGG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/disagg}"
BIN="$CACHE/jaeger/$JAEGER_VERSION"
WORK="$CACHE/jaeger/src-$JAEGER_VERSION"

log() { printf '[jaeger] %s\n' "$*" >&2; }

if [[ -x "$BIN/jaeger" ]]; then log "cached: $BIN/jaeger"; echo "$BIN/jaeger"; exit 0; fi

command -v go >/dev/null || { log "go is required (Go >= 1.24) to build jaeger"; exit 1; }
export GOFLAGS="${GOFLAGS:--buildvcs=false}" CGO_ENABLED=0
mkdir -p "$BIN" "$WORK"
# One build at a time per cache; whoever waited finds the binary the first one built.
exec 9>"$CACHE/jaeger/.build.lock"
flock 9
if [[ -x "$BIN/jaeger" ]]; then log "cached: $BIN/jaeger"; echo "$BIN/jaeger"; exit 0; fi

cd "$WORK"
# A wrapper module that requires jaeger as a tool: `go get -tool` resolves jaeger's own go.mod requirements
# (its replace directives do not apply to a dependency, so the wrapper builds against what the proxy serves).
if [[ ! -f go.mod ]]; then
  cat > go.mod <<GOMOD
module disagg.dev/jaeger

go 1.24
GOMOD
fi
log "resolving github.com/jaegertracing/jaeger/cmd/jaeger@$JAEGER_VERSION through the module proxy"
go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$JAEGER_VERSION" >&2
log "building jaeger $JAEGER_VERSION (many minutes on 2 cores)"
go build -v -trimpath -ldflags "-s -w" -o "$BIN/jaeger.tmp" github.com/jaegertracing/jaeger/cmd/jaeger 2>&1 \
  | awk '{n++; if (n % 100 == 0) {printf "[jaeger]   %d packages compiled (%s)\n", n, $0 > "/dev/stderr"}}'
[[ ${PIPESTATUS[0]} -eq 0 ]] || { log "build of jaeger failed"; exit 1; }
mv "$BIN/jaeger.tmp" "$BIN/jaeger"
log "built: $BIN/jaeger"
echo "$BIN/jaeger"
