// The RMS norm in two halves (m3-model.md, "Norm": y = r / sqrt(mean(r^2) + eps) * (1 + w)), so
// that it can be fused into its neighbours; used by the input norm of every layer and the
// post-attention norm of the MoE layers, at every batch size (the same bits whoever computes
// each half: batch invariance).
//   prep (the RmsNorm op's prep mode, or fused into the op that produces the residual update,
//   NormOut): r = res + v (stored back into the residual stream), z = r * (1 + w) (the consumers'
//   input), and the chunk sums of r^2: chunk c = elements 16c .. 16c + 15, summed as the tree
//   ((q0 + q8) + (q4 + q12)) + ((q2 + q10) + (q6 + q14)) + ... (the butterfly xor 8, 4, 2, 1 of
//   q_e = r_e * r_e, norm_chunk_tree).
//   inv_t = 1 / sqrt(S_t / n + eps), S_t = the chunk sums added in a fixed order (norm_inv_warp).
//   The prep op writes inv (NormIn::inv); a fused producer writes the chunk sums and each consumer
//   computes inv from them (NormIn::ss): the same function of the same sums, so the same bits.
//   consumer (NormIn): every output value of token t (before any SwiGLU) is multiplied by inv_t:
//   (W z) inv = W y up to rounding. A token's value depends only on its own row.
// Layouts: res, z [M][ld] fp32; ss [M][n / kNormChunk] fp32; inv [M] fp32; w [n] bf16.
#pragma once
#include <cstdint>

#include "kernels/work.h"

namespace m3::kernels {

constexpr int kNormChunk = 16;         // elements per chunk sum of squares
constexpr int kFusedNormMaxRows = 8;   // tokens a consumer computes inv for (NormIn::ss)

struct NormOut {
  float* res = nullptr;          // [M][ld] residual stream, read and written
  const uint16_t* w = nullptr;   // [n] the norm's weight
  float* z = nullptr;            // [M][ld] r * (1 + w)
  float* ss = nullptr;           // [M][n / kNormChunk]
  uint16_t* zs = nullptr;        // optional [M][2 ld]: z split for a decode tile (kernels/act_split.cuh)
  int64_t ld = 0;
  int n = 0;
};

// Exactly one of ss / inv is set when the consumer's input is a prepared z; neither otherwise.
struct NormIn {
  const float* ss = nullptr;   // [rows][n / kNormChunk]: inv computed by the consumer
  const float* inv = nullptr;  // [rows]: inv computed by the prep op
  int n = 0;
  int rows = 0;                // tokens (ss: <= kFusedNormMaxRows)
  float eps = 0.f;
};

M3_HOST_DEVICE constexpr int norm_chunks(int n) { return n / kNormChunk; }

}  // namespace m3::kernels
