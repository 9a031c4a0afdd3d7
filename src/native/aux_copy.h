// The residual stream entering a layer whose input norm is an op of its own, taken before that op
// runs (the auxiliary hidden states of native/aux_capture.h where a runner ran the norm): dst rows
// = x + residual, the one fp32 add the norm's kernel makes first (kernels/rmsnorm.cuh: r = x +
// residual; IEEE addition is commutative bit for bit), so the bits act.x holds after that norm.
#pragma once
#include <cstdint>

typedef struct CUstream_st* cudaStream_t;

namespace m3::native {

// dst[r][0, n) = x[r][0, n) + residual[r][0, n) for r < rows (leading dimensions in floats).
void copy_residual_sum(const float* x, int64_t ld_x, const float* residual, int64_t ld_res, int rows, int n, float* dst,
                       int64_t ld_dst, cudaStream_t stream);

}  // namespace m3::native
