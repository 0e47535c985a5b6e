# A gradsnap-server in the background for the check scripts (source it; bash).
#   server_start LOG BINARY ARGS...  starts BINARY ARGS... with stdout and stderr in LOG and waits
#                                    up to 60 s for its ready line; sets server_pid and
#                                    server_address (HOST:PORT). Returns 1, LOG on stderr, when the
#                                    server exited or did not get ready.
#   server_stop                      SIGTERM, then waits: the server's exit status.
#   server_cleanup                   for an EXIT trap: stops a server still running.
#   make_work_dir                    work=$(mktemp -d), removed at exit after server_cleanup.
server_pid=
server_address=

server_start() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  server_pid=$!
  server_address=
  for _ in $(seq 600); do
    server_address=$(sed -n 's/^gradsnap-server listening on \([^ ]*\).*/\1/p' "$log")
    if [ -n "$server_address" ] || ! kill -0 "$server_pid" 2>/dev/null; then break; fi
    sleep 0.1
  done
  if [ -z "$server_address" ]; then
    cat "$log" >&2
    return 1
  fi
}

server_stop() {
  local pid=$server_pid status=0
  server_pid=
  kill -TERM "$pid"
  wait "$pid" || status=$?
  return "$status"
}

server_cleanup() {
  if [ -n "$server_pid" ]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" || true
    server_pid=
  fi
}

make_work_dir() {
  work=$(mktemp -d)
  trap 'server_cleanup; rm -rf "$work"' EXIT
}
