#!/usr/bin/env bash
# Binaries built here, carried to the GPU machine (the device tool's `carry`, 64 MiB with the tree):
#   scripts/gpubin.sh pack DIR [BUILD]   m3mono and m3_tests_gpu of BUILD (default build/release),
#                                        xz-compressed, and the shared libraries the GPU machine
#                                        lacks (everything but libc, libstdc++ and CUDA's) in DIR/lib
#   scripts/gpubin.sh unpack DIR         on the GPU machine: decompress in place (DIR then holds what
#                                        scripts/gpu-check.sh, gpu-mono.sh and bench-native.sh take)
# DIR should sit under .gpubin/ (ignored by git through .git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:?usage: gpubin.sh pack DIR [BUILD] | unpack DIR}
DIR=${2:?usage: gpubin.sh pack DIR [BUILD] | unpack DIR}
case "$cmd" in
  pack)
    BUILD=${3:-build/release}
    grep -qs '^/.gpubin/' .git/info/exclude || { mkdir -p .git/info && echo /.gpubin/ >>.git/info/exclude; }
    rm -rf "$DIR" && mkdir -p "$DIR/lib"
    for b in "$BUILD/m3mono" "$BUILD/tests/m3_tests_gpu"; do
      [ -x "$b" ] || { echo "gpubin: $b is not built" >&2; exit 1; }
      xz -T2 -3 -c "$b" >"$DIR/$(basename "$b").xz"
    done
    ldd "$BUILD/m3mono" "$BUILD/tests/m3_tests_gpu" | awk '/=> \// {print $3}' | sort -u |
      grep -vE '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+)\.so|/cuda' |
      while read -r l; do cp -L "$l" "$DIR/lib/"; done
    du -sh "$DIR"
    ;;
  unpack)
    for f in "$DIR"/*.xz; do xz -d -f "$f"; done
    chmod +x "$DIR"/m3mono "$DIR"/m3_tests_gpu
    ;;
  *) echo "gpubin: pack or unpack, not $cmd" >&2; exit 2 ;;
esac
