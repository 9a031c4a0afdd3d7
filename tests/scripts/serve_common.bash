# Helpers shared by serve_*.sh (sourced, not a test itself: CTest runs only *.sh here).
#   start_server <m3mono> <workdir> [serve flags...]  -> sets SERVER_PID, SERVER_PORT, SERVER_LOG
#   stop_server                                       -> SIGTERM, waits, checks a clean exit
# Needs `set -euo pipefail` in the caller; make-tiny writes the model to <workdir>/model.

start_server() {
  local bin="$1" dir="$2"
  shift 2
  # MAKE_TINY_EXTRA: more make-tiny flags (e.g. --eagle3)
  # shellcheck disable=SC2086
  "$bin" make-tiny --out "$dir/model" ${MAKE_TINY_EXTRA:-} >"$dir/make-tiny.log" 2>&1 || { cat "$dir/make-tiny.log"; return 1; }
  SERVER_LOG="$dir/serve.log"
  # created here: the background job's redirect may open it only after the loop below first reads
  # it (seen under load: sed found no file and `set -e` ended the test)
  : >"$SERVER_LOG"
  "$bin" serve --model "$dir/model" --served-model-name tiny --port 0 "$@" >"$SERVER_LOG" 2>&1 &
  SERVER_PID=$!
  SERVER_PORT=""
  for _ in $(seq 1 600); do  # up to 60 s to load and bind
    SERVER_PORT=$(sed -n 's|.*listening on http://[^:]*:\([0-9]*\).*|\1|p' "$SERVER_LOG" | head -n 1)
    [[ -n "$SERVER_PORT" ]] && break
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      cat "$SERVER_LOG"
      echo "FAIL: m3mono serve exited before listening"
      return 1
    fi
    sleep 0.1
  done
  [[ -n "$SERVER_PORT" ]] || { cat "$SERVER_LOG"; echo "FAIL: m3mono serve did not start listening"; return 1; }
  echo "server pid $SERVER_PID on port $SERVER_PORT"
}

stop_server() {
  [[ -n "${SERVER_PID:-}" ]] || return 0
  local rc=0
  kill -TERM "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" || rc=$?
  SERVER_PID=""
  tail -n 3 "$SERVER_LOG"
  if [[ $rc -ne 0 ]]; then
    echo "FAIL: m3mono serve exited with status $rc after SIGTERM"
    return 1
  fi
  grep -q "stopped cleanly" "$SERVER_LOG" || { echo "FAIL: no clean-shutdown line in the server log"; return 1; }
}

# Kills the server if the script dies early (never leaves it running).
kill_server_on_exit() {
  if [[ -n "${SERVER_PID:-}" ]]; then
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
}
