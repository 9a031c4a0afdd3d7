#!/usr/bin/env bash
# The GPU acceptance run, on a machine with an NVIDIA GPU, from the repository root:
#   scripts/gpu-check.sh [BIN_DIR]
# BIN_DIR holds m3_tests_gpu and m3mono (default build/release; binaries built on another machine
# run here: static cudart, header-only fmt). Runs every GPU test (the whole-model checks against
# the CPU reference and the transformers golden included), `m3mono conformance --device cuda`
# and the CPU reference on the prepared weights next to it, and `m3mono generate` on both devices;
# writes the full logs under $OUT (default /tmp/gpu-check) and prints one table last.
# Environment: GPU_CHECK_SKIP (gtest patterns to leave out, e.g. '*Bench*'), GPU_CHECK_REST=0 (run
# only the backend and whole-model tests, not the per-kernel ones), GPU_CHECK_TIMEOUT
# (seconds per run of the test binary, default 420). Exit status 1 when anything failed.
set -u
cd "$(dirname "$0")/.."
BIN=${1:-build/release}
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export M3_TEST_DATA="$PWD/tests/data"
# shared libraries the build machine had and this one may lack (cpp-httplib for m3mono) go in BIN/lib
[ -d "$BIN/lib" ] && export LD_LIBRARY_PATH="$(cd "$BIN/lib" && pwd):${LD_LIBRARY_PATH:-}"
TINY=tests/data/tiny-m3-a
TABLE="$OUT/table.txt"
: >"$TABLE"
fail=0
row() { printf '%-58s | %-4s | %s\n' "$1" "$2" "$3" >>"$TABLE"; }

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
row "device" "info" "${gpu:-no nvidia-smi}"

# 1. every GPU test: the whole-model checks first (so a slow or hanging test elsewhere cannot
#    cost their results), then the rest.
t0=$(date +%s)
rc=0
: >"$OUT/gpu-tests.log"
skip=${GPU_CHECK_SKIP:-}
parts=("GpuCudaBackend.*:GpuModel.*${skip:+-$skip}")
[ "${GPU_CHECK_REST:-1}" = 1 ] && parts+=("-GpuCudaBackend.*:GpuModel.*${skip:+:$skip}")
for f in "${parts[@]}"; do
  timeout "${GPU_CHECK_TIMEOUT:-420}" "$BIN/m3_tests_gpu" --gtest_filter="$f" --gtest_color=no >>"$OUT/gpu-tests.log" 2>&1
  r=$?
  [ $r -ne 0 ] && rc=$r
  [ $r -eq 124 ] && row "m3_tests_gpu --gtest_filter=$f" "FAIL" "timed out after ${GPU_CHECK_TIMEOUT:-420} s"
done
t1=$(date +%s)
[ $rc -ne 0 ] && fail=1
passed=$(grep -c '^\[       OK \]' "$OUT/gpu-tests.log")
failed=$(grep '^\[  FAILED  \] [A-Za-z]' "$OUT/gpu-tests.log" | sed -E 's/^\[  FAILED  \] ([^ ]+).*/\1/' | sort -u | wc -l)
row "m3_tests_gpu (all tests)" "$([ $rc -eq 0 ] && echo PASS || echo FAIL)" \
  "$passed passed, $failed failed, $((t1 - t0)) s, exit $rc"
grep '^\[  FAILED  \] [A-Za-z]' "$OUT/gpu-tests.log" | sed -E 's/^\[  FAILED  \] ([^ ]+).*/\1/' | sort -u |
  while read -r name; do row "  failed: $name" "FAIL" "see gpu-tests.log"; done
