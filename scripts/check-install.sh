#!/usr/bin/env bash
# Installs a built tree into a temporary prefix, builds examples/ against the installed package
# twice (CMake find_package(gradsnap), then pkg-config gradsnap) and runs both programs against
# a fresh embedded data directory, then the first one against the installed gradsnap-server on
# 127.0.0.1, then a save and restore through the installed Python package (/usr/bin/python3).
# Nothing of the source tree is on the examples' include path.
# Usage: bash scripts/check-install.sh [BUILD_DIR]   (default: $BUILD_DIR or build)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-${BUILD_DIR:-build}}
source scripts/server-process.sh
make_work_dir
prefix=$work/prefix

cmake --install "$build_dir" --prefix "$prefix" >/dev/null
for h in client.h clock.h tls.h types.h dtype.h digest_algo.h; do
  test -f "$prefix/include/gradsnap/$h" || { echo "check-install: $h not installed" >&2; exit 1; }
done

# CMake consumer.
cmake -S examples -B "$work/cmake-build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake-build" >/dev/null
"$work/cmake-build/save_restore" "$work/data-cmake"

# pkg-config consumer.
pc=$(find "$prefix" -name gradsnap.pc)
libdir=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --variable=libdir gradsnap)
# shellcheck disable=SC2046
c++ -std=c++17 examples/save_restore.cc -o "$work/save_restore_pc" \
  $(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs gradsnap)
LD_LIBRARY_PATH=$libdir "$work/save_restore_pc" "$work/data-pc"
# Remote back end: the installed server on a free port.
server_start "$work/server.log" "$prefix/bin/gradsnap-server" --data-dir "$work/server-data" \
  --listen 127.0.0.1:0 || { echo "check-install: gradsnap-server did not start" >&2; exit 1; }
"$work/cmake-build/save_restore" --server "$server_address"
# The Python package, from the prefix alone (its module finds libgradsnap.so by its RPATH).
pydir=$(find "$prefix" -type d -name gradsnap -path '*-packages/*')
PYTHONPATH=$(dirname "$pydir") /usr/bin/python3 -c '
import sys, numpy as np, gradsnap
assert gradsnap.__file__.startswith(sys.argv[2]), gradsnap.__file__
with gradsnap.connect(servers=sys.argv[1]) as c:
    c.save("py", 1, {"a": np.arange(10, dtype=np.float32)})
    assert c.restore("py", "latest")["a"].tolist() == list(range(10))
' "$server_address" "$prefix"
server_stop
echo "check-install: installed headers, library, CMake package, pkg-config file, binaries and" \
  "Python package work"
