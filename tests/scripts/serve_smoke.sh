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
"$bin" smoke --url "http://127.0.0.1:$SERVER_PORT" --concurrency 8,5,4,2,1 --requests 16 --distinct 10 \
  --max-tokens 12 --max-prompt 40 --duration "$soak" || rc=$?
curl -s "http://127.0.0.1:$SERVER_PORT/metrics" | grep -E '^m3_(preemptions_total|steps_total|requests_finished_total|http_client_disconnects_total|cache_blocks_used)[ {]' || true
stop_server || rc=1
[[ $rc -eq 0 ]] || { tail -n 40 "$SERVER_LOG"; echo "FAIL"; exit 1; }
echo "PASS"
