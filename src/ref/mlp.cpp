// mlp_forward(): gate and up projections, the activation, then the down projection.
#include "ref/mlp.h"

#include <algorithm>
#include <cmath>

#include "ref/linear.h"

namespace m3::ref {

float swiglu_oai(float gate, float up, float alpha, float limit) {
  double g = std::min(double(gate), double(limit));
  double u = std::clamp(double(up), -double(limit), double(limit));
  double sig = 1.0 / (1.0 + std::exp(-double(alpha) * g));
  return float((u + 1.0) * g * sig);
}

void mlp_forward(const MlpWeights& w, const float* x, int n_tok, float alpha, float limit, float* out,
                 ThreadPool& pool) {
  int H = w.gate.cols, I = w.gate.rows;
  std::vector<float> g(size_t(n_tok) * size_t(I)), u(g.size());
  linear(w.gate, x, H, n_tok, g.data(), I, pool);
  linear(w.up, x, H, n_tok, u.data(), I, pool);
  for (size_t i = 0; i < g.size(); ++i) g[i] = swiglu_oai(g[i], u[i], alpha, limit);
  linear(w.down, g.data(), I, n_tok, out, w.down.rows, pool);
}

}  // namespace m3::ref
