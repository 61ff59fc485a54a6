#!/usr/bin/env bash
# Make sure Prometheus and promtool (Debian's package) are installed; tests start their own instances on loopback.
# Idempotent: does nothing when both are on the PATH. Prints the prometheus binary's path.
set -euo pipefail
if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
  command -v prometheus
  exit 0
fi
SUDO=""
[[ $(id -u) -eq 0 ]] || SUDO="sudo"
echo "[prometheus] installing Debian's prometheus package (prometheus + promtool)" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >&2
# --no-install-recommends: no node exporter etc.; policy-rc.d keeps the package from starting a system service
if [[ -d /usr/sbin && $(id -u) -eq 0 && ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
$SUDO apt-get install -y -qq --no-install-recommends prometheus >&2
command -v prometheus
