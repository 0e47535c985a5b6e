#!/usr/bin/env bash
# The peer suite (docs/performance.md): gradsnap against torch.save, torch.distributed.checkpoint
# (save, async_save, load with another world size), torchsnapshot and the PyTorch trainer, in
# one run. Uses the shared venv /opt/gradsnap-venv (GRADSNAP_VENV), making it with
# scripts/torch-venv.sh only when it cannot import torch; then pip-installs torchsnapshot and
# matplotlib into it when missing (a failed install skips that peer / the plots, with the
# reason printed). Needs build/bin/gradsnap-server, build/bin/gradsnap-train and build/python
# (BUILD_DIR, default build). Root is needed to drop the page cache for the cold loads.
#
#   benchmarks/peers/run.sh [--quick] [peers.py flags...]
#
# Arguments go to benchmarks/peers/peers.py (--sizes, --reps, --sections, ...; see its --help).
# The JSON lines go to stdout and to $PEERS_OUT (default BUILD_DIR/peers/peers.jsonl); without
# --quick the plots are made from them into BUILD_DIR/peers/ (benchmarks/peers/plot.py).
# PEERS_MAKE_VENV=0 (the ctest): make and install nothing; without a venv that imports torch,
# print why and exit 77 (ctest: skipped).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VENV=${GRADSNAP_VENV:-/opt/gradsnap-venv}
BUILD=${BUILD_DIR:-$ROOT/build}
OUTFILE=${PEERS_OUT:-$BUILD/peers/peers.jsonl}
MAKE=${PEERS_MAKE_VENV:-1}
PY=$VENV/bin/python

if ! "$PY" -c "import torch, numpy" >/dev/null 2>&1; then
  if [ "$MAKE" = 0 ]; then
    echo "peers: SKIPPED: $VENV cannot import torch and numpy (make it: scripts/torch-venv.sh)"
    exit 77
  fi
  "$ROOT/scripts/torch-venv.sh" || { echo "peers: SKIPPED: no venv could be made at $VENV"; exit 77; }
fi
# A package the suite can do without: installed when missing, else the reason is printed.
optional() {  # MODULE PIP_NAME WHAT
  "$PY" -c "import $1" >/dev/null 2>&1 && return 0
  if [ "$MAKE" = 0 ]; then
    echo "peers: $3 skipped: $1 is not installed in $VENV"
    return 0
  fi
  local log
  log=$(mktemp)
  if ! "$VENV/bin/pip" install -q "$2" >"$log" 2>&1; then
    echo "peers: $3 skipped: pip install $2 failed: $(grep -v '^\s*$' "$log" | tail -1)"
  fi
  rm -f "$log"
}
optional torchsnapshot torchsnapshot "the torchsnapshot peer"
quick=0
for a in "$@"; do [ "$a" = --quick ] && quick=1; done
[ "$quick" = 1 ] || optional matplotlib matplotlib "the plots"
for b in gradsnap-server gradsnap-train; do
  [ -x "$BUILD/bin/$b" ] || { echo "peers: $BUILD/bin/$b is not built (cmake --build build --target $b)" >&2; exit 2; }
done
[ -d "$BUILD/python/gradsnap" ] || { echo "peers: $BUILD/python/gradsnap is not built (cmake --build build --target gradsnap_python)" >&2; exit 2; }
mkdir -p "$(dirname "$OUTFILE")"
echo "peers: load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
PYTHONPATH=$BUILD/python "$PY" "$ROOT/benchmarks/peers/peers.py" --build "$BUILD" --out "$OUTFILE" "$@"
if [ "$quick" = 0 ] && "$PY" -c "import matplotlib" >/dev/null 2>&1; then
  "$PY" "$ROOT/benchmarks/peers/plot.py" "$OUTFILE" "$(dirname "$OUTFILE")"
fi
