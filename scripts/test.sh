#!/usr/bin/env bash
# Installs the dependencies, builds, and runs the whole test suite. CI runs exactly this.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${TANDEM_BUILD:-$root/build}
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
start=$(date +%s)
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" --timeout 900
echo "test suite: $(( $(date +%s) - start )) s"
