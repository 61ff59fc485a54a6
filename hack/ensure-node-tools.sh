#!/usr/bin/env bash
# Make sure this machine has what the real local node (operator/disagg/local/cluster.py) and the local image build
# (hack/build-images.sh) need: Debian packages (installed with apt-get when missing and we are root) and kernel
# features (only checked: nothing here loads modules or changes the kernel).
#
#   bash hack/ensure-node-tools.sh            # install what is missing, then check; exit 1 naming what is absent
#   bash hack/ensure-node-tools.sh --check    # only check (no apt-get); exit 1 naming what is absent
#
# Idempotent: a second run finds everything and installs nothing. The last line of stdout is "ok" on success.
set -euo pipefail

log() { printf '[node-tools] %s\n' "$*" >&2; }
CHECK_ONLY=0
[[ "${1:-}" == "--check" ]] && CHECK_ONLY=1

# command -> Debian package, and why it is needed
declare -A PKG=(
  [mmdebstrap]=mmdebstrap [podman]=podman [runc]=runc [containerd]=containerd [ctr]=containerd
  [socat]=socat [nft]=nftables [openssl]=openssl [ip]=iproute2 [mount]=mount
)
declare -A WHY=(
  [mmdebstrap]="builds the Debian bookworm base image (no registry)"
  [podman]="builds the images from images/*/Dockerfile"
  [runc]="the OCI runtime of podman and containerd (crun refuses cgroup hybrid mode)"
  [containerd]="the node's container runtime (CRI)"
  [ctr]="imports the built images into containerd"
  [socat]="forwards the kubernetes Service to the loopback apiserver (there is no kube-proxy)"
  [nft]="the one DNAT rule for the kubernetes Service ClusterIP, in a table the local cluster owns"
  [openssl]="the kubelet's client and serving certificates"
  [ip]="the pod bridge and network namespaces"
  [mount]="unmounting the node's leftovers on stop"
)
CNI_DIR=/usr/lib/cni
CNI_PLUGINS=(bridge host-local loopback)

missing_cmds() {
  local c
  for c in "${!PKG[@]}"; do command -v "$c" >/dev/null 2>&1 || echo "$c"; done
}
missing_cni() {
  local p
  for p in "${CNI_PLUGINS[@]}"; do [[ -x "$CNI_DIR/$p" ]] || echo "$p"; done
}

cmds="$(missing_cmds | sort)"
cni="$(missing_cni)"
if [[ -n "$cmds$cni" && $CHECK_ONLY -eq 0 ]]; then
  if [[ $(id -u) -ne 0 ]]; then
    log "not root: cannot apt-get install the missing packages"
  elif ! command -v apt-get >/dev/null; then
    log "no apt-get (not Debian/Ubuntu): install the packages named below by hand"
  else
    pkgs="$(for c in $cmds; do echo "${PKG[$c]}"; done; [[ -n "$cni" ]] && echo containernetworking-plugins)"
    pkgs="$(echo "$pkgs" | sort -u | tr '\n' ' ')"
    log "installing: $pkgs"
    # one apt-get update per machine (the lists stay), then install; never upgrade anything else
    if [[ ! -f /var/lib/apt/lists/.disagg-updated ]]; then
      apt-get update -qq >&2 && touch /var/lib/apt/lists/.disagg-updated
    fi
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs >&2
    # Debian starts containerd as a service on install; the local cluster runs its own, under its state dir.
  fi
  cmds="$(missing_cmds | sort)"
  cni="$(missing_cni)"
fi

problems=()
for c in $cmds; do problems+=("command '$c' (Debian package ${PKG[$c]}): ${WHY[$c]}"); done
for p in $cni; do problems+=("CNI plugin $CNI_DIR/$p (Debian package containernetworking-plugins): pod networking"); done

# ---- kernel features (checked, never changed)
grep -qw overlay /proc/filesystems \
  || problems+=("kernel: no overlay filesystem in /proc/filesystems (containerd's overlayfs snapshotter, podman)")
[[ -d /sys/fs/cgroup ]] && { [[ -d /sys/fs/cgroup/memory || -f /sys/fs/cgroup/cgroup.controllers ]]; } \
  || problems+=("kernel: no memory cgroup under /sys/fs/cgroup (kubelet needs cgroups v1 memory or cgroups v2)")
[[ -e /proc/self/ns/net ]] || problems+=("kernel: no network namespaces (/proc/self/ns/net)")
if ip link add disagg-probe0 type veth peer name disagg-probe1 2>/dev/null; then
  ip link del disagg-probe0
else
  problems+=("kernel: cannot create a veth pair (CONFIG_VETH; pods' network interfaces)")
fi
if ip link add disagg-probebr type bridge 2>/dev/null; then
  ip link del disagg-probebr
else
  problems+=("kernel: cannot create a bridge (CONFIG_BRIDGE; the pod network)")
fi
if command -v nft >/dev/null; then
  if nft add table ip disagg-probe 2>/dev/null; then
    nft delete table ip disagg-probe
  else
    problems+=("kernel: nf_tables unavailable (nft add table failed; the kubernetes Service DNAT rule)")
  fi
fi
[[ $(id -u) -eq 0 ]] || problems+=("not root: kubelet and containerd need root (run as root or in a root VM)")

if ((${#problems[@]})); then
  log "missing for the real local node:"
  for p in "${problems[@]}"; do log "  - $p"; done
  echo "missing: ${problems[*]}"
  exit 1
fi
echo ok
