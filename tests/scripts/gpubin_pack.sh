#!/usr/bin/env bash
# scripts/gpubin.sh, the binaries carried to the GPU machine: `pack` then `unpack` gives back
# m3mono and m3_tests_gpu byte for byte (one xz stream for both) and their libraries; the older
# layout (one m3mono.xz alone) still unpacks; a folder with nothing to unpack is refused with a
# message. Needs m3_tests_gpu built beside m3mono (the CUDA targets build wherever nvcc is).
#   tests/scripts/gpubin_pack.sh M3MONO SOURCE_DIR
set -u
M3=${1:?usage: gpubin_pack.sh M3MONO SOURCE_DIR}
SRC=${2:?usage: gpubin_pack.sh M3MONO SOURCE_DIR}
BUILD=$(cd "$(dirname "$M3")" && pwd)
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$BUILD/tests/m3_tests_gpu" ] || fail "$BUILD/tests/m3_tests_gpu is not built (the CUDA targets build with nvcc)"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$SRC"

XZ_PRESET=0 scripts/gpubin.sh pack "$W/new" "$BUILD" >"$W/pack.log" 2>&1 || fail "pack: $(tail -3 "$W/pack.log")"
packed=$(du -sh "$W/new" | cut -f1)
ls "$W/new" | sort | tr '\n' ' ' | grep -qx 'bin.tar.xz lib.tar.xz ' ||
  fail "pack wrote $(ls "$W/new" | tr '\n' ' '), not bin.tar.xz and lib.tar.xz"
scripts/gpubin.sh unpack "$W/new" >"$W/unpack.log" 2>&1 || fail "unpack: $(tail -3 "$W/unpack.log")"
cmp "$W/new/m3mono" "$M3" || fail "m3mono differs after pack + unpack"
cmp "$W/new/m3_tests_gpu" "$BUILD/tests/m3_tests_gpu" || fail "m3_tests_gpu differs after pack + unpack"
[ -x "$W/new/m3mono" ] && [ -x "$W/new/m3_tests_gpu" ] || fail "the unpacked binaries are not executable"
[ -d "$W/new/lib" ] || fail "no lib/ after unpack"
ls "$W/new"/*.xz >/dev/null 2>&1 && fail "compressed files left after unpack: $(ls "$W/new"/*.xz)"
"$W/new/m3mono" --help >/dev/null 2>&1 || fail "the unpacked m3mono does not run"

# the older layout: m3mono.xz alone (a bench-only folder)
mkdir -p "$W/old" && xz -0 -c "$M3" >"$W/old/m3mono.xz"
scripts/gpubin.sh unpack "$W/old" >"$W/old.log" 2>&1 || fail "unpack of m3mono.xz alone: $(tail -3 "$W/old.log")"
cmp "$W/old/m3mono" "$M3" || fail "m3mono.xz unpacked to different bytes"
[ -x "$W/old/m3mono" ] || fail "m3mono unpacked from m3mono.xz is not executable"

# nothing to unpack: refused, naming the folder
mkdir -p "$W/empty"
if scripts/gpubin.sh unpack "$W/empty" >"$W/empty.log" 2>&1; then fail "unpack of an empty folder succeeded"; fi
grep -q "$W/empty holds no m3mono" "$W/empty.log" || fail "unpack of an empty folder said: $(cat "$W/empty.log")"
echo "PASS: gpubin pack / unpack ($packed packed)"
