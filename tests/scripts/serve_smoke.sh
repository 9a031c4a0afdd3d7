#!/usr/bin/env bash
# CTest: `m3mono smoke` against `m3mono serve` on a synthetic tiny model (CPU reference): each
# distinct prompt alone, then concurrency 8 -> 5 -> 4 -> 2 -> 1 (outputs must equal the
# single-request runs), then a short soak mixing concurrencies and mid-stream hang-ups; the cache
# is small enough (12 blocks of 16 tokens) that admission control and preemption are exercised.
# At the end /metrics must show no block used; SIGTERM must end the server cleanly.
#   bash serve_smoke.sh <m3mono-binary> <source-dir>
set -euo pipefail
bin="${1:?usage: serve_smoke.sh <m3mono-binary> <source-dir>}"
src="${2:?usage: serve_smoke.sh <m3mono-binary> <source-dir>}"
source "$src/tests/scripts/serve_common.bash"
soak="${M3_SMOKE_SOAK_SECONDS:-8}"

tmp="$(mktemp -d)"
trap 'kill_server_on_exit; rm -rf "$tmp"' EXIT
start_server "$bin" "$tmp" --device cpu --threads 2 --cache-blocks 12 --max-num-seqs 8 --max-step-tokens 64

rc=0
# The listen backlog must be widened past cpp-httplib's 5 (serve/server.cpp): a burst of new
# connections overflowed the accept queue and lost requests as connection resets. For a listening
# socket, ss shows the backlog as Send-Q; Linux caps it at net.core.somaxconn.
want=$(( $(cat /proc/sys/net/core/somaxconn) < 1024 ? $(cat /proc/sys/net/core/somaxconn) : 1024 ))
backlog=$(ss -ltnH "sport = :$SERVER_PORT" | awk '{print $3}' | head -n 1)
if [[ "${backlog:-0}" -lt "$want" ]]; then
  echo "FAIL: listen backlog of port $SERVER_PORT is ${backlog:-unknown}, expected >= $want"
  rc=1
fi
"$bin" smoke --url "http://127.0.0.1:$SERVER_PORT" --concurrency 8,5,4,2,1 --requests 16 --distinct 10 \
  --max-tokens 12 --max-prompt 40 --duration "$soak" || rc=$?
curl -s "http://127.0.0.1:$SERVER_PORT/metrics" | grep -E '^m3_(preemptions_total|steps_total|requests_finished_total|http_client_disconnects_total|cache_blocks_used)[ {]' || true
stop_server || rc=1
[[ $rc -eq 0 ]] || { tail -n 40 "$SERVER_LOG"; echo "FAIL"; exit 1; }
echo "PASS"
