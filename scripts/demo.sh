#!/usr/bin/env bash
# The main job, end to end on one machine: installs what is missing, builds gradsnap, starts a
# gradsnap-server on loopback, trains the `small` GPT on 2 CPU ranks with GoCkpt checkpoints
# and the per-step gradient log streamed to the server, kills rank 1 mid-run, lets the launcher
# restart and resume the job, then lists and verifies the checkpoints with the gradsnap CLI,
# restores the recovery point (as rank files and as named weights) and resumes the job with
# another number of ranks (exact resharding).
# Environment: BUILD_DIR (default: build), DEMO_DIR (default: a fresh temp dir),
# DEMO_MODEL (default: small), DEMO_STEPS (default: 20).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" --target gradsnap-server gradsnap gradsnap-train
BIN=$BUILD_DIR/bin
DEMO_DIR=${DEMO_DIR:-$(mktemp -d /tmp/gradsnap-demo.XXXXXX)}
MODEL=${DEMO_MODEL:-small}
STEPS=${DEMO_STEPS:-20}
mkdir -p "$DEMO_DIR"

echo "== starting gradsnap-server (data in $DEMO_DIR/server)"
"$BIN/gradsnap-server" --data-dir "$DEMO_DIR/server" --listen 127.0.0.1:0 \
  >"$DEMO_DIR/server.out" 2>"$DEMO_DIR/server.log" &
SERVER_PID=$!
trap 'kill -TERM $SERVER_PID 2>/dev/null || true; wait $SERVER_PID 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  grep -q 'listening on' "$DEMO_DIR/server.out" 2>/dev/null && break
  kill -0 $SERVER_PID 2>/dev/null || { cat "$DEMO_DIR/server.log"; exit 1; }
  sleep 0.1
done
ADDR=$(sed -n 's/^gradsnap-server listening on \([^ ]*\).*/\1/p' "$DEMO_DIR/server.out")
echo "gradsnap-server listening on $ADDR"

FAIL_AT=$((STEPS * 6 / 10))
echo "== training $MODEL on 2 ranks, gockpt every 5 steps + gradient log; rank 1 dies at step $FAIL_AT"
"$BIN/gradsnap-train" --model "$MODEL" --seq 64 --batch 8 --steps "$STEPS" --nproc 2 \
  --ckpt-mode gockpt --ckpt-every 5 --grad-log --storage "$ADDR" --job demo \
  --fail-at-step "$FAIL_AT" --fail-rank 1 --max-restarts 1 | tee "$DEMO_DIR/train.log"

echo "== checkpoints of job demo"
"$BIN/gradsnap" --server "$ADDR" ls demo
echo "== verifying every checkpoint (re-reads all chunks, checks CRC-32Cs and tensor digests)"
"$BIN/gradsnap" --server "$ADDR" verify demo --all
echo "== restoring the recovery point (FULL + its DELTA chain replayed) to $DEMO_DIR/restore"
"$BIN/gradsnap" --server "$ADDR" restore demo latest --out "$DEMO_DIR/restore"
ls -l "$DEMO_DIR/restore"
echo "== the same state as named weights (model.safetensors, optimizer.safetensors, trainer_state.json)"
"$BIN/gradsnap" --server "$ADDR" restore demo latest --consolidate --out "$DEMO_DIR/consolidated"
ls -l "$DEMO_DIR/consolidated"
grep -E '^(restart|resumed|recovery)' "$DEMO_DIR/train.log" || true
grep -E '^summary' "$DEMO_DIR/train.log" | tail -1
echo "== resuming job demo with 1 rank instead of 2 (exact resharding) for 5 more steps"
"$BIN/gradsnap-train" --model "$MODEL" --seq 64 --batch 8 --steps $((STEPS + 5)) --nproc 1 \
  --storage "$ADDR" --job demo --resume latest | grep -E '^(resumed|step|summary)'
echo "demo done: files in $DEMO_DIR"
