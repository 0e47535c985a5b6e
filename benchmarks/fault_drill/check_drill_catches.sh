#!/bin/bash
# Shows that the fault drill can fail: for each defect kept as a patch under
# benchmarks/fault_drill/planted/ (each puts back a hole whose fix landed: in the server, or in
# the client library that the drill itself links, as gc over several nodes), builds
# gradsnap-server and fault_drill with the patch applied in a temporary worktree of HEAD, runs
# that fault_drill against that server and requires `fault_drill --scenario storage --check` to
# exit non-zero; the unpatched build must pass the same drill first. The patches touch product
# code only, never the drill. Not run in CI (docs/build.md, "Fault drill").
#
# Usage: benchmarks/fault_drill/check_drill_catches.sh
# Exit status: 0 when the clean server passes and every planted defect is caught, else 1.
set -euo pipefail

repo=$(git rev-parse --show-toplevel)
planted_dir="$repo/benchmarks/fault_drill/planted"
drill_args=(--scenario storage --rounds 1 --shard_bytes 1048576 --check)
tree=$(mktemp -d "$repo/../drill-catches.XXXXXX")  # under the same root: ccache's base_dir
cleanup() {
  git -C "$repo" worktree remove --force "$tree/src" >/dev/null 2>&1 || true
  rm -rf "$tree"
}
trap cleanup EXIT

git -C "$repo" worktree add --detach "$tree/src" HEAD >/dev/null 2>&1
cmake -S "$tree/src" -B "$tree/build" -DCMAKE_BUILD_TYPE=Release -DGRADSNAP_STRICT=ON \
  -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
  -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache >/dev/null

# Runs the drill against the server built in the worktree; prints its verdict, returns its status.
drill() {
  local out rc=0
  out=$("$(built fault_drill)" "${drill_args[@]}" --server_bin "$(built gradsnap-server)" 2>&1) ||
    rc=$?
  echo "$out" | grep -E '^fault_drill: ' || true
  return $rc
}
built() { find "$tree/build" -name "$1" -type f -perm -u+x | head -1; }

failed=0
cmake --build "$tree/build" --target gradsnap-server fault_drill -j2 >/dev/null
if drill; then
  echo "clean build: drill passes"
else
  echo "clean build: drill FAILS; no defect can be told apart" >&2
  exit 1
fi
for patch in "$planted_dir"/*.patch; do
  name=$(basename "$patch" .patch)
  git -C "$tree/src" checkout -q -- .
  git -C "$tree/src" apply "$patch"
  cmake --build "$tree/build" --target gradsnap-server fault_drill -j2 >/dev/null
  if drill; then
    echo "planted $name: NOT caught (the drill passed)" >&2
    failed=1
  else
    echo "planted $name: caught (fault_drill exited non-zero)"
  fi
done
exit $failed