for t in GpuCudaBackend.MixedBatchesMatchReference GpuCudaBackend.GraphReplayIsBitwiseEagerAndTablesDoNotMatter \
         GpuCudaBackend.MalformedStepsThrowAndLeaveTheBackendUsable GpuModel.RealHeadsVsReference \
         GpuModel.TinyM3aVsReference GpuModel.TinyM3aAgainstTransformersGolden GpuModel.QuantizedReleasesVsReference \
         GpuLayerRange.RunnerIsChosenPerStepAndGivesTheSameBits GpuMono.TinyM3aBitwiseEqualsNative \
         GpuMono.RealHeadsBitwiseEqualsNative GpuMono.WatchdogStopsAFaultAndNativeRerunsTheStep \
         GpuMono.CreationAllocatesOnlyItsTables GpuTensorParallel.OneRankThroughTheCollectivesIsBitwiseTheSingleRank \
         GpuTensorParallel.Tp2OnOneGpuMatchesTheReferenceRanksAndIsBatchInvariant \
         GpuTensorParallel.ARankFailingAloneFailsTheStepEverywhereAndNothingHangs \
         GpuEagle3.AuxRowsMatchTheReferenceAndAreBatchInvariant GpuEagle3.GreedyOutputsEqualPlainDecoding; do
  if grep -q "^\[       OK \] $t " "$OUT/gpu-tests.log"; then r=PASS
  elif grep -q "^\[  FAILED  \] $t " "$OUT/gpu-tests.log"; then r=FAIL
  else r="----"; fi
  ms=$(grep -E "^\[ *(OK|FAILED) *\] $t \(" "$OUT/gpu-tests.log" | head -1 | sed -E 's/.*\(([0-9]+) ms\).*/\1 ms/')
  row "  $t" "$r" "${ms:-not run}"
done
# the whole-model figures the tests print
grep '^MODEL |' "$OUT/gpu-tests.log" | sed 's/^MODEL | //' | while IFS= read -r l; do
  row "  ${l%% |*}" "info" "${l#* | }"
done
grep -E '^\s+\[(default|exact|yardstick|mono|layer range|eagle3)|logits compared' "$OUT/gpu-tests.log" | sed 's/^ *//' | while IFS= read -r l; do
  row "  backend test" "info" "$l"
done

# 2. conformance against the transformers golden: GPU, and the CPU reference on the same prepared
#    weights (what FP8/MXFP4 weight quantization alone gives). Bound: see test_model_vs_ref.cpp.
# The CLI's own pass/fail uses fixed bounds that no FP8/MXFP4 engine meets on this chaotic tiny
# model (see test_model_vs_ref.cpp): its figures are printed side by side, the verdict is the
# gtest GpuModel.TinyM3aAgainstTransformersGolden.
TOL=1
for dev in "cuda:--device cuda" "cpu-prepared:--device cpu --weights prepared"; do
  name=${dev%%:*}
  "$BIN/m3mono" conformance --model "$TINY" ${dev#*:} --tol $TOL >"$OUT/conformance-$name.log" 2>&1
  rc=$?
  worst=$(grep -E 'logits' "$OUT/conformance-$name.log" | sed -E 's/.*max\|d\|\/max\|ref\| ([0-9.eE+-]+).*/\1/' |
    sort -g | tail -1)
  ids=$(grep 'greedy ids' "$OUT/conformance-$name.log" | sed -E 's/.*greedy ids: ([0-9]+ of [0-9]+ [a-z]+).*/\1/' | tr '\n' ';')
  sel=$(grep 'prefill selections' "$OUT/conformance-$name.log" | sed -E 's/.*selections: ([0-9]+ of [0-9]+ rows differ|[0-9]+ layers).*/\1/' | tr '\n' ';')
  row "conformance tiny-m3-a --device $name" "info" \
    "exit $rc; worst logits max|d|/max|golden| ${worst:-?}; greedy: ${ids:-?}; selections: ${sel:-?}"
done

# 3. generate on both devices (greedy ids must agree except at near-ties: printed side by side)
P=1,15,92,65,35,7,300,12
g_cuda=$("$BIN/m3mono" generate --model "$TINY" --prompt-ids $P --max-tokens 32 --device cuda 2>"$OUT/generate.log")
rc1=$?
g_cpu=$("$BIN/m3mono" generate --model "$TINY" --prompt-ids $P --max-tokens 32 --device cpu --weights prepared \
  2>>"$OUT/generate.log")
rc2=$?
{ echo "cuda: $g_cuda"; echo "cpu-prepared: $g_cpu"; } >>"$OUT/generate.log"
same=$([ "$g_cuda" = "$g_cpu" ] && echo "identical ids" || echo "ids differ")
[ $rc1 -ne 0 ] && fail=1
rate=$(grep -m1 '^decode' "$OUT/generate.log")
row "generate --device cuda vs cpu --weights prepared" "$([ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && echo PASS || echo FAIL)" \
  "$same; cuda $rate"

echo
echo "==== gpu-check ($([ $fail -eq 0 ] && echo PASS || echo FAIL)) ===="
cat "$TABLE"
exit $fail
