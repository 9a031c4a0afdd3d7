#!/usr/bin/env bash
# Where the native decode kernels stall, line by line (ncu source counters; the build has
# -lineinfo): one launch each of the kernels KERNELS (regexes over the work-kernel names) out of
# `m3mono bench --kernels` at one TP-4 rank, M=KMS tokens (default 1; LAUNCHES launches of each,
# default 1). Writes $OUT/<name>.ncu-rep, the warp-state
# summary and the SASS source page (CSV) of each; clocks are left as they are (--clock-control none).
#   scripts/ncu-kernels.sh BIN [KERNELS (default "MoeRoute MmaDecode MoeWide")]
set -u
BIN=${1:?usage: ncu-kernels.sh BIN [KERNELS]}
OUT=${OUT:-/tmp/ncu-kernels}
mkdir -p "$OUT"
[ -d "$BIN/lib" ] && export LD_LIBRARY_PATH="$(cd "$BIN/lib" && pwd):${LD_LIBRARY_PATH:-}"
NCU=${NCU:-/usr/local/cuda/bin/ncu}
for k in ${2:-MoeRoute MmaDecode MoeWide}; do
  timeout 200 "$NCU" --clock-control none --kernel-name-base demangled --kernel-name "regex:$k" --launch-count "${LAUNCHES:-1}" \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section Occupancy \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    -f -o "$OUT/$k" "$BIN/m3mono" bench --kernels --no-steps --kernel-ms "${KMS:-1}" --kernel-tps 4 --no-cublas \
    >"$OUT/$k.log" 2>&1
  echo "ncu $k: rc=$?"
  "$NCU" --import "$OUT/$k.ncu-rep" --print-summary none --page details >"$OUT/$k.details.txt" 2>&1
  "$NCU" --import "$OUT/$k.ncu-rep" --page source --print-source sass --csv >"$OUT/$k.sass.csv" 2>&1
  grep -E "Duration|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|DRAM Throughput|Issue Slots|Memory Throughput" \
    "$OUT/$k.details.txt" | head -12
done
