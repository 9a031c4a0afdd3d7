#!/usr/bin/env bash
# CTest: `m3mono serve --speculative ngram`, then `--speculative eagle3` (a synthetic draft from
# `make-tiny --eagle3`), on a synthetic tiny model (CPU reference) under `m3mono smoke`: each
# distinct prompt alone, then concurrency 8 -> 4 -> 1 and a short soak with hang-ups; every output
# must equal its single-request run (greedy speculation gives the tokens of plain decoding; sampled
# requests decode one token a step), no cache block may stay used, and /metrics must show verify
# rows (and, for n-gram drafts, kept drafts: the random EAGLE3 draft rarely guesses right).
#   bash serve_speculative.sh <m3mono-binary> <source-dir>
set -euo pipefail
bin="${1:?usage: serve_speculative.sh <m3mono-binary> <source-dir>}"
src="${2:?usage: serve_speculative.sh <m3mono-binary> <source-dir>}"
source "$src/tests/scripts/serve_common.bash"
soak="${M3_SMOKE_SOAK_SECONDS:-5}"

tmp="$(mktemp -d)"
trap 'kill_server_on_exit; rm -rf "$tmp"' EXIT
start_server "$bin" "$tmp" --device cpu --threads 2 --cache-blocks 16 --max-num-seqs 8 --max-step-tokens 64 \
  --speculative ngram --num-draft-tokens 3

rc=0
"$bin" smoke --url "http://127.0.0.1:$SERVER_PORT" --concurrency 8,4,1 --requests 12 --distinct 8 \
  --max-tokens 24 --max-prompt 40 --duration "$soak" || rc=$?
metrics="$(curl -s "http://127.0.0.1:$SERVER_PORT/metrics")"
echo "$metrics" | grep -E '^m3_(spec_[a-z_]+_total|cache_blocks_used|preemptions_total)[ {]' || true
rows=$(echo "$metrics" | sed -n 's/^m3_spec_verify_rows_total \([0-9.e+]*\)$/\1/p')
kept=$(echo "$metrics" | sed -n 's/^m3_spec_accepted_tokens_total \([0-9.e+]*\)$/\1/p')
if ! awk -v r="${rows:-0}" -v k="${kept:-0}" 'BEGIN { exit !(r > 0 && k > 0) }'; then
  echo "FAIL: /metrics shows ${rows:-no} verify rows and ${kept:-no} kept drafts (expected both > 0)"
  rc=1
fi
stop_server || rc=1
[[ $rc -eq 0 ]] || { tail -n 40 "$SERVER_LOG"; echo "FAIL"; exit 1; }

mkdir -p "$tmp/e3"
MAKE_TINY_EXTRA=--eagle3 start_server "$bin" "$tmp/e3" --device cpu --threads 2 --cache-blocks 16 --max-num-seqs 8 \
  --max-step-tokens 64 --speculative eagle3 --draft-model "$tmp/e3/model/eagle3" --draft-threads 1
"$bin" smoke --url "http://127.0.0.1:$SERVER_PORT" --concurrency 8,4,1 --requests 12 --distinct 8 \
  --max-tokens 24 --max-prompt 40 --duration "$soak" || rc=$?
metrics="$(curl -s "http://127.0.0.1:$SERVER_PORT/metrics")"
echo "$metrics" | grep -E '^m3_(spec_[a-z_]+_total|cache_blocks_used|preemptions_total)[ {]' || true
rows=$(echo "$metrics" | sed -n 's/^m3_spec_verify_rows_total \([0-9.e+]*\)$/\1/p')
if ! awk -v r="${rows:-0}" 'BEGIN { exit !(r > 0) }'; then
  echo "FAIL: eagle3: /metrics shows ${rows:-no} verify rows (expected > 0)"
  rc=1
fi
stop_server || rc=1
[[ $rc -eq 0 ]] || { tail -n 40 "$SERVER_LOG"; echo "FAIL (eagle3)"; exit 1; }
echo "PASS"
