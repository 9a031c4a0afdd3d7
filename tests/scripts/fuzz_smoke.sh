#!/usr/bin/env bash
# CTest smoke test of every libFuzzer target (fuzz/fuzz_*.cpp): builds each with scripts/fuzz.sh
# (clang, libFuzzer, ASan, UBSan), replays its seed corpus (fuzz/corpus/<name>/, which keeps every
# input that once crashed it) and fuzzes for ~5 s (M3_FUZZ_SMOKE_SECONDS, per target). Skips,
# saying so and exiting 0, when clang++ or libFuzzer (libclang-rt-14-dev) is not installed.
#   bash fuzz_smoke.sh <m3mono-binary> <source-dir>
set -euo pipefail
src="${2:?usage: fuzz_smoke.sh <m3mono-binary> <source-dir>}"
secs="${M3_FUZZ_SMOKE_SECONDS:-5}"

if ! command -v clang++ >/dev/null 2>&1; then
  echo "SKIP: clang++ not found"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' >"$tmp/probe.cpp"
if ! clang++ -fsanitize=fuzzer,address,undefined "$tmp/probe.cpp" -o "$tmp/probe" >"$tmp/err" 2>&1; then
  echo "SKIP: clang++ cannot link a libFuzzer target: $(head -n 1 "$tmp/err")"
  exit 0
fi

# Its own build folder next to the build running this test (incremental across runs, and never
# racing a developer's build/fuzz).
export M3_FUZZ_BUILD_DIR="${M3_FUZZ_BUILD_DIR:-$PWD/fuzz-smoke}"
rc=0
for cpp in "$src"/fuzz/fuzz_*.cpp; do
  target="$(basename "$cpp" .cpp)"
  if bash "$src/scripts/fuzz.sh" "$secs" "$target" >"$tmp/log" 2>&1; then
    echo "$target: $(grep -E '^stat::number_of_executed_units' "$tmp/log" | tr -s ' ' | cut -d' ' -f2) runs in ${secs}s, no crash"
  else
    tail -n 60 "$tmp/log"
    echo "FAIL: $target crashed or did not build (inputs in $M3_FUZZ_BUILD_DIR/artifacts/)"
    rc=1
  fi
done
exit $rc
