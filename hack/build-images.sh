#!/usr/bin/env bash
# Build the project's images on this machine with no registry (`make images-local`):
#
#   base   a Debian bookworm rootfs (mmdebstrap: python3, pip, venv, CA certificates), imported into podman
#   disagg images/operator/Dockerfile on that base (operator + router + `disagg sim`)   -> ghcr.io/disagg/disagg:<v>
#   sim    images/sim/Dockerfile on that base (`vllm serve ...` runs `disagg sim ...`)    -> ghcr.io/disagg/disagg-sim:<v>
#   twin   the sim image, also tagged with the default vLLM image name (DEFAULT_VLLM_IMAGE): the local node runs
#          it wherever a model names vLLM. It is a twin for tests, never published.
#   pause  the pod sandbox image (images/pause: a static Go binary)                      -> localhost/disagg/pause:3.10
#
# Each step is cached by the content hash of its inputs under $DISAGG_CACHE/images/ (a `podman save` archive per
# image); a second run with the same inputs does nothing but print the list. Last line of stdout: the path of a
# list file with one "<image ref> <archive path>" line per image, which the local cluster imports into containerd.
#
# Env: VERSION (tag of disagg/disagg-sim, default: the chart's appVersion), REGISTRY (default ghcr.io/disagg),
#      VLLM_TWIN_IMAGE (default: disagg.api.spec.DEFAULT_VLLM_IMAGE), DEBIAN_MIRROR (default deb.debian.org).
set -euo pipefail
shopt -s inherit_errexit

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${DISAGG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/disagg}"
OUT="$CACHE/images"
REGISTRY="${REGISTRY:-ghcr.io/disagg}"
VERSION="${VERSION:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' "$REPO/charts/disagg-operator/Chart.yaml")}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org}"
PAUSE_IMAGE="localhost/disagg/pause:3.10"
# one source date for the rootfs (mmdebstrap honours SOURCE_DATE_EPOCH): the same recipe gives the same files
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-1735689600}"

