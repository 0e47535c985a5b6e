#!/usr/bin/env bash
# Installs what is missing, builds gradsnap (CUDA too when nvcc is present) with warnings as
# errors, checks that the tree also builds with clang's thread-safety analysis, and runs the
# whole test suite with ctest from the gcc build. Usage: bash scripts/test.sh [extra ctest args]
# Environment: BUILD_DIR (default: build), JOBS (default: nproc), CLANG_CHECK (default: 1; 0
# skips the clang build), CLANG_BUILD_DIR (default: build-clang). docs/build.md explains.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
# ccache, where installed, only speeds rebuilds up; nothing depends on it.
LAUNCHER=()
if command -v ccache >/dev/null 2>&1; then
  LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
            -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DGRADSNAP_STRICT=ON "${LAUNCHER[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
if [ "${CLANG_CHECK:-1}" != 0 ]; then
  # Build only: clang 14, no CUDA, -Wthread-safety -Werror. Its binaries are not tested.
  CLANG_BUILD_DIR=${CLANG_BUILD_DIR:-build-clang}
  cmake -S . -B "$CLANG_BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DGRADSNAP_CUDA=OFF -DGRADSNAP_STRICT=ON "${LAUNCHER[@]}" >/dev/null
  cmake --build "$CLANG_BUILD_DIR" -j "$JOBS"
fi
# The PyTorch venv of the torch-labelled tests, made when missing; without it they are skipped.
bash scripts/torch-venv.sh || echo "test.sh: the torch tests will be skipped (see above)"
cd "$BUILD_DIR"
# Soak and torture runs carry the label "long" and run from benchmarks/ instead.
ctest --output-on-failure -j "$JOBS" -LE long "$@"
