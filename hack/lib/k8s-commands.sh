# Sourced by hack/build-control-plane.sh and hack/build-node.sh: build commands of k8s.io/kubernetes (cmd/NAME) at
# $K8S_VERSION from Go module sources. A wrapper module requires k8s.io/kubernetes and carries one replace line per
# staging module, derived from kubernetes' own go.mod (every `k8s.io/X => ./staging/src/k8s.io/X` becomes
# `k8s.io/X => k8s.io/X v0.Y.Z`). Needs: K8S_VERSION and a log function; set -euo pipefail in the caller.

# k8s_build_commands WORKDIR MODULE BINDIR LOGTAG CMD... — writes the wrapper module in WORKDIR, then builds each
# missing cmd/CMD into BINDIR (atomically: NAME.tmp, then renamed).
k8s_build_commands() {
  local work="$1" module="$2" bin="$3" tag="$4"
  shift 4
  local modjson gomod staging_tag ld b
  log "resolving k8s.io/kubernetes@$K8S_VERSION through the module proxy"
  modjson="$(cd "$work" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION")"
  gomod="$(printf '%s' "$modjson" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -f "$gomod" ]] || { log "could not download k8s.io/kubernetes@$K8S_VERSION: $modjson"; return 1; }
  staging_tag="v0.${K8S_VERSION#v1.}"
  {
    echo "module $module"
    echo
    echo "go 1.24"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    # every staging module that kubernetes' own go.mod replaces with ./staging/... -> its v0.X.Y tag
    grep -E '^[[:space:]]*k8s\.io/[^ ]+ => \./staging/' "$gomod" \
      | awk -v tag="$staging_tag" '{print "replace " $1 " => " $1 " " tag}'
  } > "$work/go.mod"
  log "$(grep -c '^replace' "$work/go.mod") staging modules mapped to $staging_tag"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for b in "$@"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$b"; done
    printf ')\n'
  } > "$work/tools.go"
  log "go mod tidy (downloads a few hundred modules the first time)"
  (cd "$work" && go mod tidy -e >&2)
  ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
  ld="$ld -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
  ld="$ld -X k8s.io/component-base/version.gitTreeState=clean"
  for b in "$@"; do
    [[ -x "$bin/$b" ]] && continue
    log "building $b $K8S_VERSION (several minutes on 2 cores the first time)"
    (cd "$work" && go build -v -trimpath -ldflags "$ld" -o "$bin/$b.tmp" "k8s.io/kubernetes/cmd/$b" 2>&1) \
      | awk -v tag="$tag" '{n++; if (n % 100 == 0) {printf "[%s]   %d packages compiled (%s)\n", tag, n, $0 > "/dev/stderr"}}'
    [[ ${PIPESTATUS[0]} -eq 0 ]] || { log "build of $b failed"; return 1; }
    mv "$bin/$b.tmp" "$bin/$b"
  done
}
