#!/usr/bin/env bash
# CTest check of the device-call helpers that run on the GPU machine and cannot be tried there
# first: scripts/bits-diff.py names the first steps whose rows differ between two GpuBitsDump
# files, then lists every differing step (and says "identical" for equal ones; a file of another
# size is reported), and
# scripts/gpu-change.sh's switch values expand into their assignments ("A=1,B=0" with VAR "-").
#   bash bits_diff.sh <m3mono-binary> <source-dir>
set -euo pipefail
src="${2:?usage: bits_diff.sh <m3mono-binary> <source-dir>}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
# two steps of a vocabulary of 4: step 0 one row, step 1 two rows; NEW differs in step 1's row 2
python3 - "$tmp" <<'PY'
import struct, sys
d = sys.argv[1]
a = [float(i) for i in range(12)]
b = list(a); b[9] = 9.5
open(f"{d}/old.bin", "wb").write(struct.pack("12f", *a))
open(f"{d}/new.bin", "wb").write(struct.pack("12f", *b))
open(f"{d}/same.bin", "wb").write(struct.pack("12f", *a))
open(f"{d}/short.bin", "wb").write(struct.pack("8f", *a[:8]))
for n in ("new", "same", "short"):
    open(f"{d}/{n}.bin.idx", "w").write("tiny fp8 0 0 1 4\ntiny fp8 1 1 2 4\n")
PY
out=$(python3 "$src/scripts/bits-diff.py" "$tmp/old.bin" "$tmp/new.bin")
echo "$out"
grep -q "^tiny fp8 step 1: 1 of 2 rows differ" <<<"$out" || { echo "FAIL: the differing step was not named"; fail=1; }
grep -q "step 0" <<<"$out" && { echo "FAIL: an equal step was reported"; fail=1; }
out=$(python3 "$src/scripts/bits-diff.py" "$tmp/old.bin" "$tmp/same.bin")
[ "$out" = identical ] || { echo "FAIL: equal files: '$out'"; fail=1; }
out=$(python3 "$src/scripts/bits-diff.py" "$tmp/old.bin" "$tmp/short.bin")
grep -q "sizes differ" <<<"$out" || { echo "FAIL: a shorter file was not reported: '$out'"; fail=1; }
# past 6 differing steps, the details stop and every differing step is listed
python3 - "$tmp" <<'PY'
import struct, sys
d = sys.argv[1]
open(f"{d}/old8.bin", "wb").write(struct.pack("16f", *[0.0] * 16))
open(f"{d}/new8.bin", "wb").write(struct.pack("16f", *[1.0] * 14 + [0.0] * 2))  # steps 0-6 differ, 7 not
open(f"{d}/new8.bin.idx", "w").write("".join(f"tiny bf16 {i} {i} 1 2\n" for i in range(8)))
PY
out=$(python3 "$src/scripts/bits-diff.py" "$tmp/old8.bin" "$tmp/new8.bin")
echo "$out"
[ "$(grep -c 'rows differ' <<<"$out")" = 6 ] || { echo "FAIL: not 6 steps in detail"; fail=1; }
grep -q "^7 steps differ in all (preset/cache/step): tiny/bf16/0 .* tiny/bf16/6$" <<<"$out" ||
  { echo "FAIL: the list of every differing step is missing or wrong"; fail=1; }
# gpu-change.sh's expansion of switch values
fns=$(sed -n '/^envs()/,/^}/p;/^tag()/p' "$src/scripts/gpu-change.sh")
got=$(VAR=- bash -c "$fns"$'\n''envs "A=1,B=0"; tag "A=1,B=0"')
[ "$got" = $'A=1\nB=0\nA=1_B=0' ] || { echo "FAIL: VAR - expanded to '$got'"; fail=1; }
got=$(VAR=M3_X bash -c "$fns"$'\n''envs 0')
[ "$got" = "M3_X=0" ] || { echo "FAIL: VAR M3_X expanded to '$got'"; fail=1; }
[ $fail = 0 ] && echo "PASS"
exit $fail
