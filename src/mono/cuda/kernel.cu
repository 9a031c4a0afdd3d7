// The mono persistent kernel (kernel.h): the decode ops of the sparse layers, called through the
// op structs native launches (kernels/<op>.cuh), one switch over the op codes (mono/op_code.h).
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/attention.cuh"
#include "kernels/bulk_copy.cuh"
#include "kernels/gemv.cuh"
#include "kernels/indexer.cuh"
#include "kernels/mma_linear.cuh"
#include "kernels/mma_rope.cuh"
#include "kernels/mma_stream.cuh"
#include "kernels/moe_mma.cuh"
#include "kernels/moe_mxfp4.cuh"
#include "kernels/qk_norm_rope_cache.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/router.cuh"
#include "kernels/router_gemv_route.cuh"
#include "mono/cuda/kernel.h"
#include "native/cuda_check.h"

namespace m3::mono {

namespace {

using namespace kernels;

__device__ __forceinline__ unsigned long long ld_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_add(unsigned long long* p, unsigned long long v) {
  asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The running task's params, staged in shared memory while thread 0 waited. The op reads them
// where they are (shared loads, like native's constant-bank params) instead of holding a private
// copy in registers: a copy of up to kParamBytes would take up to 64 registers of the 128 the
// persistent kernel has and make the op bodies spill.
__shared__ __align__(16) uint8_t params_s[kParamBytes];

// What the CTA's threads read of the running task after its wait, staged in shared memory before
// it (with the params): the wait's acquire invalidates the SM's L1, so these kernel-constant
// fields, read from the op table and the task list after it, came from L2, one round trip on
// every hop between dependent ops. A run's items past kRunItems are read from the task list.
struct RunHead {
  int32_t code, stage, threads, smem, first_task;
};
__shared__ RunHead head_s;
constexpr int kRunItems = 64;
__shared__ int32_t items_s[kRunItems];

// One function per op (not inlined into one switch): each body gets the whole register budget,
// and its code is contiguous. Each kernel build (kBuild) has its own copy of every body, the same
// code: ptxas allocates a body's registers over the call graphs it belongs to, so copies shared
// with the verify kernel's extra bodies made the decode bodies spill more (H200 2026-12-04, with
// them shared: mono b=1 7223 against 7033 us; docs/perf.md).
template <class Op, int kBuild>
__device__ __noinline__ void run_body(int64_t item, Group g, uint8_t* smem) {
  Op::run(*reinterpret_cast<const typename Op::Params*>(params_s), item, g, smem);
}

// kBuild (kernel.h, build_of): kBuildVerify adds the bodies only verify steps of more than 4 token
// rows use (the 2 x 2 tile, the GEMV of 8 / 16 tokens); kBuildWhole the split decode tile's whole
// walk (the option fp8_whole). Build 0, the decode kernel, leaves them out, so its code is what it
// was before they existed (a body added to a build moves the other bodies' register allocation,
// ptxas 2026-12-07). A program runs the build that has its codes.
template <int kBuild>
__device__ void run_op(OpCode code, int64_t item, Group g, uint8_t* smem) {
  if constexpr ((kBuild & kBuildVerify) != 0) {
    switch (code) {
      case OpCode::MmaWide2x2Fp8F32: return run_body<MmaWideOp<WeightFmt::FP8, ActFmt::F32, 2, 2>, kBuild>(item, g, smem);
      case OpCode::GemvF32M8: return run_body<GemvOp<WeightFmt::F32, ActFmt::F32, 8>, kBuild>(item, g, smem);
      case OpCode::GemvF32M16: return run_body<GemvOp<WeightFmt::F32, ActFmt::F32, 16>, kBuild>(item, g, smem);
      case OpCode::GemvBf16M8: return run_body<GemvOp<WeightFmt::BF16, ActFmt::F32, 8>, kBuild>(item, g, smem);
      case OpCode::GemvBf16M16: return run_body<GemvOp<WeightFmt::BF16, ActFmt::F32, 16>, kBuild>(item, g, smem);
      default: break;
    }
  }
  if constexpr ((kBuild & kBuildWhole) != 0) {
    if (code == OpCode::MmaDecodeFp8SplitWhole)
      return run_body<MmaDecodeOp<WeightFmt::FP8, ActFmt::F32Split, kNormAny, 4, 1>, kBuild>(item, g, smem);
  }
  switch (code) {
    case OpCode::RmsNormRegs: return run_body<RmsNormOp<true>, kBuild>(item, g, smem);
    case OpCode::RmsNormStrided: return run_body<RmsNormOp<false>, kBuild>(item, g, smem);
    // one body for the tile's every norm mode (kernels/mma_linear.cuh, MmaDecodeOp)
    case OpCode::MmaDecodeFp8F32: return run_body<MmaDecodeOp<WeightFmt::FP8, ActFmt::F32, kNormAny>, kBuild>(item, g, smem);
    case OpCode::MmaStreamFp8F32: return run_body<MmaStreamOp<ActFmt::F32>, kBuild>(item, g, smem);
    case OpCode::MmaDecodeFp8Split:
      return run_body<MmaDecodeOp<WeightFmt::FP8, ActFmt::F32Split, kNormAny>, kBuild>(item, g, smem);
    case OpCode::RopeFp8Fp8: return run_body<QkNormRopeCacheOp<CacheFp8, CacheFp8>, kBuild>(item, g, smem);
    case OpCode::RopeFp8Bf16: return run_body<QkNormRopeCacheOp<CacheFp8, CacheBf16>, kBuild>(item, g, smem);
    case OpCode::RopeBf16Fp8: return run_body<QkNormRopeCacheOp<CacheBf16, CacheFp8>, kBuild>(item, g, smem);
    case OpCode::RopeBf16Bf16: return run_body<QkNormRopeCacheOp<CacheBf16, CacheBf16>, kBuild>(item, g, smem);
    case OpCode::IndexerScoresFp8: return run_body<IndexerScoresOp<CacheFp8>, kBuild>(item, g, smem);
    case OpCode::IndexerScoresBf16: return run_body<IndexerScoresOp<CacheBf16>, kBuild>(item, g, smem);
    case OpCode::IndexerTopk: return run_body<IndexerTopkOp, kBuild>(item, g, smem);
    case OpCode::AttnSplitFp8D64: return run_body<AttentionSplitOp<CacheFp8, 64>, kBuild>(item, g, smem);
    case OpCode::AttnSplitFp8D128: return run_body<AttentionSplitOp<CacheFp8, 128>, kBuild>(item, g, smem);
    case OpCode::AttnSplitBf16D64: return run_body<AttentionSplitOp<CacheBf16, 64>, kBuild>(item, g, smem);
    case OpCode::AttnSplitBf16D128: return run_body<AttentionSplitOp<CacheBf16, 128>, kBuild>(item, g, smem);
    case OpCode::AttnCombine: return run_body<AttentionCombineOp, kBuild>(item, g, smem);
    case OpCode::GemvF32M1: return run_body<GemvOp<WeightFmt::F32, ActFmt::F32, 1, 1>, kBuild>(item, g, smem);
    case OpCode::GemvF32M2: return run_body<GemvOp<WeightFmt::F32, ActFmt::F32, 2, 1>, kBuild>(item, g, smem);
    case OpCode::GemvF32M4: return run_body<GemvOp<WeightFmt::F32, ActFmt::F32, 4, 1>, kBuild>(item, g, smem);
    case OpCode::GemvBf16M1: return run_body<GemvOp<WeightFmt::BF16, ActFmt::F32, 1, 1>, kBuild>(item, g, smem);
    case OpCode::GemvBf16M2: return run_body<GemvOp<WeightFmt::BF16, ActFmt::F32, 2, 1>, kBuild>(item, g, smem);
    case OpCode::GemvBf16M4: return run_body<GemvOp<WeightFmt::BF16, ActFmt::F32, 4, 1>, kBuild>(item, g, smem);
    case OpCode::MoeRoute: return run_body<MoeRouteOp, kBuild>(item, g, smem);
    case OpCode::RouterRouteF32M1: return run_body<RouterGemvRouteOp<WeightFmt::F32, 1>, kBuild>(item, g, smem);
    case OpCode::RouterRouteF32M2: return run_body<RouterGemvRouteOp<WeightFmt::F32, 2>, kBuild>(item, g, smem);
    case OpCode::RouterRouteF32M4: return run_body<RouterGemvRouteOp<WeightFmt::F32, 4>, kBuild>(item, g, smem);
    case OpCode::RouterRouteBf16M1: return run_body<RouterGemvRouteOp<WeightFmt::BF16, 1>, kBuild>(item, g, smem);
    case OpCode::RouterRouteBf16M2: return run_body<RouterGemvRouteOp<WeightFmt::BF16, 2>, kBuild>(item, g, smem);
    case OpCode::RouterRouteBf16M4: return run_body<RouterGemvRouteOp<WeightFmt::BF16, 4>, kBuild>(item, g, smem);
    case OpCode::MoeSplit: return run_body<MoeSplitOp, kBuild>(item, g, smem);
    case OpCode::MoeWideStaged3: return run_body<MoeWideOp<3>, kBuild>(item, g, smem);
    case OpCode::MoeWideRegs: return run_body<MoeWideOp<0>, kBuild>(item, g, smem);
    case OpCode::MoeCombine: return run_body<MoeCombineOp, kBuild>(item, g, smem);
    case OpCode::MmaRopeSplit: return run_body<MmaRopeOp<kNormAny>, kBuild>(item, g, smem);
    default: __trap();
  }
}

// A staged item (op.stage, the kernels' run_staged): its tile is complete. One function each, as
// the op bodies above.
template <int kBuild>
__device__ __noinline__ void run_staged_mma(int64_t item, Group g, uint8_t* smem) {
  using Op = MmaDecodeOp<WeightFmt::FP8, ActFmt::F32>;
  const auto& p = *reinterpret_cast<const Op::Params*>(params_s);
  Op::run_staged(p, item, g, smem, smem + mma_staged_tile_offset(p.chains));
}
template <int kBuild>
__device__ __noinline__ void run_staged_moe(int64_t item, Group g, uint8_t* smem) {
  const auto& p = *reinterpret_cast<const MoeMmaParams*>(params_s);
  MoeWideOp<0>::run_staged(p, item, g, smem, smem + moe_staged_tile_offset(p.chains));
}

// One thread: arms group slot k's barrier and copies item's tile into the slot (smem_k: the
// group's shared memory).
__device__ void stage_item(const MonoOp& op, int64_t item, uint8_t* smem_k, uint64_t* bar) {
  if (op.stage == 1) {
    const auto& p = *reinterpret_cast<const MmaLinearParams*>(op.params);
    mma_stage_tile(p, int(item % mma_row_tiles(p)), smem_k + mma_staged_tile_offset(p.chains), bar);
  } else {
    const auto& p = *reinterpret_cast<const MoeMmaParams*>(op.params);
    moe_stage_tile(p, item, smem_k + moe_staged_tile_offset(p.chains), bar);
  }
}

// Thread 0: spins until *c >= target (acquire loads). Returns false when the kernel must stop: this
// wait passed the watchdog (recorded as task `task` of op op_index waiting on `waited`, -2 for the
// serial counter), or another CTA's did.
__device__ bool wait_counter(const KernelArgs& a, const MonoOp& op, int32_t op_index, int cta, int task,
                             const unsigned long long* c, unsigned long long target, int32_t waited) {
  if (ld_acquire(c) >= target) return true;
  const uint64_t t0 = global_ns();
  for (uint32_t spin = 0;; ++spin) {
    if (ld_acquire(c) >= target) return true;
    if (*reinterpret_cast<volatile uint32_t*>(a.abort)) return false;
    __nanosleep(a.poll_ns);
    if ((spin & 63) == 63 && global_ns() - t0 > a.watchdog_ns) {
      if (atomicCAS(a.abort, 0u, 1u) == 0u) {
        MonoError* e = a.error;
        e->cta = cta;
        e->task = task;
        e->op = op_index;
        e->wait_op = waited;
        e->layer = op.layer;
        e->target = target;
        e->value = ld_acquire(c);
        __threadfence_system();
        *reinterpret_cast<volatile int32_t*>(&e->code) = 1;
        __threadfence_system();
      }
      return false;
    }
  }
}

// The completions of op `w` that the current epoch needs (all its items, every epoch so far).
// `items`: op w's items (MonoOp::wait_items, so the waiting thread does not read op w's record).
__device__ __forceinline__ bool wait_op_done(const KernelArgs& a, const MonoOp& op, int32_t op_index, uint64_t epoch,
                                             int cta, int task, int32_t w, int64_t items, bool fault) {
  const unsigned long long target = epoch * uint64_t(items) + (fault ? 1 : 0);
  return wait_counter(a, op, op_index, cta, task, a.counters + size_t(w) * kCounterStride, target, w);
}

// Thread 0: waits until task (op, item)'s dependencies are met: op.wait_op (and op.wait_op2), or in
// the serialized mode every task before it in the global order; for_stage: op.stage_wait, in either
// mode. Returns false when the kernel must stop. The fault op of the tests gets a target nobody
// reaches.
__device__ bool wait_for(const KernelArgs& a, const MonoOp& op, int32_t op_index, int32_t item, uint64_t epoch, int cta,
                         int task, bool for_stage = false) {
  if (for_stage) return wait_op_done(a, op, op_index, epoch, cta, task, op.stage_wait, a.ops[op.stage_wait].items, false);
  const bool fault = op_index == a.fault_op;
  if (a.serialized) {
    const int64_t g = int64_t(op.first_task) + item;
    const unsigned long long target = (epoch - 1) * uint64_t(a.num_tasks) + uint64_t(g) + (fault ? 1 : 0);
    return wait_counter(a, op, op_index, cta, task, a.seq, target, -2);
  }
  if (op.wait_op2 >= 0 && !wait_op_done(a, op, op_index, epoch, cta, task, op.wait_op2, op.wait_items2, false))
    return false;
  return op.wait_op < 0 || wait_op_done(a, op, op_index, epoch, cta, task, op.wait_op, op.wait_items, fault);
}

template <int kBuild>
__global__ void __launch_bounds__(kCtaThreads, 1) mono_kernel(const __grid_constant__ KernelArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int go;
  // staging (op.stage): group k's first item of a run has its weight tile copied into the group's
  // shared memory while thread 0 waits; stage_bar[k] completes when it has landed, and
  // stage_phase bit k is the parity of that completion
  __shared__ __align__(8) uint64_t stage_bar[kMaxGroups];
  __shared__ uint32_t stage_phase;
  __shared__ int staged;  // groups armed for this run
  const int cta = int(blockIdx.x), tid = int(threadIdx.x);
  if (tid == 0) {
    for (int k = 0; k < kMaxGroups; ++k) mbar_init(&stage_bar[k], 1);
    stage_phase = 0;
    mbar_init_fence();
  }
  __syncthreads();
  const uint64_t epoch = a.epochs[cta] + 1;  // every CTA ran the kernel as often: the same value
  bool done = true;
  const int32_t begin = a.cta_begin[cta], end = a.cta_begin[cta + 1];
  for (int32_t i = begin; i < end;) {
    const MonoTask t = a.tasks[i];
    const MonoOp& op = a.ops[t.op];
    // the run of consecutive tasks of this op in the list (one in the serialized mode) waits once;
    // up to op.groups groups run it side by side, group k taking tasks k, k + G, ... of the run
    // without CTA barriers in between (an item that ends early does not hold its group back)
    int n = 1;
    if (!a.serialized)
      while (i + n < end && a.tasks[i + n].op == t.op) ++n;
    const int G = min(n, int(op.groups));
    // the params do not depend on the wait: warp 1 stages them while thread 0 polls
    if (tid >= 32 && tid < 32 + kParamBytes / 16)
      reinterpret_cast<uint4*>(params_s)[tid - 32] = reinterpret_cast<const uint4*>(op.params)[tid - 32];
    // and warp 2 the rest of what the threads read after the wait (RunHead)
    if (tid >= 64 && tid < 96) {
      for (int k = tid - 64; k < min(n, kRunItems); k += 32) items_s[k] = a.tasks[i + k].item;
      if (tid == 64) head_s = RunHead{op.code, op.stage, op.threads, op.smem, op.first_task};
    }
    if (tid == 0) {
      if (a.trace)
        for (int k = 0; k < n; ++k) a.trace[3 * (int64_t(op.first_task) + a.tasks[i + k].item)] = global_ns();
      // the weights do not depend on the wait: their copies run while it lasts (an expert's tile
      // needs the routing first)
      bool ok = op.stage != 2 || wait_for(a, op, t.op, t.item, epoch, cta, i, true);
      staged = 0;
      if (ok && op.stage) {
        proxy_fence_shared();
        for (int k = 0; k < G; ++k) {
          stage_item(op, a.tasks[i + k].item, smem + size_t(k) * op.smem, &stage_bar[k]);
          stage_phase ^= 1u << k;
        }
        staged = G;
      }
      go = ok && wait_for(a, op, t.op, t.item, epoch, cta, i) ? 1 : 0;
    }
    __syncthreads();
    if (!go) {
      // no copy may still be landing when the CTA exits
      for (int k = 0; k < staged; ++k) mbar_wait(&stage_bar[k], ((stage_phase >> k) & 1u) ^ 1u);
      done = false;
      break;
    }
    const RunHead& h = head_s;  // read where it is (values kept across the bodies' calls would take registers)
    const int g = tid / h.threads;
    if (g < G) {
      const Group grp{tid - g * h.threads, h.threads, 1 + g};
      for (int k = g; k < n; k += G) {
        if (k > g) grp.sync();  // the group's shared memory is reused by its next item
        const int32_t item = k < kRunItems ? items_s[k] : a.tasks[i + k].item;
        unsigned long long* st = a.trace ? a.trace + 3 * (int64_t(h.first_task) + item) : nullptr;
        if (st && grp.tid == 0) st[1] = global_ns();
        uint8_t* gs = smem + size_t(g) * h.smem;
        if (h.stage && k == g) {
          mbar_wait(&stage_bar[g], ((stage_phase >> g) & 1u) ^ 1u);
          if (h.stage == 1) run_staged_mma<kBuild>(item, grp, gs);
          else run_staged_moe<kBuild>(item, grp, gs);
        } else if (h.stage == 2) {
          run_body<MoeWideOp<0>, kBuild>(item, grp, gs);  // the staged op's smem has no ring
        } else {
          run_op<kBuild>(OpCode(h.code), item, grp, gs);
        }
        if (st && grp.tid == 0) st[2] = global_ns();
      }
    }
    __syncthreads();
    if (tid == 0) {
      // the CTA's outputs are visible GPU-wide before the counter moves: the barrier orders every
      // thread's writes before this thread's release add, whose release semantics are cumulative
      // over them (a.fence: a __threadfence before it as well, as cooperative groups' grid sync)
      if (a.fence) __threadfence();
      red_release_add(a.counters + size_t(t.op) * kCounterStride, (unsigned long long)n);
      if (a.serialized) red_release_add(a.seq, 1ull);
    }
    i += n;
  }
  if (tid == 0 && done) a.epochs[cta] = epoch;
}

const void* kernel_fn(int build) {
  switch (build) {
    case 0: return reinterpret_cast<const void*>(mono_kernel<0>);
    case kBuildVerify: return reinterpret_cast<const void*>(mono_kernel<kBuildVerify>);
    case kBuildWhole: return reinterpret_cast<const void*>(mono_kernel<kBuildWhole>);
    case kBuildVerify | kBuildWhole: return reinterpret_cast<const void*>(mono_kernel<kBuildVerify | kBuildWhole>);
  }
  M3_FAIL("mono: no kernel build {}", build);
}
constexpr int kBuilds = 4;

}  // namespace

int build_of(OpCode c) {
  if (c == OpCode::MmaWide2x2Fp8F32 || c == OpCode::GemvF32M8 || c == OpCode::GemvF32M16 ||
      c == OpCode::GemvBf16M8 || c == OpCode::GemvBf16M16)
    return kBuildVerify;
  return c == OpCode::MmaDecodeFp8SplitWhole ? kBuildWhole : 0;
}

int kernel_max_dynamic_smem() {
  int dev = 0, optin = 0;
  M3_CUDA_CHECK(cudaGetDevice(&dev));
  M3_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  int most = optin;
  for (int v = 0; v < kBuilds; ++v) {
    cudaFuncAttributes fa{};
    M3_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel_fn(v)));
    most = std::min(most, optin - int(fa.sharedSizeBytes));
  }
  return most;
}

int kernel_ctas_per_sm(int smem) {
  int fewest = 1 << 30;
  for (int v = 0; v < kBuilds; ++v) {
    M3_CUDA_CHECK(cudaFuncSetAttribute(kernel_fn(v), cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int n = 0;
    M3_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel_fn(v), kCtaThreads, size_t(smem)));
    fewest = std::min(fewest, n);
  }
  return fewest;
}

void launch_kernel(const KernelArgs& a, int grid, int smem, int build, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(grid));
  cfg.blockDim = dim3(unsigned(kCtaThreads));
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  void* args[] = {const_cast<KernelArgs*>(&a)};
  const cudaError_t e = cudaLaunchKernelExC(&cfg, kernel_fn(build), args);
  M3_CHECK(e == cudaSuccess, "mono: cooperative launch of {} CTAs x {} threads ({} B shared memory) failed: {}", grid,
           kCtaThreads, smem, cudaGetErrorString(e));
  M3_LAUNCH_CHECK(stream);
}

}  // namespace m3::mono
