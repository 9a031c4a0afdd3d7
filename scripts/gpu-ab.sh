#!/usr/bin/env bash
# One device call for a kernel change behind an environment switch (e.g. M3_MMA_STREAM): the same
# binary with the switch at B and at A, side by side.
#   scripts/gpu-ab.sh BIN VAR [A (default 0)] [B (default 1)]
#   1. GPU tests of BIN (TESTS, default GpuMmaLinear.*:GpuMono.*:GpuLayerRange.*) with the default
#      environment;
#   2. GpuBitsDump with VAR=A and VAR=B: the logits of a fixed scenario must be bitwise identical;
#   3. `m3mono bench --kernels` (tp4, M = KMS, default 1,4) with VAR=B then A;
#   4. `m3mono bench --tp-shard 4 --layers 60 --context CONTEXTS --batch BATCHES --paths PATHS` with
#      VAR=B (traced) then A (defaults 8K, 1,4, native,mono).
# BIN as scripts/gpubin.sh leaves it (unpacked here first when it holds *.xz). Logs under $OUT
# (default /tmp/gpu-ab; seven files, the traces tarred); a table prints last. Exit 1 when a test or
# the bits fail.
set -u
cd "$(dirname "$0")/.."
BIN=${1:?usage: gpu-ab.sh BIN VAR [A] [B]}
VAR=${2:?usage: gpu-ab.sh BIN VAR [A] [B]}
A=${3:-0}
B=${4:-1}
OUT=${OUT:-/tmp/gpu-ab}
mkdir -p "$OUT"
ls "$BIN"/*.xz >/dev/null 2>&1 && scripts/gpubin.sh unpack "$BIN"
export M3_TEST_DATA="$PWD/tests/data"
[ -d "$BIN/lib" ] && export LD_LIBRARY_PATH="$(cd "$BIN/lib" && pwd):${LD_LIBRARY_PATH:-}"
table="$OUT/table.txt"
: >"$table"
rc=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$table" 2>&1
t0=$(date +%s)
timeout 300 "$BIN/m3_tests_gpu" --gtest_filter="${TESTS:-GpuMmaLinear.*:GpuMono.*:GpuLayerRange.*}" --gtest_color=no \
  >"$OUT/tests.log" 2>&1 || rc=1
echo "tests ($(($(date +%s) - t0)) s): $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/tests.log" | tr '\n' ' ')" >>"$table"
grep -E '^\[  FAILED  \] Gpu' "$OUT/tests.log" >>"$table"
for v in "$A" "$B"; do
  env "$VAR=$v" M3_BITS_DUMP="$OUT/bits-$v.bin" timeout 200 "$BIN/m3_tests_gpu" --gtest_filter='GpuBitsDump.*' \
    --gtest_color=no >>"$OUT/bits.log" 2>&1 || rc=1
done
if cmp -s "$OUT/bits-$A.bin" "$OUT/bits-$B.bin"; then
  echo "bits: $VAR=$A and $VAR=$B identical ($(stat -c %s "$OUT/bits-$B.bin") bytes)" >>"$table"
else
  echo "bits: $VAR=$A and $VAR=$B DIFFER" >>"$table"
  rc=1
fi
rm -f "$OUT"/bits-*.bin
for v in "$B" "$A"; do
  env "$VAR=$v" timeout 200 "$BIN/m3mono" bench --kernels --no-steps --kernel-ms "${KMS:-1,4}" --kernel-tps 4 \
    --no-cublas >"$OUT/kernels-$v.txt" 2>&1 || echo "kernels $VAR=$v failed" >>"$table"
done
for v in "$B" "$A"; do
  trace=()
  [ "$v" = "$B" ] && trace=(--trace "$OUT/trace/t")
  mkdir -p "$OUT/trace"
  env "$VAR=$v" timeout 300 "$BIN/m3mono" bench --tp-shard 4 --layers 60 --context "${CONTEXTS:-8K}" \
    --batch "${BATCHES:-1,4}" --paths "${PATHS:-native,mono}" "${trace[@]}" >"$OUT/bench-$v.txt" 2>&1 ||
    echo "bench $VAR=$v failed" >>"$table"
  grep -E "^decode" "$OUT/bench-$v.txt" | sed "s/^/$VAR=$v: /" >>"$table"
done
(cd "$OUT" && tar czf traces.tgz trace && rm -rf trace)
echo "kernels ($VAR=$B | $VAR=$A):" >>"$table"
paste -d'|' <(grep -E "^(fp8_mma|moe)" "$OUT/kernels-$B.txt" | head -30) \
  <(grep -E "^(fp8_mma|moe)" "$OUT/kernels-$A.txt" | cut -c50- | head -30) >>"$table"
cat "$table"
exit $rc
