#!/usr/bin/env bash
# Serving soak on the GPU (issue 5): `m3mono serve --device cuda` on the built-in tiny model with a
# small cache (admission control and preemption happen), then `m3mono smoke` from another process:
# each distinct prompt alone, concurrency 8 -> 5 -> 4 -> 2 -> 1 (greedy outputs must equal the
# single-request runs), then a soak of DURATION seconds mixing concurrencies and mid-stream
# hang-ups. At the end /metrics must show no cache block used and SIGTERM must stop the server
# cleanly. From the repository root:
#   scripts/gpu-soak.sh [BIN_DIR] [DURATION]     (defaults: build/release, 120)
# BIN_DIR holds m3mono (and lib/ with shared libraries this machine may lack). Logs go to $OUT
# (default /tmp/gpu-soak). DEVICE=cpu runs the same on the CPU reference. SERVE_FLAGS are added to
# the serve command (e.g. SERVE_FLAGS=--mono: the fused decode path for the steps it takes; the
# script then also requires /metrics to show steps on both paths). Exit status 0 only when every
# check passed.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/release}
DURATION=${2:-120}
OUT=${OUT:-/tmp/gpu-soak}
mkdir -p "$OUT"
[ -d "$BIN/lib" ] && export LD_LIBRARY_PATH="$(cd "$BIN/lib" && pwd):${LD_LIBRARY_PATH:-}"
source tests/scripts/serve_common.bash
tmp="$(mktemp -d)"
trap 'kill_server_on_exit; cp "$tmp"/*.log "$OUT"/ 2>/dev/null || true; rm -rf "$tmp"' EXIT
start_server "$BIN/m3mono" "$tmp" --device "${DEVICE:-cuda}" --cache-blocks 28 --max-num-seqs 8 ${SERVE_FLAGS:-}
rc=0
"$BIN/m3mono" smoke --url "http://127.0.0.1:$SERVER_PORT" --concurrency 8,5,4,2,1 --requests 24 --distinct 16 \
  --max-tokens 24 --max-prompt 120 --duration "$DURATION" 2>&1 | tee "$OUT/smoke.log" || rc=$?
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
curl -s "http://127.0.0.1:$SERVER_PORT/metrics" >"$OUT/metrics.txt" || true
grep -E '^m3_(preemptions_total|steps_total|step_fallbacks_total|requests_finished_total|http_client_disconnects_total|cache_blocks_used)[ {]' \
  "$OUT/metrics.txt" || true
if [[ " ${SERVE_FLAGS:-} " == *" --mono "* ]]; then
  for p in mono native; do
    n=$(sed -n "s/^m3_steps_total{path=\"$p\"} \([0-9.e+]*\)$/\1/p" "$OUT/metrics.txt" | head -1)
    awk -v n="${n:-0}" 'BEGIN { exit !(n > 0) }' || { echo "FAIL: no steps on path $p"; rc=1; }
  done
fi
used=$(sed -n 's/^m3_cache_blocks_used \([0-9.e+]*\)$/\1/p' "$OUT/metrics.txt" | head -1)
[ "${used:-x}" = 0 ] || { echo "FAIL: cache blocks used at the end: ${used:-unknown}"; rc=1; }
stop_server || rc=1
[ $rc -eq 0 ] && echo "PASS" || { tail -n 40 "$SERVER_LOG"; echo "FAIL"; }
exit $rc
