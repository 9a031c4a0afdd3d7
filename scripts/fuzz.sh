#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` CMake preset: clang, -fsanitize=fuzzer,address,undefined)
# and runs one of them for a bounded time on a scratch copy of its seed corpus.
#
#   scripts/fuzz.sh [SECONDS=60] [TARGET=fuzz_safetensors_header]
#
# TARGET is fuzz_safetensors_header, fuzz_config, fuzz_completion_request, fuzz_checkpoint,
# fuzz_tokenizer, fuzz_tokenizer_json, fuzz_chat_template, fuzz_chat_request or fuzz_model_output
# (any fuzz/fuzz_*.cpp).
# Seeds come from fuzz/corpus/<TARGET without "fuzz_">, a dictionary from fuzz/<that name>.dict
# when there is one; inputs the fuzzer finds go to the build folder, never into the repository.
# Seeds include every input that once crashed a target, so each run replays them first. A crash
# leaves its input in $BUILD/artifacts/ and the script exits non-zero.
# Environment: M3_FUZZ_BUILD_DIR overrides the build folder (default build/fuzz); M3_FUZZ_RUNS=N
# also stops the run after N executions (a run of record: whichever of SECONDS and N comes first).
set -euo pipefail

secs="${1:-60}"
target="${2:-fuzz_safetensors_header}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${M3_FUZZ_BUILD_DIR:-$root/build/fuzz}"

[[ "$secs" =~ ^[0-9]+$ && "$secs" -gt 0 ]] || { echo "fuzz.sh: SECONDS must be a positive integer, got '$secs'" >&2; exit 2; }
[[ -f "$root/fuzz/$target.cpp" ]] || { echo "fuzz.sh: no fuzz target $root/fuzz/$target.cpp" >&2; exit 2; }

echo "fuzz.sh: configuring $build"
mkdir -p "$build"
(cd "$root" && cmake --preset fuzz -B "$build" >"$build/configure.log" 2>&1) || {
  cat "$build/configure.log" >&2; exit 1; }
echo "fuzz.sh: building $target"
cmake --build "$build" --target "$target" -j "${M3_FUZZ_JOBS:-2}"

corpus="$build/corpus/$target"
artifacts="$build/artifacts/"
mkdir -p "$corpus" "$artifacts"
seeds="$root/fuzz/corpus/${target#fuzz_}"
[[ -d "$seeds" ]] && cp -n "$seeds"/* "$corpus"/ 2>/dev/null || true
runs=()
if [[ -n "${M3_FUZZ_RUNS:-}" ]]; then
  [[ "$M3_FUZZ_RUNS" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: M3_FUZZ_RUNS must be a positive integer, got '$M3_FUZZ_RUNS'" >&2; exit 2; }
  runs=(-runs="$M3_FUZZ_RUNS")
fi
dict=()
if [[ "$target" == fuzz_safetensors_header && -f "$root/fuzz/safetensors.dict" ]]; then
  dict=(-dict="$root/fuzz/safetensors.dict")
elif [[ -f "$root/fuzz/${target#fuzz_}.dict" ]]; then
  dict=(-dict="$root/fuzz/${target#fuzz_}.dict")
fi

# Inputs up to 8 KiB, except whole checkpoints: their seeds (an index plus shard headers of the
# tiny model, fuzz/fuzz_checkpoint.cpp) are up to 52 KB.
max_len=8192
[[ "$target" == fuzz_checkpoint ]] && max_len=131072

echo "fuzz.sh: running $target for ${secs}s (corpus $corpus)"
# NOTE: leak detection is off by default: the parsers own no raw allocations, and LeakSanitizer
# cannot run under ptrace-restricted containers (it aborts the whole run there). Where it can run,
# ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 turns it on (the runs of record in the README did).
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}" \
UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
  "$build/fuzz/$target" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len" \
  -print_final_stats=1 -artifact_prefix="$artifacts" "${runs[@]}" "${dict[@]}" "$corpus"
echo "fuzz.sh: $target ran ${secs}s without a crash"
