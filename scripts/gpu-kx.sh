#!/usr/bin/env bash
# Kernel-body variants measured in one device call (the M3_KX switches of kernels/formats.h):
#   1. bits: GpuBitsDump.Write of OLD and NEW with M3_KX unset, compared byte for byte (the changes
#      that must keep every bit);
#   2. correctness of NEW under each KX of KX_TEST: the tensor-core kernel tests against the CPU
#      reference and the mono tests (mono bitwise native) with M3_KX set;
#   3. per-kernel benches of NEW under each KX of KX_KERNELS (tp4 qkv / o, MoE stages, M = 1, 4);
#   4. whole steps (native, mono; b = 1, 4; 60 layers, 8K) of OLD, and of NEW under each KX of
#      KX_STEPS.
#   scripts/gpu-kx.sh OLD_BIN NEW_BIN
# Environment: KX_BITS (default "5 13": variants that must keep the bits), KX_TEST (default "0 1 2 4 8"), KX_KERNELS (default "0 1 2 4 5 8 9 10"), KX_STEPS
# (default "0"). Logs under $OUT (default /tmp/gpu-kx); a table prints last.
set -u
cd "$(dirname "$0")/.."
OLD=${1:?usage: gpu-kx.sh OLD_BIN NEW_BIN}
NEW=${2:?usage: gpu-kx.sh OLD_BIN NEW_BIN}
OUT=${OUT:-/tmp/gpu-kx}
mkdir -p "$OUT"
export M3_TEST_DATA="$PWD/tests/data"
libs() { [ -d "$1/lib" ] && echo "$(cd "$1/lib" && pwd):${LD_LIBRARY_PATH:-}" || echo "${LD_LIBRARY_PATH:-}"; }
table="$OUT/table.txt"
: >"$table"
for side in old new; do
  bin=$OLD; [ $side = new ] && bin=$NEW
  LD_LIBRARY_PATH=$(libs "$bin") M3_BITS_DUMP="$OUT/bits-$side.bin" timeout 300 "$bin/m3_tests_gpu" \
    --gtest_filter=GpuBitsDump.Write >"$OUT/bits-$side.log" 2>&1 || echo "bits $side: test failed" >>"$table"
done
if [ -s "$OUT/bits-old.bin" ] && cmp -s "$OUT/bits-old.bin" "$OUT/bits-new.bin"; then
  echo "bits (KX unset): identical ($(stat -c %s "$OUT/bits-new.bin") bytes)" >>"$table"
else
  echo "bits (KX unset): DIFFER" >>"$table"
fi
export LD_LIBRARY_PATH=$(libs "$NEW")
for kx in ${KX_BITS:-5 13}; do  # variants that must keep the bits too
  M3_KX=$kx M3_BITS_DUMP="$OUT/bits-kx$kx.bin" timeout 300 "$NEW/m3_tests_gpu" --gtest_filter=GpuBitsDump.Write \
    >"$OUT/bits-kx$kx.log" 2>&1
  cmp -s "$OUT/bits-old.bin" "$OUT/bits-kx$kx.bin" && echo "bits KX=$kx: identical to old" >>"$table" ||
    echo "bits KX=$kx: DIFFER from old" >>"$table"
done
for kx in ${KX_TEST:-0 1 2 4 8}; do
  M3_KX=$kx timeout 300 "$NEW/m3_tests_gpu" --gtest_color=no \
    --gtest_filter='GpuMma*:GpuMoe*:GpuMono.*:GpuRouter*:GpuNorm*:GpuLayerRange.*' >"$OUT/tests-kx$kx.log" 2>&1
  echo "tests KX=$kx: rc=$? $(grep -c '^\[       OK \]' "$OUT/tests-kx$kx.log") ok, $(grep -c '^\[  FAILED  \] [A-Za-z]' "$OUT/tests-kx$kx.log") failed" >>"$table"
done
for kx in ${KX_KERNELS:-0 1 2 4 5 8 9 10}; do
  M3_KX=$kx timeout 240 "$NEW/m3mono" bench --kernels --no-steps --kernel-ms 1,4 --kernel-tps 4 --no-cublas \
    >"$OUT/kernels-kx$kx.txt" 2>&1
  echo "== kernels KX=$kx (rc $?)" >>"$table"
  awk '/^kernel +shape/{on=1} on && !/^cuBLASLt/' "$OUT/kernels-kx$kx.txt" | cut -c1-90 | head -30 >>"$table"
done
run_steps() {  # name bin kx
  M3_KX=$3 LD_LIBRARY_PATH=$(libs "$2") timeout 300 "$2/m3mono" bench --tp-shard 4 --layers 60 --context 8K \
    --batch 1,4 --paths native,mono >"$OUT/steps-$1.txt" 2>&1
  echo "== steps $1 (rc $?)" >>"$table"
  grep -E "^decode|bitwise|differ" "$OUT/steps-$1.txt" | head -12 >>"$table"
}
run_steps old "$OLD" 0
for kx in ${KX_STEPS:-0}; do run_steps "new-kx$kx" "$NEW" "$kx"; done
run_steps old2 "$OLD" 0
cat "$table"
