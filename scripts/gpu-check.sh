#!/usr/bin/env bash
# gpu-check.sh: the GPU check of gradsnap, for a machine with one (or more) NVIDIA GPUs.
# Usage: scripts/gpu-check.sh [OUTDIR]      (OUTDIR defaults to $OUT)
#
# In under 8 minutes on one H200 it
#   1. configures and builds the GPU targets with CUDA (GRADSNAP_CUDA=ON, sm_${GRADSNAP_CUDA_ARCH:-90}),
#   2. runs `ctest -L gpu` (the GPU tests skip only without a device or driver: here they must run),
#   3. runs `snapshot_bench --device cuda` on gpt2-350m (303M parameters; this repository's
#      gpt2-124m has GPT-2 small's shape but a byte vocabulary, 86M) with every checkpoint mode,
# and writes under OUTDIR: nvidia-smi.txt, configure.log, build.log, ctest-gpu.log, bench.log,
# bench-last-line.txt (the benchmark's name=value line) and summary.txt (one line per stage).
# Environment: BUILD_DIR (default: build-gpu), JOBS (default: nproc), GRADSNAP_CUDA_ARCH (90),
# BENCH_ARGS (extra snapshot_bench flags, e.g. "--rounds 2").
# Exit status: 0 when every stage passed, 1 otherwise, 2 for bad usage.
set -u -o pipefail

OUTDIR=${1:-${OUT:-}}
if [ -z "$OUTDIR" ]; then
  echo "gpu-check.sh: give an output directory or set \$OUT" >&2
  exit 2
fi
mkdir -p "$OUTDIR" || exit 2
OUTDIR=$(cd "$OUTDIR" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build-gpu}
JOBS=${JOBS:-$(nproc)}
ARCH=${GRADSNAP_CUDA_ARCH:-90}
SUMMARY="$OUTDIR/summary.txt"
: > "$SUMMARY"
T0=$(date +%s)
status=0

stage() {  # stage NAME SECONDS LOG COMMAND...: runs COMMAND with a time limit, notes the result
  local name=$1 limit=$2 log=$3
  shift 3
  local t=$(date +%s)
  timeout "$limit" "$@" > "$log" 2>&1
  local rc=$?
  local line="$name rc=$rc seconds=$(( $(date +%s) - t ))"
  [ $rc -eq 124 ] && line="$line (timed out after ${limit}s)"
  echo "$line" | tee -a "$SUMMARY"
  [ $rc -eq 0 ] || status=1
  return $rc
}

(nvidia-smi || echo "nvidia-smi not found") > "$OUTDIR/nvidia-smi.txt" 2>&1
stage configure 120 "$OUTDIR/configure.log" \
  cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DGRADSNAP_CUDA=ON \
  -DGRADSNAP_CUDA_ARCH="$ARCH" || { echo "total_seconds=$(( $(date +%s) - T0 ))" >> "$SUMMARY"; exit 1; }
# Only what the GPU check runs: the GPU tests, the trainer and the benchmark.
stage build 300 "$OUTDIR/build.log" \
  cmake --build "$BUILD_DIR" -j "$JOBS" --target gradsnap-train snapshot_bench \
  cuda_backend_test cuda_snapshot_test gpu_e2e_test || {
  echo "total_seconds=$(( $(date +%s) - T0 ))" >> "$SUMMARY"; exit 1; }
stage ctest-gpu 120 "$OUTDIR/ctest-gpu.log" \
  bash -c "cd '$BUILD_DIR' && ctest -L gpu --output-on-failure --no-tests=error"
# A run that skipped a GPU test did not check anything: count skips as a failure here.
if grep -q "Skipped\|\*\*\*Not Run" "$OUTDIR/ctest-gpu.log"; then
  echo "ctest-gpu: some GPU tests were skipped (no device?)" | tee -a "$SUMMARY"
  status=1
fi
# shellcheck disable=SC2086
stage bench 270 "$OUTDIR/bench.log" \
  "$BUILD_DIR/bin/snapshot_bench" --device cuda --model gpt2-350m --steps 20 --every 10 \
  --batch 4 --seq 256 --rounds 1 --dir "$OUTDIR/bench-scratch" ${BENCH_ARGS:-}
tail -n 1 "$OUTDIR/bench.log" > "$OUTDIR/bench-last-line.txt"
rm -rf "$OUTDIR/bench-scratch"
echo "bench: $(cat "$OUTDIR/bench-last-line.txt")" >> "$SUMMARY"
echo "total_seconds=$(( $(date +%s) - T0 ))" | tee -a "$SUMMARY"
exit $status
