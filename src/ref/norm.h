// Gemma-style RMS norm, the only norm of the model: y = x / sqrt(mean(x^2) + eps) * (1 + w).
// Computed in double, stored as float.
#pragma once

namespace m3::ref {

// n elements; y may alias x. w has n entries.
void gemma_rms_norm(const float* x, const float* w, int n, float eps, float* y);

}  // namespace m3::ref
