// The MoE feed-forward of one layer on the device (m3-model.md, "FFN"), any number of tokens:
//   logits = Wr y (fp32; router weight F32 or BF16)  -> top-k select -> group pairs by expert
//   -> per active expert: h = swiglu_oai(W13 y) for its tokens -> y_p = W2 h (MXFP4)
//   -> out[t] = shared(t) + sum_k w_k y_(t,k), summed in a fixed order (no atomics).
// Weights are views into the prepared arena (native/prepared.h); activations fp32.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "native/linear.h"
#include "native/op_call.h"

namespace m3::native {

// codes [slots][rows][ld] E2M1x2 (fp8: E4M3, the MXFP8 release's experts), scales [slots][rows][sld]
// E8M0 (one per 32 elements of a row)
struct Mxfp4Experts {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  int64_t ld = 0, sld = 0;
  int64_t slot_codes = 0, slot_scales = 0;  // bytes per slot
  int slots = 0, rows = 0, cols = 0;
  bool fp8 = false;
  bool empty() const { return codes == nullptr; }
};

struct MoeWeights {
  DenseWeight router;               // [E][H] F32 or BF16
  const float* router_bias = nullptr;  // [E]
  Mxfp4Experts w13, w2;             // [E (+1)][2I][H], [E (+1)][H][I]
  bool shared_in_slot = false;      // shared expert = slot E of w13 / w2
  Mxfp4Experts shared_w13, shared_w2;  // shared expert of its own width (slots 1), else empty
  int E = 0, K = 0;
  float routed_scale = 1.f, alpha = 1.702f, limit = 7.f;
  int hidden() const { return w13.cols; }
  int inter() const { return w2.cols; }
};

// Device views into a caller-owned workspace (moe_workspace_bytes(w, M) bytes).
struct MoeWorkspace {
  float* logits = nullptr;   // [M][E]
  int32_t* ids = nullptr;    // [M*K]
  float* weights = nullptr;  // [M*K]
  int32_t* pos_of = nullptr; // [M*K] pair of (token t, choice k) at t*K + k; the shared expert's
                             // pair of token t (when there is one) is M*K + t
  float* h = nullptr;        // [M*K + M][ld_h] SwiGLU outputs per pair
  int64_t ld_h = 0;          // floats: max(I, shared width) rounded up to 4
  float* y = nullptr;        // [M*K + M][H] expert outputs per pair
};
size_t moe_workspace_bytes(const MoeWeights& w, int M);
MoeWorkspace moe_workspace(const MoeWeights& w, int M, void* ws);

// The expert kernels (process-wide; tests and benchmarks). Auto: tensor cores (kernels/moe_mma.cuh),
// wide for decode and deep for prefill; Wide / Deep: that mode at any M (the same bits as Auto);
// Gemv: the CUDA-core kernel of kernels/moe_mxfp4.cuh (also chosen by M3_MOE_GEMV=1 in the
// environment when nothing was set).
enum class MoeKernel : int { Auto = 0, Wide = 1, Deep = 2, Gemv = 3 };
void moe_set_kernel(MoeKernel k);
MoeKernel moe_kernel();

// The layer's launches, in order, appended to ops (stage "moe", the given layer): "router" (the
// logits GEMV), "route" (select + group: one op for decode-sized batches, else two), "split"
// (tensor cores: x = hi + lo), "gate_up" (routed, then the shared expert when it has its own
// tensors), "down" (likewise), "combine". out[t, :] (t < M, ld_out) = FFN(x[t, :]); x fp32
// [M][ld_x] (16-byte aligned rows); ws: moe_workspace_bytes(w, M) bytes. All checks happen here.
// route_arrivals: an int32 counter at 0 (Activations::route_arrivals) lets a decode-sized plan fuse
// the route into the router GEMV (router_gemv_route_enabled(), kernels::router_gemv_route_fits);
// nullptr keeps the two ops.
void add_moe_ops(std::vector<OpCall>& ops, const MoeWeights& w, const float* x, int64_t ld_x, int M, float* out,
                 int64_t ld_out, void* ws, size_t ws_bytes, int layer = -1, int32_t* route_arrivals = nullptr);

// In a decode-sized plan (kernels::moe_down_combine_fits), the down op then the combine at the end of
// a layer's MoE ops become one MoeDownCombine op (kernels/moe_down_combine.cuh) where
// moe_down_combine_enabled() and the down op is the only one (no separate shared expert): true
// when it did. arrivals: `capacity` int32 counters at 0 (Activations::combine_arrivals), one per row
// tile of the down projection.
bool fuse_down_combine(std::vector<OpCall>& ops, int32_t* arrivals, int64_t capacity);
// Off unless M3_COMBINE_LAST=1 (the same bits either way; measured on the H100, 2026-12-07: native
// b=1 -14 us, b=4 +119 over 60 layers); set_moe_down_combine overrides it for the
// plans built from now on (0 off, 1 on, -1 back to the environment's).
bool moe_down_combine_enabled();
void set_moe_down_combine(int on);

// add_moe_ops, then each launched (tests, benchmarks).
void moe_forward(const MoeWeights& w, const float* x, int64_t ld_x, int M, float* out, int64_t ld_out, void* ws,
                 size_t ws_bytes, cudaStream_t stream);

// The expert ops' launches (op_call.cpp dispatches to these).
void launch(const kernels::MoeSplitParams& p, cudaStream_t stream, const LaunchOptions& opt = {});
void launch(const kernels::MoeMmaParams& p, cudaStream_t stream, const LaunchOptions& opt = {});
void launch(const kernels::MoeGemvParams& p, cudaStream_t stream, const LaunchOptions& opt = {});
void launch(const kernels::MoeCombineParams& p, cudaStream_t stream, const LaunchOptions& opt = {});
void launch(const kernels::MoeDownCombineParams& p, cudaStream_t stream, const LaunchOptions& opt = {});

}  // namespace m3::native
