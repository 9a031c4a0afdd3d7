// The qkv projection whose last item of each head runs that head's norm + RoPE + cache insert
// (kernels/mma_rope.cuh): decode plans of at most kMmaDecodeRows tokens whose qkv tile reads split
// activations (layer_plan.cpp), one op instead of qkv then rope_cache.
#pragma once
#include <cstdint>

#include "kernels/mma_rope_params.h"
#include "native/launch.h"

namespace m3::native {

// The fused op over the projection mma and the rope op rope (mma_rope_fits; a refusal names what
// does not fit); arrivals: rope.vectors_per_token() ints, 0 (the backend's Activations::rope_arrivals,
// zeroed once; the last item of each vector resets its counter).
kernels::MmaRopeParams make_mma_rope_params(const kernels::MmaLinearParams& mma,
                                            const kernels::QkNormRopeCacheParams& rope, int32_t* arrivals);
// Whether decode plans fuse the rope into the qkv projection: off unless M3_ROPE_LAST=1 (the same
// bits either way; measured slower on the H100, 2026-12-07: native b=1 +117 us, b=4 +311, mono
// +178 / +189 over 60 layers). set_mma_rope overrides it for the plans built from now on (0 off, 1 on, -1 back
// to the environment's).
bool mma_rope_enabled();
void set_mma_rope(int on);

// Native runs the projection's whole walk at 4 x 1 (native/linear.cu's default M3_MMA_WALK).
void launch(const kernels::MmaRopeParams& p, cudaStream_t stream, const LaunchOptions& opt = {});

}  // namespace m3::native
