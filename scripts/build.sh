#!/usr/bin/env bash
# Configures and builds tandem (Release) into build/ or $TANDEM_BUILD. Extra arguments
# go to CMake's configure step, e.g. scripts/build.sh -DTANDEM_CUDA=OFF; TANDEM_TARGET
# names one target to build instead of everything. The tokenizer libraries (PCRE2,
# SentencePiece) are required here, so CI fails when they are missing; pass
# -DTANDEM_REQUIRE_TOKENIZER_DEPS=OFF to build without them.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${TANDEM_BUILD:-$root/build}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTANDEM_REQUIRE_TOKENIZER_DEPS=ON "$@" >/dev/null
cmake --build "$build" -j"$(nproc)" ${TANDEM_TARGET:+--target "$TANDEM_TARGET"}
