// Launchers of the linear layers (native/linear.h): the tensor-core kernel (kernels/mma_linear.cuh)
// in its wide (decode: one item of P warps per tile) and deep (prefill: one warp per tile) modes,
// and the CUDA-core GEMV (kernels/gemv.cuh), one item per (rows, token group).
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/weight_tiles.h"
#include "kernels/gemv.cuh"
#include "kernels/mma_linear.cuh"
#include "kernels/mma_stream.cuh"
#include "native/cuda_check.h"
#include "native/env_switch.h"
#include "native/launch.cuh"
#include "native/linear.h"

namespace m3::native {

using kernels::ActFmt;
using kernels::WeightFmt;

namespace {

void check_act(const ActIn& x, int K, int M, const char* what) {
  M3_CHECK(x.dtype == DType::BF16 || x.dtype == DType::F32, "{}: activations must be BF16 or F32, got {}", what,
           dtype_name(x.dtype));
  M3_CHECK(x.data && M > 0, "{}: no activations (M = {})", what, M);
  const int64_t align = x.dtype == DType::BF16 ? 8 : 4;
  M3_CHECK(x.ld >= K && x.ld % align == 0 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0,
           "{}: activation rows must be 16-byte aligned with ld >= K (ld {}, K {})", what, x.ld, K);
}

// The weight [N x K] (16-byte aligned rows of ld_w >= K elements), FP8 row scales, and the output.
void check_weight_out(const void* w, DType wdtype, const float* w_scale, int64_t ld_w, int N, int K, const float* y,
                      int64_t ld_y, bool swiglu, const char* what) {
  const int64_t esize = wdtype == DType::F8_E4M3 ? 1 : int64_t(dtype_size(wdtype));
  M3_CHECK(w && N > 0 && K > 0 && ld_w % 16 == 0 && ld_w >= K * esize && reinterpret_cast<uintptr_t>(w) % 16 == 0,
           "{}: weight [{} x {}] {} needs 16-byte aligned rows of ld >= {} bytes (ld {})", what, N, K,
           dtype_name(wdtype), K * esize, ld_w);
  M3_CHECK(wdtype != DType::F8_E4M3 || w_scale, "{}: FP8 weights need their row scales", what);
  M3_CHECK(!swiglu || N % 2 == 0, "{}: SwiGLU needs an even row count, got {}", what, N);
  M3_CHECK(y && ld_y >= (swiglu ? N / 2 : N), "{}: output ld {} < {}", what, ld_y, swiglu ? N / 2 : N);
}

WeightFmt weight_fmt(DType t, const char* what) {
  switch (t) {
    case DType::F8_E4M3: return WeightFmt::FP8;
    case DType::BF16: return WeightFmt::BF16;
    case DType::F32: return WeightFmt::F32;
    default: M3_FAIL("{}: unsupported weight dtype {}", what, dtype_name(t));
  }
}

// ---- GEMV ----

template <WeightFmt W, ActFmt X>
void launch_gemv(const kernels::GemvParams& p, cudaStream_t s, const LaunchOptions& o) {
  const kernels::WorkShape sh = kernels::gemv_shape(p);
  const bool fp8_prefill_rows = W == WeightFmt::FP8 && p.mt == 16 && p.rows == kernels::kGemvPrefillRows;
  M3_CHECK(kernels::gemv_rows_ok(p.mt, p.rows, p.swiglu != 0) && !fp8_prefill_rows,
           "gemv: {} rows per item at {} tokens per pass{} (1 without SwiGLU up to 4 tokens, {} without SwiGLU at 16 "
           "for F32 / BF16 weights, or {})",
           p.rows, p.mt, p.swiglu ? " with SwiGLU" : "", kernels::kGemvPrefillRows, kernels::gemv_rows_per_item(p.mt));
  const bool one = p.rows == 1;
  switch (p.mt) {
    case 1:
      return one ? launch_op<kernels::GemvOp<W, X, 1, 1>>(p, sh, s, "gemv", o)
                 : launch_op<kernels::GemvOp<W, X, 1>>(p, sh, s, "gemv", o);
    case 2:
      return one ? launch_op<kernels::GemvOp<W, X, 2, 1>>(p, sh, s, "gemv", o)
                 : launch_op<kernels::GemvOp<W, X, 2>>(p, sh, s, "gemv", o);
    case 4:
      return one ? launch_op<kernels::GemvOp<W, X, 4, 1>>(p, sh, s, "gemv", o)
                 : launch_op<kernels::GemvOp<W, X, 4>>(p, sh, s, "gemv", o);
    case 8: return launch_op<kernels::GemvOp<W, X, 8>>(p, sh, s, "gemv", o);
    case 16:
      if constexpr (W != WeightFmt::FP8)  // (FP8's 16 values a chunk spill at 4 rows; its prefill is on tensor cores)
        if (p.rows == kernels::kGemvPrefillRows)
          return launch_op<kernels::GemvOp<W, X, 16, kernels::kGemvPrefillRows>>(p, sh, s, "gemv", o);
      return launch_op<kernels::GemvOp<W, X, 16>>(p, sh, s, "gemv", o);
    default: M3_FAIL("gemv: {} tokens per pass (1, 2, 4, 8 or 16)", p.mt);
  }
}

template <WeightFmt W>
void launch_gemv_x(const kernels::GemvParams& p, cudaStream_t s, const LaunchOptions& o) {
  if (p.xfmt == ActFmt::BF16) launch_gemv<W, ActFmt::BF16>(p, s, o);
  else launch_gemv<W, ActFmt::F32>(p, s, o);
}

// ---- tensor cores ----

template <WeightFmt W, ActFmt X>
void launch_mma(const kernels::MmaLinearParams& p, cudaStream_t s, const LaunchOptions& o) {
  using namespace kernels;
  const WorkShape sh = mma_linear_shape(p);
  M3_CHECK(!p.nout.res || (!p.deep && !p.swiglu && p.N % kNormChunk == 0),
           "mma_linear: the norm's prep half in the epilogue needs a wide walk, no SwiGLU and N % {} == 0 (N {})",
           kNormChunk, p.N);
  M3_CHECK(!(p.nin.ss && p.deep), "mma_linear: the deep walk takes the norm's inv handed in (nin.inv), not chunk sums");
  if (p.deep) {
    if (p.rt == 4 && p.nt == 4) return launch_op<MmaDeepOp<W, X, 4, 4>>(p, sh, s, "mma_linear", o);
  } else {
    if (p.rt == 1 && p.nt == 1) {
      if (!p.stream) {
        switch (mma_norm_mode(p)) {
          case kNormIn: return launch_op<MmaDecodeOp<W, X, kNormIn>>(p, sh, s, "mma_linear", o);
          case kNormOut: return launch_op<MmaDecodeOp<W, X, kNormOut>>(p, sh, s, "mma_linear", o);
          default: return launch_op<MmaDecodeOp<W, X, kNormNone>>(p, sh, s, "mma_linear", o);
        }
      }
      if constexpr (W == WeightFmt::FP8) return launch_op<MmaStreamOp<X>>(p, sh, s, "mma_linear", o);
    }
    if (p.rt == 1 && p.nt == 2) return launch_op<MmaWideOp<W, X, 1, 2>>(p, sh, s, "mma_linear", o);
    if (p.rt == 2 && p.nt == 1) return launch_op<MmaWideOp<W, X, 2, 1>>(p, sh, s, "mma_linear", o);
    if (p.rt == 2 && p.nt == 2) return launch_op<MmaWideOp<W, X, 2, 2>>(p, sh, s, "mma_linear", o);
    if (p.rt == 4 && p.nt == 1) return launch_op<MmaWideOp<W, X, 4, 1>>(p, sh, s, "mma_linear", o);
  }
  M3_FAIL("mma_linear: no {} tiling rt {} nt {}", p.deep ? "deep" : "wide", p.rt, p.nt);
}

}  // namespace

kernels::GemvParams make_gemv_params(const void* w, DType wdtype, const float* w_scale, int64_t ld_w, int N, int K,
                                     const ActIn& x, int M, float* y, int64_t ld_y, bool swiglu, float alpha,
                                     float limit) {
  check_act(x, K, M, "gemv");
  check_weight_out(w, wdtype, w_scale, ld_w, N, K, y, ld_y, swiglu, "gemv");
  kernels::GemvParams p;
  p.w = static_cast<const uint8_t*>(w);
  p.w_scale = w_scale;
  p.ld_w = ld_w;
  p.x = x.data;
  p.ld_x = x.ld;
  p.y = y;
  p.ld_y = ld_y;
  p.N = N;
  p.K = K;
  p.M = M;
  p.swiglu = swiglu ? 1 : 0;
  p.alpha = alpha;
  p.limit = limit;
  p.wfmt = weight_fmt(wdtype, "gemv");
  p.xfmt = x.dtype == DType::BF16 ? ActFmt::BF16 : ActFmt::F32;
  p.mt = M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : M <= 8 ? 8 : 16;
  // more tokens than one pass: one item per (rows, MT tokens) instead of every item walking all M
  // (the F32 router over an 8K-token prefill took 16.8 ms a layer on an H200 that way)
  p.token_groups = (M + p.mt - 1) / p.mt;
  // one row per item where the default R leaves SMs idle (the router: 128 rows, 32 items of 4);
  // the same sums either way
  const int R = kernels::gemv_rows_per_item(p.mt);
  p.rows = !p.swiglu && p.mt <= 4 && int64_t(kernels::gemv_work_items(N, R)) * p.token_groups < device_sm_count() ? 1 : R;
  // prefill: 4 rows per item once such items still fill the GPU (the F32 router over 8K tokens read
  // each token group's activations 64 times at R = 2: 3.2 ms a layer on an H200)
  if (!p.swiglu && p.mt == 16 && p.wfmt != WeightFmt::FP8 &&
      int64_t(kernels::gemv_work_items(N, kernels::kGemvPrefillRows)) * p.token_groups >= 4 * int64_t(device_sm_count()))
    p.rows = kernels::kGemvPrefillRows;
  return p;
}

void launch(const kernels::GemvParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  switch (p.wfmt) {
    case WeightFmt::FP8: return launch_gemv_x<WeightFmt::FP8>(p, stream, opt);
    case WeightFmt::BF16: return launch_gemv_x<WeightFmt::BF16>(p, stream, opt);
    case WeightFmt::F32: return launch_gemv_x<WeightFmt::F32>(p, stream, opt);
  }
}

void gemv(const void* w, DType wdtype, const float* w_scale, int64_t ld_w, int N, int K, const ActIn& x, int M,
          float* y, int64_t ld_y, bool swiglu, float alpha, float limit, cudaStream_t stream) {
  launch(make_gemv_params(w, wdtype, w_scale, ld_w, N, K, x, M, y, ld_y, swiglu, alpha, limit), stream);
}

bool mma_stream_default() {
  static const bool on = [] {
    const char* e = std::getenv("M3_MMA_STREAM");
    return e && std::strcmp(e, "1") == 0;
  }();
  return on;
}

int mma_chains(int N, int K) { return kernels::mma_linear_chains(N, K, device_sm_count()); }

// Picked from a sweep on the H200 (tests/gpu/test_mma_linear.cpp, GpuMmaLinearBench): decode
// 1 x 1 (one wave of CTAs over all row tiles); 2 x 2 from 9 tokens (weights and activations each
// reused twice from registers); deep 4 x 4 once its CTA tiles (256 rows x 64 tokens) fill the device.
MmaTiling mma_tiling_for(int N, int K, int M) {
  (void)K;
  if (M <= kMmaDecodeRows) return {1, 1, false};
  // (deep: CTA tiles of kMmaDeepRows x kMmaDeepTokens, at least one wave of them)
  const int64_t deep_tiles = kernels::ceil_div(N, kernels::kMmaDeepRows) * kernels::ceil_div(M, kernels::kMmaDeepTokens);
  if (M > 64 && deep_tiles >= int64_t(device_sm_count())) return {4, 4, true};
  return {2, 2, false};
}

kernels::MmaLinearParams make_mma_linear_params(const void* w, DType wdtype, const float* w_scale, int64_t ld_w, int N,
                                                int K, const ActIn& x, int M, float* y, int64_t ld_y, bool swiglu,
                                                float alpha, float limit, MmaTiling tiling) {
  check_act(x, K, M, "mma_linear");
  M3_CHECK(wdtype == DType::F8_E4M3 || wdtype == DType::BF16, "mma_linear: weights must be F8_E4M3 or BF16, got {}",
           dtype_name(wdtype));
  check_weight_out(w, wdtype, w_scale, ld_w, N, K, y, ld_y, swiglu, "mma_linear");
  kernels::MmaLinearParams p;
  p.w = static_cast<const uint8_t*>(w);
  p.w_scale = w_scale;
  p.ld_w = ld_w;
  p.x = x.data;
  p.ld_x = x.ld;
  p.y = y;
  p.ld_y = ld_y;
  p.N = N;
  p.K = K;
  p.M = M;
  p.chains = mma_chains(N, K);
  p.swiglu = swiglu ? 1 : 0;
  p.alpha = alpha;
  p.limit = limit;
  if (tiling.rt == 0) tiling = mma_tiling_for(N, K, M);
  p.wfmt = weight_fmt(wdtype, "mma_linear");
  p.xfmt = x.dtype == DType::BF16 ? ActFmt::BF16 : ActFmt::F32;
  p.rt = tiling.rt;
  p.nt = tiling.nt;
  p.deep = tiling.deep ? 1 : 0;
  const bool stream = tiling.stream == 1 || (tiling.stream < 0 && mma_stream_default());
  p.stream = stream && !p.deep && p.rt == 1 && p.nt == 1 && p.wfmt == WeightFmt::FP8 ? 1 : 0;
  static_assert(kernels::mma_wide_smem_floats(4, 1, kernels::kMmaMaxChains) * 4 <= 48 * 1024 &&
                    kernels::mma_wide_smem_floats(2, 2, kernels::kMmaMaxChains) * 4 <= 48 * 1024,
                "a wide tile needs more than the default shared memory");
  return p;
}

namespace {
EnvSwitch g_split_act("M3_SPLIT_ACT");
}  // namespace

bool split_activations_enabled() { return g_split_act.on(); }

void set_split_activations(int on) { g_split_act.set(on); }

bool use_split_activations(kernels::MmaLinearParams& p, const void* xs) {
  if (!xs || !split_activations_enabled() || p.wfmt != WeightFmt::FP8 || p.xfmt != ActFmt::F32 || p.deep ||
      p.stream || p.rt != 1 || p.nt != 1)
    return false;
  M3_CHECK(reinterpret_cast<uintptr_t>(xs) % 16 == 0 && p.ld_x % 4 == 0,
           "mma_linear: split activations need 16-byte aligned rows (ld {} elements)", p.ld_x);
  p.x = xs;
  p.xfmt = ActFmt::F32Split;
  return true;
}

namespace {

// The split-activation decode tile's whole walk: NG register groups of U blocks (1 KB each, a warp),
// NG - 1 in flight while one is multiplied. Default 4x1 (kernels/mma_common.cuh walk_groups; H100
// 2026-12-07: qkv / O at M = 1 -4 to -6% against 2x2, native b=1 -0.1 to -1.1%, docs/perf.md);
// M3_MMA_WALK=2x2 (walk_two_groups of kWholeU = 2, the walk before), 3x1 or 3x2 for side-by-side
// runs. The same bits either way. Read once.
int mma_walk() {
  static const int w = env_choice("M3_MMA_WALK", {"2x2", "3x1", "4x1", "3x2"}, "4x1");
  return w;
}

template <int NORM>
void launch_split_decode(const kernels::MmaLinearParams& p, const kernels::WorkShape& sh, cudaStream_t stream,
                         const LaunchOptions& opt) {
  using kernels::MmaDecodeOp;
  constexpr WeightFmt F = WeightFmt::FP8;
  constexpr ActFmt S = ActFmt::F32Split;
  switch (mma_walk()) {
    case 1: return launch_op<MmaDecodeOp<F, S, NORM, 3, 1>>(p, sh, stream, "mma_linear", opt);
    case 2: return launch_op<MmaDecodeOp<F, S, NORM, 4, 1>>(p, sh, stream, "mma_linear", opt);
    case 3: return launch_op<MmaDecodeOp<F, S, NORM, 3, 2>>(p, sh, stream, "mma_linear", opt);
    default: return launch_op<MmaDecodeOp<F, S, NORM>>(p, sh, stream, "mma_linear", opt);
  }
}

}  // namespace

void launch(const kernels::MmaLinearParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  if (p.xfmt == ActFmt::F32Split) {  // (use_split_activations: the FP8 decode tile only)
    M3_CHECK(p.wfmt == WeightFmt::FP8 && !p.deep && !p.stream && p.rt == 1 && p.nt == 1,
             "mma_linear: split activations feed the FP8 decode tile's register walk only ({} tiling {} x {}{})",
             p.wfmt == WeightFmt::FP8 ? "FP8" : "not FP8", p.rt, p.nt, p.deep ? " deep" : p.stream ? " streamed" : "");
    const kernels::WorkShape sh = kernels::mma_linear_shape(p);
    switch (kernels::mma_norm_mode(p)) {
      case kernels::kNormIn: return launch_split_decode<kernels::kNormIn>(p, sh, stream, opt);
      case kernels::kNormOut: return launch_split_decode<kernels::kNormOut>(p, sh, stream, opt);
      default: return launch_split_decode<kernels::kNormNone>(p, sh, stream, opt);
    }
  }
  if (p.wfmt == WeightFmt::FP8) {
    if (p.xfmt == ActFmt::BF16) launch_mma<WeightFmt::FP8, ActFmt::BF16>(p, stream, opt);
    else launch_mma<WeightFmt::FP8, ActFmt::F32>(p, stream, opt);
  } else if (p.wfmt == WeightFmt::MXFP8) {
    M3_CHECK(p.w_mx && !p.stream, "mma_linear: MXFP8 needs its block scales and the register walk");
    if (p.xfmt == ActFmt::BF16) launch_mma<WeightFmt::MXFP8, ActFmt::BF16>(p, stream, opt);
    else launch_mma<WeightFmt::MXFP8, ActFmt::F32>(p, stream, opt);
  } else {
    if (p.xfmt == ActFmt::BF16) launch_mma<WeightFmt::BF16, ActFmt::BF16>(p, stream, opt);
    else launch_mma<WeightFmt::BF16, ActFmt::F32>(p, stream, opt);
  }
}

void mma_linear(const void* w, DType wdtype, const float* w_scale, int64_t ld_w, int N, int K, const ActIn& x, int M,
                float* y, int64_t ld_y, bool swiglu, float alpha, float limit, cudaStream_t stream, MmaTiling tiling) {
  launch(make_mma_linear_params(w, wdtype, w_scale, ld_w, N, K, x, M, y, ld_y, swiglu, alpha, limit, tiling), stream);
}

kernels::MmaLinearParams make_fp8_linear_params(const Fp8Weight& w, const ActIn& x, int M, float* y, int64_t ld_y,
                                                MmaTiling tiling) {
  const bool mx = w.mx != nullptr;
  M3_CHECK(!mx || !w.scales, "mma_linear: MXFP8 weight [{} x {}] has block scales; row scales must be null", w.rows,
           w.cols);
  M3_CHECK(!mx || w.ld_mx >= (w.cols + 31) / 32, "mma_linear: MXFP8 weight [{} x {}] needs {} scale bytes a row (ld_mx {})",
           w.rows, w.cols, (w.cols + 31) / 32, w.ld_mx);
  if (mx) tiling.stream = 0;  // (the producer-warp walk reads FP8 row scales only)
  // (MXFP8: the row-scale check is the block scales' one above; a non-null placeholder passes it)
  static const float kNoRowScale = 1.f;
  kernels::MmaLinearParams p = make_mma_linear_params(w.codes, DType::F8_E4M3, mx ? &kNoRowScale : w.scales, w.ld,
                                                      w.rows, w.cols, x, M, y, ld_y, false, 0, 0, tiling);
  if (mx) {
    p.wfmt = WeightFmt::MXFP8;
    p.w_scale = nullptr;
    p.w_mx = w.mx;
    p.ld_mx = w.ld_mx;
  }
  if (w.tiled) {
    M3_CHECK(w.ld % kTileBlockBytes == 0, "mma_linear: tiled FP8 weight [{} x {}] needs ld % {} == 0 (ld {})", w.rows,
             w.cols, kTileBlockBytes, w.ld);
    p.tiled = 1;
  }
  return p;
}

void linear_fp8(const Fp8Weight& w, const ActIn& x, int M, float* y, int64_t ld_y, cudaStream_t stream,
                LinearPath path) {
  if (path == LinearPath::Gemv) {
    M3_CHECK(!w.tiled, "gemv: FP8 weight [{} x {}] is tiled; the GEMV reads row-major weights only", w.rows, w.cols);
    M3_CHECK(!w.mx, "gemv: FP8 weight [{} x {}] is MXFP8; the GEMV reads row-scaled FP8 only", w.rows, w.cols);
    gemv(w.codes, DType::F8_E4M3, w.scales, w.ld, w.rows, w.cols, x, M, y, ld_y, false, 0, 0, stream);
  } else {
    launch(make_fp8_linear_params(w, x, M, y, ld_y), stream);
  }
}

void linear_dense(const DenseWeight& w, const ActIn& x, int M, float* y, int64_t ld_y, cudaStream_t stream,
                  LinearPath path) {
  if (path == LinearPath::Gemv || w.dtype == DType::F32)
    gemv(w.data, w.dtype, nullptr, w.ld, w.rows, w.cols, x, M, y, ld_y, false, 0, 0, stream);
  else
    mma_linear(w.data, w.dtype, nullptr, w.ld, w.rows, w.cols, x, M, y, ld_y, false, 0, 0, stream);
}

void dense_mlp(const DenseWeight& gate_up, const DenseWeight& down, const ActIn& x, int M, float alpha, float limit,
               float* h, int64_t ld_h, float* out, int64_t ld_out, cudaStream_t stream, LinearPath path) {
  const int I = gate_up.rows / 2;
  M3_CHECK(gate_up.rows % 2 == 0 && down.cols == I && down.rows == gate_up.cols,
           "dense_mlp: gate_up [{} x {}] and down [{} x {}] do not match", gate_up.rows, gate_up.cols, down.rows,
           down.cols);
  M3_CHECK(ld_h >= I && ld_h % 4 == 0, "dense_mlp: h ld {} must be >= {} and a multiple of 4", ld_h, I);
  if (path == LinearPath::Gemv || gate_up.dtype == DType::F32)
    gemv(gate_up.data, gate_up.dtype, nullptr, gate_up.ld, gate_up.rows, gate_up.cols, x, M, h, ld_h, true, alpha,
         limit, stream);
  else
    mma_linear(gate_up.data, gate_up.dtype, nullptr, gate_up.ld, gate_up.rows, gate_up.cols, x, M, h, ld_h, true,
               alpha, limit, stream);
  ActIn hin{h, DType::F32, ld_h};
  linear_dense(down, hin, M, out, ld_out, stream, path);
}

}  // namespace m3::native
