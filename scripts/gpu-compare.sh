#!/usr/bin/env bash
# Two builds on one GPU in one call, for a change that must keep every output bit and must not
# slow the step down (e.g. a refactor):
#   1. bits: tests/gpu/test_bits_dump.cpp's fixed scenario (GpuBitsDump.Write: two synthetic models,
#      FP8 and BF16 caches, chunked prefill, greedy decode over buckets 1-8 with graph replays, a
#      mixed step) written by both binaries, compared byte for byte (cmp);
#   2. speed: `m3mono bench` of both at one TP-4 rank of MiniMax-M3 (60 layers, 8K, decode batches
#      BATCHES, paths stream + native), run old, new, old, new so the spread of one binary is
#      seen next to the difference between them.
#   scripts/gpu-compare.sh OLD_BIN NEW_BIN [BATCHES (default 1,4)]
# Each BIN holds m3mono and m3_tests_gpu (and lib/ for shared libraries the machine lacks). Logs go
# under $OUT (default /tmp/gpu-compare); a table prints last. Exit 1 when the bits differ.
set -u
cd "$(dirname "$0")/.."
OLD=${1:?usage: gpu-compare.sh OLD_BIN NEW_BIN [BATCHES]}
NEW=${2:?usage: gpu-compare.sh OLD_BIN NEW_BIN [BATCHES]}
BATCHES=${3:-1,4}
OUT=${OUT:-/tmp/gpu-compare}
mkdir -p "$OUT"
export M3_TEST_DATA="$PWD/tests/data"
libs() { [ -d "$1/lib" ] && echo "$(cd "$1/lib" && pwd):${LD_LIBRARY_PATH:-}" || echo "${LD_LIBRARY_PATH:-}"; }
table="$OUT/table.txt"
: >"$table"
rc=0
for side in old new; do
  bin=$OLD; [ $side = new ] && bin=$NEW
  LD_LIBRARY_PATH=$(libs "$bin") M3_BITS_DUMP="$OUT/bits-$side.bin" timeout 300 "$bin/m3_tests_gpu" \
    --gtest_filter=GpuBitsDump.Write >"$OUT/bits-$side.log" 2>&1 || { echo "bits $side: test failed" >>"$table"; rc=1; }
done
if [ -s "$OUT/bits-old.bin" ] && cmp -s "$OUT/bits-old.bin" "$OUT/bits-new.bin"; then
  echo "bits: IDENTICAL ($(stat -c %s "$OUT/bits-new.bin") bytes, $(grep -o '[0-9]* logits rows' "$OUT/bits-new.log"))" >>"$table"
else
  echo "bits: DIFFER ($(cmp "$OUT/bits-old.bin" "$OUT/bits-new.bin" 2>&1 | head -1))" >>"$table"
  rc=1
fi
for run in 1 2; do
  for side in old new; do
    bin=$OLD; [ $side = new ] && bin=$NEW
    LD_LIBRARY_PATH=$(libs "$bin") timeout 400 "$bin/m3mono" bench --tp-shard 4 --layers 60 --context 8K \
      --batch "$BATCHES" --paths stream,native --commit "$side" --json "$OUT/bench-$side-$run.json" \
      >"$OUT/bench-$side-$run.txt" 2>"$OUT/bench-$side-$run.log" || echo "bench $side run $run failed" >>"$table"
    grep -E "^decode" "$OUT/bench-$side-$run.txt" | sed "s/^/$side run $run: /" >>"$table"
  done
done
cat "$table"
exit $rc
