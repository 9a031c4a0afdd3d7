#!/usr/bin/env bash
# Device call: the same decode bench for an older m3mono (.gpubin/base: a full pack, or m3mono.xz
# alone, from an earlier build) and a new gpubin (.gpubin/NEW, scripts/gpubin.sh pack), interleaved
# twice on one machine so that the ratio is measured in one run. Full logs under $OUT; a table of
# medians last.
# Usage (on the device): scripts/ab-bench.sh NEW [extra --paths entry, e.g. mono:early=0]
# Environment: MORE="x y" more binaries (.gpubin/x, as base; run with NEW's libraries) between
# base and NEW in each round; LAYERS (default 60), BATCH (default 1,2,4).
set -euo pipefail
NEW=${1:?usage: scripts/ab-bench.sh NEW [extra path]}
EXTRA=${2:-}
OUT=${OUT:-/tmp/ab-out}
mkdir -p "$OUT"
[ -x ".gpubin/$NEW/m3mono" ] || scripts/gpubin.sh unpack ".gpubin/$NEW" >/dev/null
for b in base ${MORE:-}; do  # a full pack (scripts/gpubin.sh pack) or m3mono.xz alone
  [ -x ".gpubin/$b/m3mono" ] || scripts/gpubin.sh unpack ".gpubin/$b" >/dev/null
done
export LD_LIBRARY_PATH=$PWD/.gpubin/$NEW/lib
rows=()
for r in 1 2; do
  for b in base ${MORE:-} "$NEW"; do
    log=$OUT/bench.$b.$r.log
    ".gpubin/$b/m3mono" bench --tp-shard 4 --layers "${LAYERS:-60}" --context 8K --batch "${BATCH:-1,2,4}" \
      --paths "native,mono${EXTRA:+,$EXTRA}" >"$log" 2>&1 || { echo "bench of $b failed:"; tail -5 "$log"; exit 1; }
    while read -r line; do rows+=("$r $b $line"); done < <(grep -E "^decode" "$log" | grep -v stream | awk '{print $2, $4, $5}')
  done
done
echo "run binary batch path median_us"
printf '%s\n' "${rows[@]}"
