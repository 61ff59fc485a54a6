#!/usr/bin/env bash
# Make sure a Chromium (Debian's package) is installed: the report tests open `make demo`'s and `disagg replay`'s
# pages in it headless (tests/local/test_report_browser.py) and the demo saves a screenshot of its report.
# Idempotent: does nothing when a Chromium is already there (about 20 s and ~300 MB the first time).
# Prints the binary's path.
set -euo pipefail
for c in chromium chromium-browser google-chrome; do
  if command -v "$c" >/dev/null 2>&1; then
    command -v "$c"
    exit 0
  fi
done
SUDO=""
[[ $(id -u) -eq 0 ]] || SUDO="sudo"
echo "[chromium] installing Debian's chromium package (headless use only)" >&2
export DEBIAN_FRONTEND=noninteractive
# one apt-get update per machine (the package lists stay), as hack/ensure-node-tools.sh does
if [[ ! -e /var/lib/apt/lists/.disagg-updated ]]; then
  $SUDO apt-get update -qq >&2 && $SUDO touch /var/lib/apt/lists/.disagg-updated
fi
$SUDO apt-get install -y -qq --no-install-recommends chromium >&2 \
  || { $SUDO apt-get update -qq >&2 && $SUDO apt-get install -y -qq --no-install-recommends chromium >&2; }
command -v chromium
