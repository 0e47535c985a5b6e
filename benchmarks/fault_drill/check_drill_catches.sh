#!/bin/bash
# Shows that the fault drill can fail: for each defect kept as a patch under
# benchmarks/fault_drill/planted/ (each puts back a hole whose fix landed), builds gradsnap-server
# with the patch applied in a temporary worktree of HEAD, runs this build's fault_drill against
# it (--server_bin) and requires `fault_drill --scenario storage --check` to exit non-zero; the
# unpatched server must pass the same drill first. Not run in CI (docs/build.md, "Fault drill").
#
# Usage: benchmarks/fault_drill/check_drill_catches.sh [BUILD_DIR]   (default: build)
# Exit status: 0 when the clean server passes and every planted defect is caught, else 1.
set -euo pipefail

repo=$(git rev-parse --show-toplevel)
build=$(realpath "${1:-$repo/build}")
planted_dir="$repo/benchmarks/fault_drill/planted"
drill_args=(--scenario storage --rounds 1 --shard_bytes 1048576 --check)
tree=$(mktemp -d "$repo/../drill-catches.XXXXXX")  # under the same root: ccache's base_dir
cleanup() {
  git -C "$repo" worktree remove --force "$tree/src" >/dev/null 2>&1 || true
  rm -rf "$tree"
}
trap cleanup EXIT

cmake --build "$build" --target fault_drill gradsnap-server -j2 >/dev/null
git -C "$repo" worktree add --detach "$tree/src" HEAD >/dev/null 2>&1
cmake -S "$tree/src" -B "$tree/build" -DCMAKE_BUILD_TYPE=Release -DGRADSNAP_STRICT=ON \
  -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
  -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache >/dev/null

# Runs the drill against the server built in the worktree; prints its verdict, returns its status.
drill() {
  local out rc=0
  out=$("$build/bin/fault_drill" "${drill_args[@]}" --server_bin "$(server_bin)" 2>&1) || rc=$?
  echo "$out" | grep -E '^fault_drill: ' || true
  return $rc
}
server_bin() { find "$tree/build" -name gradsnap-server -type f -perm -u+x | head -1; }

failed=0
cmake --build "$tree/build" --target gradsnap-server -j2 >/dev/null
if drill; then
  echo "clean server: drill passes"
else
  echo "clean server: drill FAILS; no defect can be told apart" >&2
  exit 1
fi
for patch in "$planted_dir"/*.patch; do
  name=$(basename "$patch" .patch)
  git -C "$tree/src" checkout -q -- .
  git -C "$tree/src" apply "$patch"
  cmake --build "$tree/build" --target gradsnap-server -j2 >/dev/null
  if drill; then
    echo "planted $name: NOT caught (the drill passed)" >&2
    failed=1
  else
    echo "planted $name: caught (fault_drill exited non-zero)"
  fi
done
exit $failed
