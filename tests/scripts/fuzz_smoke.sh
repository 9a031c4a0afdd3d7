#!/usr/bin/env bash
# CTest smoke test of the safetensors header fuzzer: builds it with scripts/fuzz.sh (clang,
# libFuzzer, ASan, UBSan) and fuzzes for ~20 s (M3_FUZZ_SMOKE_SECONDS). Skips, saying so and
# exiting 0, when clang++ or libFuzzer (libclang-rt-14-dev) is not installed.
#   bash fuzz_smoke.sh <m3mono-binary> <source-dir>
set -euo pipefail
src="${2:?usage: fuzz_smoke.sh <m3mono-binary> <source-dir>}"
secs="${M3_FUZZ_SMOKE_SECONDS:-20}"

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
bash "$src/scripts/fuzz.sh" "$secs" fuzz_safetensors_header >"$tmp/log" 2>&1 || {
  tail -n 60 "$tmp/log"
  echo "FAIL: fuzz_safetensors_header crashed or did not build (inputs in $M3_FUZZ_BUILD_DIR/artifacts/)"
  exit 1
}
grep -E "^(Done|stat::number_of_executed_units|stat::peak_rss_mb)" "$tmp/log" || true
tail -n 1 "$tmp/log"
