#!/usr/bin/env bash
# ctest's entry to test_torch.py (label torch): runs it with the shared venv's python
# (scripts/torch-venv.sh makes it); exit 77, which ctest reports as skipped, with the reason on
# stdout, when that venv has no torch. Usage: run_torch_tests.sh [unittest names...]
set -uo pipefail
VENV=${GRADSNAP_VENV:-/opt/gradsnap-venv}
if ! err=$("$VENV/bin/python" -c "import torch, numpy, torch.distributed.checkpoint" 2>&1); then
  echo "SKIPPED: no PyTorch venv at $VENV (scripts/torch-venv.sh makes it): $(tail -1 <<<"$err")"
  exit 77
fi
cd "$(dirname "$0")"
exec "$VENV/bin/python" -m unittest -v "${@:-test_torch}"
