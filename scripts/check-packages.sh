#!/usr/bin/env bash
# Builds the Debian packages of a built tree (cpack -G DEB, cmake/package.cmake) into a
# temporary directory and checks them: each package's file list (dpkg-deb -c) and control data
# (dpkg-deb -I: name, dependencies, conffiles, maintainer scripts), the systemd unit's user and
# hardening options, `systemd-analyze verify` of the unit (any warning fails; skipped with a
# reason, and exit 77 (ctest: Skipped) once everything else passed, where systemd-analyze is
# missing), and the packaged gradsnap-server started with the
# packaged /etc/gradsnap/server.conf (data dir and ports overridden on its command line).
# Nothing is installed on this machine.
# Usage: bash scripts/check-packages.sh [BUILD_DIR]   (default: $BUILD_DIR or build)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=$(cd "${1:-${BUILD_DIR:-build}}" && pwd)
source scripts/server-process.sh
make_work_dir
fail() { echo "check-packages: $*" >&2; exit 1; }

for tool in cpack dpkg-deb dpkg-shlibdeps file; do
  command -v "$tool" >/dev/null || fail "$tool not found (bash scripts/install-deps.sh)"
done
skipped=
(cd "$build_dir" && cpack -G DEB -B "$work/out" >"$work/cpack.log" 2>&1) ||
  { cat "$work/cpack.log" >&2; fail "cpack -G DEB failed"; }
server_deb=$(ls "$work"/out/gradsnap-server_*.deb 2>/dev/null) || fail "no gradsnap-server .deb"
client_deb=$(ls "$work"/out/gradsnap_*.deb 2>/dev/null) || fail "no gradsnap .deb"

# has FILE_LIST PATH...: every PATH is in the package's file list.
has() {
  local list=$1; shift
  for p in "$@"; do
    grep -q -E "[[:space:]]\\./${p#/}( |$)" "$list" || fail "$(basename "$list" .list) lacks $p"
  done
}
# lacks FILE_LIST PATTERN...: no path of the package starts with a PATTERN (extended regex).
lacks() {
  local list=$1; shift
  for p in "$@"; do
    if grep -q -E "[[:space:]]\\./${p#/}" "$list"; then fail "$(basename "$list" .list) holds $p"; fi
  done
}
dpkg-deb -c "$server_deb" >"$work/server.list"
dpkg-deb -c "$client_deb" >"$work/client.list"
has "$work/server.list" usr/bin/gradsnap-server usr/lib/systemd/system/gradsnap-server.service \
  etc/gradsnap/server.conf usr/share/doc/gradsnap-server/deploy.md
lacks "$work/server.list" 'usr/bin/gradsnap(-train)?$' usr/include usr/lib/libgradsnap
has "$work/client.list" usr/bin/gradsnap usr/bin/gradsnap-train usr/lib/libgradsnap.so \
  usr/include/gradsnap/client.h usr/include/gradsnap/types.h \
  usr/lib/cmake/gradsnap/gradsnapConfig.cmake usr/lib/pkgconfig/gradsnap.pc
lacks "$work/client.list" usr/bin/gradsnap-server etc/ lib/systemd

field() { dpkg-deb -f "$1" "$2"; }
[ "$(field "$server_deb" Package)" = gradsnap-server ] || fail "server package name"
[ "$(field "$client_deb" Package)" = gradsnap ] || fail "client package name"
field "$server_deb" Depends | grep -q -w adduser || fail "gradsnap-server does not depend on adduser"
field "$server_deb" Depends | grep -q libgrpc || fail "gradsnap-server lacks its shared-library dependencies"
field "$client_deb" Depends | grep -q librocksdb || fail "gradsnap lacks its shared-library dependencies"
dpkg-deb -I "$client_deb" postinst | grep -q ldconfig || fail "gradsnap's postinst does not run ldconfig"
dpkg-deb -I "$server_deb" >"$work/server.info"
for script in conffiles postinst prerm postrm; do
  grep -q -E "^ +[0-9]+ bytes, +[0-9]+ lines +\*? *$script( |$)" "$work/server.info" ||
    fail "gradsnap-server has no $script"
done
mkdir "$work/control"
dpkg-deb -e "$server_deb" "$work/control"
[ "$(cat "$work/control/conffiles")" = /etc/gradsnap/server.conf ] ||
  fail "conffiles is not /etc/gradsnap/server.conf: $(cat "$work/control/conffiles")"
grep -q 'adduser --system --group .*gradsnap' "$work/control/postinst" ||
  fail "postinst does not create the system user gradsnap"
grep -q 'chown gradsnap:gradsnap /var/lib/gradsnap' "$work/control/postinst" ||
  fail "postinst does not give /var/lib/gradsnap to gradsnap"
for script in postinst prerm postrm; do
  sh -n "$work/control/$script" || fail "$script is not valid sh"
done

root=$work/root
dpkg-deb -x "$server_deb" "$root"
unit=$root/usr/lib/systemd/system/gradsnap-server.service
for line in 'User=gradsnap' 'Group=gradsnap' \
    'ExecStart=/usr/bin/gradsnap-server --config /etc/gradsnap/server.conf' \
    'ProtectSystem=strict' 'ReadWritePaths=/var/lib/gradsnap' 'StateDirectory=gradsnap' \
    'NoNewPrivileges=yes' 'PrivateTmp=yes' 'PrivateDevices=yes' 'ProtectHome=yes' \
    'CapabilityBoundingSet=' 'RestartPreventExitStatus=2' 'WantedBy=multi-user.target'; do
  grep -q -x -F "$line" "$unit" || fail "the unit lacks the line $line"
done
analyze=${SYSTEMD_ANALYZE:-systemd-analyze}  # another one for a test of this script
if command -v "$analyze" >/dev/null; then
  # verify needs ExecStart to exist: the unit is checked with the extracted binary and conf.
  mkdir "$work/unit"
  sed -e "s|/usr/bin/gradsnap-server|$root/usr/bin/gradsnap-server|" \
      -e "s|/etc/gradsnap/server.conf|$root/etc/gradsnap/server.conf|" \
      "$unit" >"$work/unit/gradsnap-server.service"
  # It exits 0 on unknown keys and bad values, with a warning: any output fails.
  if ! "$analyze" verify "$work/unit/gradsnap-server.service" >"$work/verify.log" 2>&1 ||
     [ -s "$work/verify.log" ]; then
    cat "$work/verify.log" >&2
    fail "systemd-analyze verify found problems in the unit"
  fi
  echo "check-packages: systemd-analyze verify: the unit is clean"
else
  skipped="systemd-analyze verify of the unit: systemd-analyze is not installed (apt-get install systemd)"
fi

# The packaged binary with the packaged config: every key of server.conf is a flag it takes.
server_start "$work/server.log" "$root/usr/bin/gradsnap-server" \
  --config "$root/etc/gradsnap/server.conf" --data-dir "$work/data" --listen 127.0.0.1:0 \
  --metrics-listen 127.0.0.1:0 ||
  fail "the packaged server did not start with the packaged config"
server_stop || fail "the packaged server did not exit 0 on SIGTERM"
echo "check-packages: $(basename "$server_deb") and $(basename "$client_deb") built and checked"
if [ -n "$skipped" ]; then
  echo "check-packages: SKIPPED $skipped"
  exit 77
fi
