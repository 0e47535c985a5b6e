#!/bin/sh
# gradsnap-train against PyTorch on the CPU (same GPT, batch, sequence and threads), through
# build/bin/trainer_throughput. Uses the shared venv /opt/gradsnap-venv, making it when missing
# (python3 -m venv, then pip install torch from PyPI); extra arguments go to trainer_throughput.
#   benchmarks/trainer_throughput/vs_torch.sh [--rounds 3] [--steps 10] [--threads 1,2]
set -eu
VENV=/opt/gradsnap-venv
BIN=${BUILD_DIR:-build}/bin/trainer_throughput
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet torch
fi
[ -x "$BIN" ] || { echo "vs_torch.sh: $BIN missing: cmake --build build --target trainer_throughput" >&2; exit 2; }
exec "$BIN" --python "$VENV/bin/python" "$@"
