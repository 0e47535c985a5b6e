#!/usr/bin/env bash
# Makes the shared PyTorch venv the torch-labelled tests and benchmarks/torch_peer use, at the
# fixed path /opt/gradsnap-venv (override: GRADSNAP_VENV), when it is missing; reuses it when its
# python imports torch and numpy. pip installs the CPU build of torch from download.pytorch.org
# (PyPI's torch where that host cannot be reached) and numpy from PyPI. Exit 0: the venv is
# ready; else one line on stderr saying why not (no network, no space, ...), exit 1.
# scripts/test.sh runs it before ctest; where it fails, the torch tests are skipped with that
# reason (python/tests/run_torch_tests.sh). The venv is made by /usr/bin/python3 where it
# exists (the interpreter python/CMakeLists.txt builds the module for, so the venv loads it),
# else by python3 on PATH. Several sessions may run this at once: they take turns on the lock
# file $VENV.lock, and the ones after the first find it ready.
set -euo pipefail
VENV=${GRADSNAP_VENV:-/opt/gradsnap-venv}
ready() { "$VENV/bin/python" -c "import torch, numpy" >/dev/null 2>&1; }
if ready; then
  echo "torch-venv: $VENV ready"
  exit 0
fi
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
if ready; then  # made by another run while this one waited
  echo "torch-venv: $VENV ready"
  exit 0
fi
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "torch-venv: making $VENV with $PY (pip install torch numpy)"
# The CPU build (about 200 MB) from download.pytorch.org where that host answers; else PyPI's
# torch, which brings its CUDA libraries (about 5 GB, once: the venv is reused).
if ! { "$PY" -m venv "$VENV" &&
       { "$VENV/bin/pip" install -q --index-url https://download.pytorch.org/whl/cpu torch ||
         "$VENV/bin/pip" install -q torch; } &&
       "$VENV/bin/pip" install -q numpy; } >"$log" 2>&1; then
  echo "torch-venv: cannot make $VENV: $(grep -v '^\s*$' "$log" | tail -1)" >&2
  exit 1
fi
echo "torch-venv: $VENV ready"
