#!/usr/bin/env bash
# Makes the shared PyTorch venv the torch-labelled tests and benchmarks/torch_peer use, at the
# fixed path /opt/gradsnap-venv (override: GRADSNAP_VENV), when it is missing; reuses it when its
# python imports torch and numpy. pip installs the CPU build of torch from download.pytorch.org
# and numpy from PyPI. Exit 0: the venv is ready; else one line on stderr saying why not (no
# network, no space, ...), exit 1. scripts/test.sh runs it before ctest; where it fails, the
# torch tests are skipped with that reason (python/tests/run_torch_tests.sh).
set -euo pipefail
VENV=${GRADSNAP_VENV:-/opt/gradsnap-venv}
if "$VENV/bin/python" -c "import torch, numpy" >/dev/null 2>&1; then
  echo "torch-venv: $VENV ready"
  exit 0
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "torch-venv: making $VENV (pip install torch numpy)"
if ! { python3 -m venv "$VENV" &&
       "$VENV/bin/pip" install -q --index-url https://download.pytorch.org/whl/cpu torch &&
       "$VENV/bin/pip" install -q numpy; } >"$log" 2>&1; then
  echo "torch-venv: cannot make $VENV: $(grep -v '^\s*$' "$log" | tail -1)" >&2
  exit 1
fi
echo "torch-venv: $VENV ready"
