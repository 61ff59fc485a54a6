#!/usr/bin/env bash
# Make sure nginx (Debian's package) is installed for `disagg bench router`; the benchmark runs its own instance
# in the foreground on loopback with a generated config. Idempotent: does nothing when nginx is already there.
# Prints the nginx binary's path.
set -euo pipefail
for c in nginx /usr/sbin/nginx; do
  if command -v "$c" >/dev/null 2>&1; then
    command -v "$c"
    exit 0
  fi
done
SUDO=""
[[ $(id -u) -eq 0 ]] || SUDO="sudo"
echo "[nginx] installing Debian's nginx package (nginx-light, else nginx)" >&2
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d keeps the package from starting (and enabling) a system nginx on port 80
if [[ -d /usr/sbin && $(id -u) -eq 0 && ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
$SUDO apt-get update -qq >&2
$SUDO apt-get install -y -qq --no-install-recommends nginx-light >&2 2>/dev/null \
  || $SUDO apt-get install -y -qq --no-install-recommends nginx >&2
command -v nginx 2>/dev/null || echo /usr/sbin/nginx
