#!/usr/bin/env bash
# Binaries built here, carried to the GPU machine (the device tool's `carry`, 64 MiB with the tree):
#   scripts/gpubin.sh pack DIR [BUILD]   m3mono and m3_tests_gpu of BUILD (default build/release) in
#                                        one xz stream (DIR/bin.tar.xz: the two share their device
#                                        code, so one dictionary holds both in ~11 MB where two files
#                                        took ~20), and the shared libraries the GPU machine lacks
#                                        (everything but libc, libstdc++ and CUDA's) in DIR/lib.tar.xz
#   scripts/gpubin.sh unpack DIR         on the GPU machine: decompress in place (DIR then holds what
#                                        scripts/gpu-check.sh, gpu-mono.sh and bench-native.sh take);
#                                        also takes the older layout (m3mono.xz, m3_tests_gpu.xz)
#   scripts/gpubin.sh pymod DIR [BUILD]  the Python module's parts for a GPU machine whose python3 is
#                                        not this one's: BUILD's static libraries and the module's
#                                        Python-independent objects, nanobind's sources, the fmt and
#                                        nlohmann headers, in DIR/pymod (after `pack DIR`)
#   scripts/gpubin.sh pybuild DIR        on the GPU machine: compile nanobind and src/python/module.cpp
#                                        for its python3 (its headers) and link DIR/python/m3mono
# DIR should sit under .gpubin/ (ignored by git through .git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:?usage: gpubin.sh pack DIR [BUILD] | unpack DIR | pymod DIR [BUILD] | pybuild DIR}
DIR=${2:?usage: gpubin.sh pack DIR [BUILD] | unpack DIR | pymod DIR [BUILD] | pybuild DIR}
case "$cmd" in
  pack)
    BUILD=${3:-build/release}
    grep -qs '^/.gpubin/' .git/info/exclude || { mkdir -p .git/info && echo /.gpubin/ >>.git/info/exclude; }
    rm -rf "$DIR" && mkdir -p "$DIR/lib"
    for b in "$BUILD/m3mono" "$BUILD/tests/m3_tests_gpu"; do
      [ -x "$b" ] || { echo "gpubin: $b is not built" >&2; exit 1; }
    done
    # one thread and a dictionary larger than m3mono, so m3_tests_gpu's copy of the device code is
    # found in it (XZ_PRESET: 0 for a quick pack, e.g. in the tests)
    B=$(cd "$BUILD" && pwd)
    tar -cf - -C "$B" m3mono -C "$B/tests" m3_tests_gpu |
      xz -T1 --lzma2=preset="${XZ_PRESET:-6}",dict=64MiB >"$DIR/bin.tar.xz"
    ldd "$BUILD/m3mono" "$BUILD/tests/m3_tests_gpu" | awk '/=> \// {print $3}' | sort -u |
      grep -vE '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+)\.so|/cuda' |
      while read -r l; do cp -L "$l" "$DIR/lib/"; done
    tar -C "$DIR" -cf - lib | xz -T2 -6 >"$DIR/lib.tar.xz" && rm -rf "$DIR/lib"  # unpack restores it
    du -sh "$DIR"
    ;;
  unpack)
    for t in lib bin; do
      [ -f "$DIR/$t.tar.xz" ] && { xz -dc "$DIR/$t.tar.xz" | tar -C "$DIR" -xf - && rm -f "$DIR/$t.tar.xz"; }
    done
    for f in "$DIR"/*.xz; do [ -f "$f" ] && xz -d -f "$f"; done  # the older layout: one file each
    [ -f "$DIR/m3mono" ] || { echo "gpubin: $DIR holds no m3mono (pack it with scripts/gpubin.sh pack)" >&2; exit 1; }
    chmod +x "$DIR/m3mono"
    [ -f "$DIR/m3_tests_gpu" ] && chmod +x "$DIR/m3_tests_gpu"  # (a bench-only directory has none)
    true
    ;;
  pymod)
    BUILD=${3:-build/release}
    P="$DIR/pymod"
    rm -rf "$P" && mkdir -p "$P/include"
    nb=$(python3 -c 'import nanobind, os; print(os.path.dirname(nanobind.__file__))')
    cp -r /usr/include/fmt /usr/include/nlohmann "$P/include/"
    tar -C "$(dirname "$nb")" -cf - nanobind | xz -T2 -6 >"$P/nanobind.tar.xz"
    cp "$BUILD"/CMakeFiles/_m3mono.dir/src/cli/*.o "$P/"
    tar -C "$BUILD" -cf - libm3_ref.a libm3_text.a libm3_serve.a libm3_cuda.a libm3_mpi.a libm3_mono.a libm3_runtime.a \
      libm3_model.a libm3_core.a | xz -T2 -9 >"$P/libs.tar.xz"
    du -sh "$P"
    ;;
  pybuild)
    P="$DIR/pymod"
    [ -d "$DIR/lib" ] || "$0" unpack "$DIR"
    inc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    suffix=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
    [ -f "$inc/Python.h" ] || { echo "gpubin: no Python.h under $inc (python3-dev)" >&2; exit 1; }
    W=$(mktemp -d)
    xz -dc "$P/nanobind.tar.xz" | tar -C "$W" -xf -
    xz -dc "$P/libs.tar.xz" | tar -C "$W" -xf -
    nb="$W/nanobind"
    flags=(-O3 -DNDEBUG -fPIC -fvisibility=hidden -ffunction-sections -fdata-sections -fno-stack-protector -std=gnu++20
           -I"$inc" -I"$nb/include" -isystem "$nb/ext/robin_map/include")
    pids=()
    for n in common error implicit nb_datetime nb_enum nb_func nb_internals nb_ndarray nb_static_property nb_type \
             trampoline; do
      f="$nb/src/$n.cpp"
      c++ "${flags[@]}" -DNB_BUILD -DNB_COMPACT_ASSERTIONS -fno-strict-aliasing -c "$f" -o "$W/nb_$(basename "$f" .cpp).o" &
      pids+=($!)
    done
    c++ "${flags[@]}" -DFMT_HEADER_ONLY=1 -DM3_WITH_CUDA=1 -DM3_WITH_MPI=1 -DNB_COMPACT_ASSERTIONS -Isrc \
      -isystem "$P/include" -isystem /usr/local/cuda/include -c src/python/module.cpp -o "$W/module.o" &
    pids+=($!)
    for p in "${pids[@]}"; do wait "$p" || { echo "gpubin: a compile failed" >&2; exit 1; }; done
    L=$(cd "$DIR/lib" && pwd)
    nccl=$(ldconfig -p | awk '/libnccl\.so\.2 /{print $NF; exit}')
    cudart=$(ls /usr/local/cuda/lib64/libcudart_static.a /usr/local/cuda/targets/x86_64-linux/lib/libcudart_static.a \
             2>/dev/null | head -1)
    mkdir -p "$DIR/python/m3mono"
    cp python/m3mono/__init__.py "$DIR/python/m3mono/"
    c++ -shared -fPIC -O3 -Wl,--gc-sections -o "$DIR/python/m3mono/_m3mono$suffix" "$W/module.o" "$P"/*.o \
      "$W"/nb_*.o -Wl,--start-group "$W"/libm3_*.a -Wl,--end-group "$L"/*.so* ${nccl:+"$nccl"} "$cudart" \
      -Wl,-rpath,"$L" -ldl -lrt -lpthread
    rm -rf "$W"
    ls -la "$DIR/python/m3mono"
    ;;
  *) echo "gpubin: pack, unpack, pymod or pybuild, not $cmd" >&2; exit 2 ;;
esac
