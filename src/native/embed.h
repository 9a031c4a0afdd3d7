// Embedding gather (kernels/embedding.cuh): rows of the BF16 table for M token ids, to fp32 and/or
// bf16. Ids outside [0, V) give NaN rows (no out-of-bounds reads).
#pragma once
#include "kernels/embedding_params.h"
#include "native/launch.h"

namespace m3::native {

kernels::EmbedParams make_embed_params(const kernels::EmbedParams& p);  // checks
void launch(const kernels::EmbedParams& p, cudaStream_t stream, const LaunchOptions& opt = {});
void embed(const kernels::EmbedParams& p, cudaStream_t stream);  // make + launch

}  // namespace m3::native
