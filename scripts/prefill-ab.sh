#!/usr/bin/env bash
# Device call for a prefill change: an older m3mono (.gpubin/base: a full pack or m3mono.xz alone)
# against a new gpubin (.gpubin/NEW, scripts/gpubin.sh pack) in one run.
#   1. GPU tests of NEW (TESTS, default GpuMoeMma.*);
#   2. the prefill of PREFILL tokens (default 8K; tp4 rank, 60 layers) base, new, base, new, and
#      each binary's op-by-op spans;
#   3. `m3mono bench --kernels` of NEW at KMS tokens (default 4096, the most it takes, tp4, no cuBLASLt): the MoE
#      layer and its stages (moe:router ... moe:combine) next to plain reads.
# Full logs under $OUT (default /tmp/prefill-ab); a table prints last. Exit 1 when a test fails.
# Usage (on the device): scripts/prefill-ab.sh NEW
set -u
cd "$(dirname "$0")/.."
NEW=${1:?usage: scripts/prefill-ab.sh NEW}
OUT=${OUT:-/tmp/prefill-ab}
mkdir -p "$OUT"
[ -x ".gpubin/$NEW/m3mono" ] || scripts/gpubin.sh unpack ".gpubin/$NEW" >/dev/null
[ -x .gpubin/base/m3mono ] || scripts/gpubin.sh unpack .gpubin/base >/dev/null  # a full pack or m3mono.xz alone
export LD_LIBRARY_PATH=$PWD/.gpubin/$NEW/lib
export M3_TEST_DATA="$PWD/tests/data"
rc=0
table="$OUT/table.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >"$table" 2>&1
timeout 300 ".gpubin/$NEW/m3_tests_gpu" --gtest_filter="${TESTS:-GpuMoeMma.*}" --gtest_color=no >"$OUT/tests.log" 2>&1 || rc=1
grep -E "^\[  (PASSED|FAILED)|^\[  FAILED" "$OUT/tests.log" >>"$table"
P=${PREFILL:-8K}
for r in 1 2; do
  for b in base "$NEW"; do
    log=$OUT/prefill.$b.$r.log
    timeout 240 ".gpubin/$b/m3mono" bench --tp-shard 4 --layers 60 --context "$P" --batch 1 --steps 20 \
      --prefill "$P" --paths native >"$log" 2>&1 || { echo "prefill bench of $b failed" >>"$table"; tail -5 "$log" >>"$table"; }
    grep -E "^prefill" "$log" | sed "s/^/$r $b /" >>"$table"
  done
done
# where the prefill goes, op by op (the native row's event-timed spans, first run of each binary)
for b in base "$NEW"; do
  awk -v b="$b" '/^prefill .* native/ {on=1; next} on && /kernels -/ {on=0} on && $1 ~ /^[a-z_]+$/ && $1 != "op" && NF >= 5 {print b, "op", $1, $2, $5, "us"}' \
    "$OUT/prefill.$b.1.log" >>"$table"
done
timeout 240 ".gpubin/$NEW/m3mono" bench --tp-shard 4 --kernels --kernel-ms "${KMS:-4096}" --kernel-tps 4 --no-cublas \
  --no-steps >"$OUT/kernels.log" 2>&1 || echo "kernel bench failed" >>"$table"
grep -E "moe" "$OUT/kernels.log" >>"$table"
cat "$table"
exit $rc
