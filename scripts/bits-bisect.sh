#!/usr/bin/env bash
# One short device call: GpuBitsDump of OLD once, then of NEW under each set of switches (each value
# a comma-separated list of assignments, "-" for none), each compared with OLD by
# scripts/bits-diff.py: which switch, if any, brings NEW's bits back to OLD's.
#   scripts/bits-bisect.sh NEW OLD "A=0 A=0,B=0 -"
# NEW: a full pack (scripts/gpubin.sh pack), OLD: a pack or its bin.tar.xz alone (run with NEW's lib/).
set -u
cd "$(dirname "$0")/.."
NEW=${1:?usage: bits-bisect.sh NEW OLD "V1 V2 ..."}
OLD=${2:?usage}
VALS=(${3:?usage})
OUT=${OUT:-/tmp/bits-bisect}
mkdir -p "$OUT"
export M3_TEST_DATA="$PWD/tests/data"
for b in "$NEW" "$OLD"; do [ -x ".gpubin/$b/m3_tests_gpu" ] || scripts/gpubin.sh unpack ".gpubin/$b" >/dev/null; done
export LD_LIBRARY_PATH="$PWD/.gpubin/$NEW/lib:${LD_LIBRARY_PATH:-}"
dump() {  # file, binary dir, assignments...
  local f=$1 b=$2
  shift 2
  env "$@" M3_BITS_DUMP="$f" ".gpubin/$b/m3_tests_gpu" --gtest_filter='GpuBitsDump.*' >"$f.log" 2>&1 || echo "dump $f failed"
}
dump "$OUT/old.bin" "$OLD"
for v in "${VALS[@]}"; do
  mapfile -t E < <([ "$v" = - ] || tr ',' '\n' <<<"$v")
  dump "$OUT/new.bin" "$NEW" "${E[@]}"
  if cmp -s "$OUT/old.bin" "$OUT/new.bin"; then echo "$v: identical to $OLD"
  else echo "$v: differs from $OLD"; python3 scripts/bits-diff.py "$OUT/old.bin" "$OUT/new.bin" 2>&1 | head -4 | sed 's/^/  /'; fi
done
