#!/usr/bin/env bash
# Device call for the MXFP8 projections (issue 17), from the repository root on the GPU machine:
#   scripts/gpu-mxfp8.sh DIR        (scripts/gpubin.sh pack DIR here, carried)
# Runs the MXFP8 tests: the projection kernel (and the linear kernel tests: the same file), the
# expert kernels (GpuMoeMma, MXFP4 and MXFP8) and the whole-model
# test of the quantized releases (TESTS overrides the filter), then the decode bench of one TP-4
# rank (60 layers, 8K) with --weights fp8 and mxfp8, alternated twice in this one run, native path,
# and a prefill of 8K tokens (PREFILL) with each.
# Full logs under $OUT; a table last.
set -u
cd "$(dirname "$0")/.."
DIR=${1:?usage: scripts/gpu-mxfp8.sh DIR}
OUT=${OUT:-/tmp/gpu-mxfp8}
mkdir -p "$OUT"
export M3_TEST_DATA="$PWD/tests/data"
[ -x "$DIR/m3mono" ] || scripts/gpubin.sh unpack "$DIR" >/dev/null
export LD_LIBRARY_PATH="$(cd "$DIR/lib" && pwd):${LD_LIBRARY_PATH:-}"
rows=()
TESTS=${TESTS:-'GpuMxfp8Linear.*:GpuMmaLinear.*:GpuMoeMma.*:GpuModel.QuantizedReleasesVsReference'}
timeout "${GPU_TEST_TIMEOUT:-330}" "$DIR/m3_tests_gpu" --gtest_filter="$TESTS" >"$OUT/tests.log" 2>&1
rc=$?
rows+=("tests ($TESTS) | exit $rc | $(grep -c '^\[       OK \]' "$OUT/tests.log") passed, $(grep -c '^\[  FAILED  \] [A-Za-z]' "$OUT/tests.log") failed")
while read -r l; do rows+=("  $l"); done < <(grep -E '^\[  FAILED  \] [A-Za-z]|MXFP8 == ' "$OUT/tests.log" | sed 's/^ *//')
for rep in 1 2; do
  for w in fp8 mxfp8; do
    log="$OUT/bench.$w.$rep.log"
    timeout 300 "$DIR/m3mono" bench --tp-shard 4 --layers 60 --context 8K --batch ${BATCHES:-1,4} --paths native \
      --weights "$w" >"$log" 2>&1 || rows+=("bench $w run $rep | FAILED | $(tail -1 "$log")")
    while read -r l; do rows+=("bench $w run $rep | $l"); done < <(grep -E '^decode' "$log" | awk '{print $2, $3, $4, $5, $6}')
  done
done
for w in fp8 mxfp8; do  # prefill (the deep walks), once each
  log="$OUT/prefill.$w.log"
  timeout 300 "$DIR/m3mono" bench --tp-shard 4 --layers 60 --prefill ${PREFILL:-8K} --paths native --weights "$w" \
    >"$log" 2>&1 || rows+=("prefill $w | FAILED | $(tail -1 "$log")")
  while read -r l; do rows+=("prefill $w | $l"); done < <(grep -E '^prefill' "$log" | awk '{print $2, $3, $4, $5, $6}')
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/gpu.txt" 2>&1
rows+=("gpu | $(cat "$OUT/gpu.txt")")
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . 2>/dev/null
printf '%s\n' "${rows[@]}"
exit $rc
