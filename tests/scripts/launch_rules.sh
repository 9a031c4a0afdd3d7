#!/usr/bin/env bash
# CTest check of the forward-as-data contract (docs/native-backend.md, "Launches"): device code in
# src/kernels takes its threads from a Group (kernels/group.cuh) and its work item from the generic
# kernel (kernels/work_kernel.cuh), so that the mono path can run the same functions on thread
# groups of its own CTAs; and every native launch goes through the one launch helper
# (native/launch.{h,cuh,cpp}). Fails, listing each line, when
#   __syncthreads, threadIdx, blockDim, blockIdx or gridDim appear in src/kernels outside those two headers, or
#   a <<< launch appears in src/native (the helper uses cudaLaunchKernelExC).
# Comments count too: a rule written in prose is kept out of the checked files.
#   bash launch_rules.sh <m3mono-binary> <source-dir>
set -euo pipefail
src="${2:?usage: launch_rules.sh <m3mono-binary> <source-dir>}"
cd "$src"
[ -d src/kernels ] && [ -d src/native ] || { echo "FAIL: $src has no src/kernels or src/native"; exit 1; }
fail=0
hits=$(grep -rnE '__syncthreads|threadIdx|blockDim|blockIdx|gridDim' src/kernels \
         --include='*.cuh' --include='*.h' --include='*.cu' --include='*.cpp' |
       grep -vE '^src/kernels/(group|work_kernel)\.cuh:' || true)
if [ -n "$hits" ]; then
  echo "FAIL: CTA built-ins or barriers in src/kernels outside group.cuh / work_kernel.cuh:"
  echo "$hits"
  fail=1
fi
hits=$(grep -rn '<<<' src/native || true)
if [ -n "$hits" ]; then
  echo "FAIL: raw <<< launches in src/native (use native/launch.cuh's launch_op):"
  echo "$hits"
  fail=1
fi
# the generic kernel and the helper exist and are the ones that hold them
grep -q 'blockIdx' src/kernels/work_kernel.cuh || { echo "FAIL: work_kernel.cuh maps no blocks"; fail=1; }
grep -q 'cudaLaunchKernelExC' src/native/launch.cpp || { echo "FAIL: launch.cpp launches nothing"; fail=1; }
n=$(grep -rl 'launch_op<' src/native --include='*.cu' | wc -l)
[ "$n" -ge 8 ] || { echo "FAIL: only $n launcher files use launch_op"; fail=1; }
[ $fail -eq 0 ] && echo "OK: kernels use groups only; $n native launcher files launch through the helper"
exit $fail
