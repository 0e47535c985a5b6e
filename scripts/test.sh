#!/usr/bin/env bash
# Installs what is missing, builds gradsnap (CUDA too when nvcc is present) and runs the whole
# test suite with ctest. Usage: bash scripts/test.sh [extra ctest args]
# Environment: BUILD_DIR (default: build), JOBS (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
cd "$BUILD_DIR"
# Soak and torture runs carry the label "long" and run from benchmarks/ instead.
ctest --output-on-failure -j "$JOBS" -LE long "$@"
