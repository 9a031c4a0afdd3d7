#!/usr/bin/env bash
# Device call for the GPU library level of the Python module (issue 16), from the repository root on
# the GPU machine:
#   scripts/gpu-borrow.sh BIN_DIR [PYDIR]   (BIN_DIR: a scripts/gpubin.sh pack; PYDIR: a built
#                                            python/ folder holding the m3mono package for this
#                                            machine's python3 (its .so may be xz-compressed),
#                                            default BIN_DIR/python)
# Runs GpuDeviceLayers.* (the layers over borrowed device buffers vs the engine, bitwise; TESTS
# overrides the filter), then tests/py/test_borrow_cuda.py with torch (greedy ids vs the CLI, a torch
# CUDA graph vs eager, no torch allocation, refusals). Full logs under $OUT; a table last.
set -u
cd "$(dirname "$0")/.."
BIN=${1:?usage: scripts/gpu-borrow.sh BIN_DIR [PYDIR]}
PYDIR=${2:-$BIN/python}
OUT=${OUT:-/tmp/gpu-borrow}
mkdir -p "$OUT"
export M3_TEST_DATA="$PWD/tests/data"
[ -x "$BIN/m3mono" ] || scripts/gpubin.sh unpack "$BIN" >/dev/null
[ -d "$BIN/lib" ] && export LD_LIBRARY_PATH="$(cd "$BIN/lib" && pwd):${LD_LIBRARY_PATH:-}"
TESTS=${TESTS:-'GpuDeviceLayers.*'}
rows=()
timeout "${GPU_TEST_TIMEOUT:-300}" "$BIN/m3_tests_gpu" --gtest_filter="$TESTS" >"$OUT/tests.log" 2>&1
rc=$?
rows+=("tests ($TESTS) | exit $rc | $(grep -c '^\[       OK \]' "$OUT/tests.log") passed, $(grep -c '^\[  FAILED  \] [A-Za-z]' "$OUT/tests.log") failed")
while read -r l; do rows+=("  $l"); done < <(grep -E '^\[  FAILED  \] [A-Za-z]|^  (borrowed|prompts|[0-9]+ (views|logits))' "$OUT/tests.log" | sed 's/^ *//')
for f in "$PYDIR"/m3mono/*.xz; do [ -e "$f" ] && xz -d -f "$f"; done
if [ -d "$PYDIR/m3mono" ]; then
  PYTHONPATH="$(cd "$PYDIR" && pwd)" timeout 300 python3 tests/py/test_borrow_cuda.py "$PWD" "$BIN/m3mono" >"$OUT/py.log" 2>&1
  prc=$?
  rows+=("python torch test | exit $prc | $(grep -c '^ok:' "$OUT/py.log") ok, $(grep -c '^FAIL:' "$OUT/py.log") failed")
  while read -r l; do rows+=("  $l"); done < <(grep -E '^FAIL|Error|Traceback' "$OUT/py.log" | head -8)
  [ $prc -ne 0 ] && rc=$prc
else
  rows+=("python torch test | not run: no m3mono package under $PYDIR")
fi
printf '%s\n' "${rows[@]}"
exit $rc
