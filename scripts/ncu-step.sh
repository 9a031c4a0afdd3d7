#!/usr/bin/env bash
# Where the small ops of a native decode step stall, line by line: ncu source counters of one
# launch of each op kernel OPS (regexes over the demangled work-kernel names) inside
# `m3mono bench` at one TP-4 rank (LAYERS sparse layers, default 4; 8K; batch BATCH, default 1).
# The LAUNCH-th launch of each (default 3: a later layer of the eager set-up step, its code and
# the metadata already resident) is profiled with the caches left as they are (--cache-control
# none, --clock-control none). scripts/ncu-kernels.sh does the same for `bench --kernels`.
# Writes $OUT/<op>.ncu-rep, the details page and the SASS source page (CSV) of each; prints
# duration, warp cycles per issued instruction and the top stall lines of each.
#   scripts/ncu-step.sh BIN [OPS (default: the attention chain, the router and the routing)]
set -u
BIN=${1:?usage: ncu-step.sh BIN [OPS]}
OUT=${OUT:-/tmp/ncu-step}
mkdir -p "$OUT"
[ -d "$BIN/lib" ] && export LD_LIBRARY_PATH="$(cd "$BIN/lib" && pwd):${LD_LIBRARY_PATH:-}"
NCU=${NCU:-/usr/local/cuda/bin/ncu}
OPS=${2:-"QkNormRopeCacheOp IndexerScoresOp IndexerTopkOp AttentionSplitOp AttentionCombineOp GemvOp MoeRouteOp MoeCombineOp"}
for k in $OPS; do
  timeout 200 "$NCU" --clock-control none --cache-control none --kernel-name-base demangled \
    --kernel-name "regex:$k" --launch-skip "$(( ${LAUNCH:-3} - 1 ))" --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section Occupancy \
    --section LaunchStats -f -o "$OUT/$k" \
    "$BIN/m3mono" bench --tp-shard 4 --layers "${LAYERS:-4}" --context 8K --batch "${BATCH:-1}" --paths native \
    --steps 2 --warmup 0 >"$OUT/$k.log" 2>&1
  echo "ncu $k: rc=$?"
  "$NCU" --import "$OUT/$k.ncu-rep" --print-summary none --page details >"$OUT/$k.details.txt" 2>&1
  "$NCU" --import "$OUT/$k.ncu-rep" --page source --print-source sass --csv >"$OUT/$k.sass.csv" 2>&1
  grep -E "^  [a-z].*(Duration|Warp Cycles Per Issued|Achieved Occupancy|Grid Size|Block Size)" \
    "$OUT/$k.details.txt" | head -6
done
