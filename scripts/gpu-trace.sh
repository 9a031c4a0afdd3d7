#!/usr/bin/env bash
# One device call for where a mono step's time goes, a new build beside an old one:
#   scripts/gpu-trace.sh NEW [OLD]
# `m3mono bench` (one TP-4 rank, LAYERS (60) layers, 8K, batches BATCH (1), native and mono) of
# .gpubin/NEW and of .gpubin/OLD (a full pack, or its bin.tar.xz alone: run with NEW's lib/), each
# with --trace: mono's per-op-code summary (wait, run, span, hop) and native's spans per stage, side
# by side. Logs and the trace CSVs under $OUT (default /tmp/gpu-trace, tarred into traces.tgz).
set -u
cd "$(dirname "$0")/.."
NEW=${1:?usage: gpu-trace.sh NEW [OLD]}
OLD=${2:-}
OUT=${OUT:-/tmp/gpu-trace}
mkdir -p "$OUT/csv"
for b in $NEW $OLD; do [ -x ".gpubin/$b/m3mono" ] || scripts/gpubin.sh unpack ".gpubin/$b" >/dev/null; done
export LD_LIBRARY_PATH="$PWD/.gpubin/$NEW/lib:${LD_LIBRARY_PATH:-}"
for b in $NEW $OLD; do
  timeout "${TRACE_S:-150}" ".gpubin/$b/m3mono" bench --tp-shard 4 --layers "${LAYERS:-60}" --context 8K \
    --batch "${BATCH:-1}" --paths native,mono --trace "$OUT/csv/$b" --commit "$b" >"$OUT/bench-$b.txt" 2>&1 ||
    echo "bench $b failed (exit $?)" >>"$OUT/bench-$b.txt"
done
(cd "$OUT" && tar czf traces.tgz csv && rm -rf csv)
for b in $NEW $OLD; do echo "== $b"; grep -E "^decode|mono trace|^  |failed" "$OUT/bench-$b.txt" | head -60; done
