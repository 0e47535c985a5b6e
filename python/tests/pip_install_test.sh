#!/usr/bin/env bash
# ctest python_pip.InstallRoundTrip: `pip install ./python` (docs/python.md, "Installing") into a
# throwaway venv, then the package's embedded and server tests (test_client.EmbeddedTest and
# ServerTest) run by that venv's python from outside the tree, so they import the installed copy.
# Offline: the venv sees the system's site-packages (Debian's python3-setuptools, python3-wheel,
# python3-numpy) and pip runs with --no-build-isolation --no-index. setup.py builds in
# build-pip/ of the tree (kept: later runs rebuild only what changed) with the compiler launcher
# and GRADSNAP_STRICT of the ctest build.
# Usage: pip_install_test.sh PYTHON [cmake args for setup.py...]. Exit 77 (ctest: skipped), with
# the reason on stdout, when PYTHON cannot make a venv with pip (no python3-venv) or lacks
# setuptools >= 61, wheel or numpy (scripts/install-deps.sh installs them).
set -euo pipefail
PY=$1
shift
HERE=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! "$PY" -m venv --system-site-packages "$tmp/venv" >"$tmp/log" 2>&1; then
  echo "SKIPPED: $PY cannot make a venv (python3-venv): $(tail -1 "$tmp/log")"
  exit 77
fi
VPY=$tmp/venv/bin/python
if ! "$VPY" -c "import numpy, setuptools, wheel
assert int(setuptools.__version__.split('.')[0]) >= 61, 'setuptools ' + setuptools.__version__
" >"$tmp/log" 2>&1; then
  echo "SKIPPED: no offline build of the wheel: $(tail -1 "$tmp/log") (python3-setuptools," \
       "python3-wheel, python3-numpy)"
  exit 77
fi
GRADSNAP_PIP_JOBS=${GRADSNAP_PIP_JOBS:-2} GRADSNAP_PIP_CMAKE_ARGS="$*" \
  "$VPY" -m pip install -q --no-build-isolation --no-index --no-cache-dir "$HERE/.."
cd "$HERE"
# Only the tests' helpers on the path: `import gradsnap` must find the venv's copy.
export PYTHONPATH=$HERE
"$VPY" -c "import gradsnap, sys
assert gradsnap.__file__.startswith(sys.prefix), gradsnap.__file__
print('installed:', gradsnap.__file__)"
"$VPY" -m unittest test_client.EmbeddedTest test_client.ServerTest