log() { printf '[images] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

if [[ -z "${VLLM_TWIN_IMAGE:-}" ]]; then
  py="$REPO/.venv/bin/python"; [[ -x "$py" ]] || py=python3
  VLLM_TWIN_IMAGE="$(PYTHONPATH="$REPO/operator" "$py" -c \
    'from disagg.api.spec import DEFAULT_VLLM_IMAGE; print(DEFAULT_VLLM_IMAGE)' 2>/dev/null)" \
    || die "cannot read DEFAULT_VLLM_IMAGE from disagg.api.spec (set VLLM_TWIN_IMAGE)"
fi

# podman qualifies a short name with localhost/ (vllm/vllm-openai → localhost/vllm/vllm-openai); containerd and the
# kubelet read it as docker.io/vllm/vllm-openai. Tag with the name the kubelet will look for.
qualify() {
  local first="${1%%/*}"
  if [[ "$1" == */* && ( "$first" == *.* || "$first" == *:* || "$first" == localhost ) ]]; then echo "$1"
  elif [[ "$1" == */* ]]; then echo "docker.io/$1"
  else echo "docker.io/library/$1"; fi
}
VLLM_TWIN_IMAGE="$(qualify "$VLLM_TWIN_IMAGE")"

for c in mmdebstrap podman go; do
  command -v "$c" >/dev/null || die "'$c' is missing: run hack/ensure-node-tools.sh (go: Go >= 1.24 for the pause image)"
done
mkdir -p "$OUT"
exec 9>"$OUT/.build.lock"
flock 9

# podman here: runc (crun refuses cgroup hybrid mode), no systemd/journald, and ulimits no higher than ours
# (raising rlimits is not permitted in this kind of VM). Our own config file; /etc is left alone.
export CONTAINERS_CONF="$OUT/containers.conf"
cat > "$CONTAINERS_CONF.tmp" <<CONF
[containers]
default_ulimits = ["nofile=$(ulimit -Sn):$(ulimit -Hn)", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
mv "$CONTAINERS_CONF.tmp" "$CONTAINERS_CONF"

# Explicit limits for RUN steps (podman 4.3 builds do not read default_ulimits): runc may not raise them in this
# kind of VM (no CAP_SYS_RESOURCE; an nproc above 4096 was refused under conmon here, even at our own hard limit).
ULIMITS=(--ulimit "nofile=$(ulimit -Sn):$(ulimit -Hn)" --ulimit "nproc=4096:4096")
sha() { sha256sum | cut -c1-16; }
# the files a Dockerfile's .dockerignore lets in (pyproject.toml, README.md, operator/ minus caches, + extras)
context_hash() {
  (cd "$REPO" && { find pyproject.toml README.md operator "$@" -type f \
      ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' -print0 | sort -z | xargs -0 sha256sum; })
}
have_image() { podman image exists "$1" 2>/dev/null; }

# ------------------------------------------------------------------ base: Debian bookworm rootfs via mmdebstrap
BASE_PKGS="python3,python3-pip,python3-venv,ca-certificates"
recipe="mmdebstrap --variant=minbase --include=$BASE_PKGS bookworm $DEBIAN_MIRROR epoch=$SOURCE_DATE_EPOCH rm-EXTERNALLY-MANAGED v1"
base_key="$(echo "$recipe" | sha)"
BASE_TAR="$OUT/base-bookworm-$base_key.tar"
BASE_IMAGE="localhost/disagg/python-bookworm:$base_key"
if [[ ! -f "$BASE_TAR" ]]; then
  log "mmdebstrap: Debian bookworm rootfs with $BASE_PKGS (about a minute)"
  # the image's pip installs into the system Python, so PEP 668's marker goes (the image is its only user)
  mmdebstrap --quiet --variant=minbase --include="$BASE_PKGS" \
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm "$OUT/.partial-base-$base_key.tar" \
    "deb $DEBIAN_MIRROR/debian bookworm main" "deb $DEBIAN_MIRROR/debian-security bookworm-security main" >&2
  mv "$OUT/.partial-base-$base_key.tar" "$BASE_TAR"  # mmdebstrap picks the format by the name: .tar
fi
if ! have_image "$BASE_IMAGE"; then
  log "podman import $BASE_IMAGE"
  podman import --quiet --change 'CMD ["python3"]' --change 'ENV PIP_DISABLE_PIP_VERSION_CHECK=1' \
    "$BASE_TAR" "$BASE_IMAGE" >/dev/null
fi
base_hash="$(sha256sum "$BASE_TAR" | cut -c1-16)"

LIST="$OUT/images-$(printf '%s\n' "$base_hash" "$VERSION" "$REGISTRY" "$VLLM_TWIN_IMAGE" "$(context_hash images | sha)" | sha).list"
if [[ -f "$LIST" ]] && while read -r _ a; do [[ -f "$a" ]] || exit 1; done < "$LIST"; then
  log "cached: $LIST"; echo "$LIST"; exit 0
fi

# podman build: host network for PyPI during `pip wheel`, the host's CA bundle (a proxy's CA may be in it) mounted
# for the build only (never copied into an image)
build() {  # build <dockerfile> <context> <key> <tag>...
  local dockerfile="$1" context="$2" key="$3"; shift 3
  local archive="$OUT/$(basename "$(dirname "$dockerfile")")-$key.tar" tags=() t
  for t in "$@"; do tags+=(-t "$t"); done
  if [[ -f "$archive" ]]; then log "cached: $* ($archive)"; echo "$archive"; return; fi
  log "podman build $dockerfile -> $*"
  podman build --quiet --network host --pull=never "${ULIMITS[@]}" --build-arg "PYTHON_IMAGE=$BASE_IMAGE" --build-arg "SOURCE_HASH=$key" \
    -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
    --label "dev.disagg.content-hash=$key" -f "$REPO/$dockerfile" "${tags[@]}" "$context" >/dev/null
  podman save --quiet --format docker-archive -m -o "$archive.tmp" "$@"
  mv "$archive.tmp" "$archive"
  # one archive per image kind: older ones (other content) go, with their now untagged layers
  find "$OUT" -maxdepth 1 -name "$(basename "$(dirname "$dockerfile")")-*.tar" ! -name "$(basename "$archive")" -delete
  podman image prune -f >/dev/null 2>&1 || true
  echo "$archive"
}

# ------------------------------------------------------------------ disagg (operator + router) and sim (+ twin)
disagg_key="$(printf '%s\n' "$base_hash" "$(context_hash images/operator | sha)" | sha)"
sim_key="$(printf '%s\n' "$base_hash" "$(context_hash images/sim | sha)" "$VLLM_TWIN_IMAGE" | sha)"
disagg_tar="$(build images/operator/Dockerfile "$REPO" "$disagg_key" "$REGISTRY/disagg:$VERSION")"
sim_tar="$(build images/sim/Dockerfile "$REPO" "$sim_key" "$REGISTRY/disagg-sim:$VERSION" "$VLLM_TWIN_IMAGE")"

# ------------------------------------------------------------------ pause
pause_key="$(cat "$REPO/images/pause/pause.go" "$REPO/images/pause/Containerfile" <(go version) | sha)"
pause_tar="$OUT/pause-$pause_key.tar"
if [[ ! -f "$pause_tar" ]]; then
  ctx="$(mktemp -d)"; trap 'rm -rf "$ctx"' EXIT
  log "go build pause"
  (cd "$REPO/images/pause" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false GO111MODULE=off \
    go build -trimpath -ldflags "-s -w" -o "$ctx/pause" pause.go)
  cp "$REPO/images/pause/Containerfile" "$ctx/Dockerfile"
  podman build --quiet --pull=never "${ULIMITS[@]}" -t "$PAUSE_IMAGE" "$ctx" >/dev/null
  podman save --quiet --format docker-archive -o "$pause_tar.tmp" "$PAUSE_IMAGE"
  mv "$pause_tar.tmp" "$pause_tar"
fi

{
  echo "$REGISTRY/disagg:$VERSION $disagg_tar"
  echo "$REGISTRY/disagg-sim:$VERSION $sim_tar"
  echo "$VLLM_TWIN_IMAGE $sim_tar"
  echo "$PAUSE_IMAGE $pause_tar"
} > "$LIST.tmp"
mv "$LIST.tmp" "$LIST"
find "$OUT" -maxdepth 1 -name 'images-*.list' ! -name "$(basename "$LIST")" -delete
log "built: $(cut -d' ' -f1 "$LIST" | tr '\n' ' ')"
echo "$LIST"
