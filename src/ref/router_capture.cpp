#include "ref/router_capture.h"

#include <algorithm>

#include "core/check.h"
#include "ref/engine.h"
#include "ref/greedy_run.h"

namespace m3::ref {

RouterCapture capture_router_inputs(const ModelSpec& spec, ModelWeights w, const std::vector<int32_t>& prompt,
                                    int decode, const std::vector<int>& layers, const CaptureOptions& opt) {
  M3_CHECK(decode >= 0, "router capture: decode tokens must be >= 0, got {}", decode);
  for (size_t i = 0; i < layers.size(); ++i) {
    const int l = layers[i];
    M3_CHECK(l >= 0 && l < spec.num_layers, "router capture: layer {} outside [0, {})", l, spec.num_layers);
    M3_CHECK(spec.moe(l), "router capture: layer {} is a dense layer (no router)", l);
    M3_CHECK(std::count(layers.begin(), layers.end(), l) == 1, "router capture: layer {} listed twice", l);
  }
  RouterCapture cap;
  cap.hidden = spec.hidden;
  cap.layers = layers;
  cap.rows.resize(layers.size());
  const int steps = decode + 1;
  const int64_t positions = greedy_positions(prompt.size(), steps);
  RefOptions ro(int((positions + spec.index_block - 1) / spec.index_block), opt.threads);
  ro.ffn_tap = [&cap](int layer, const float* y, int n_tok) {
    auto it = std::find(cap.layers.begin(), cap.layers.end(), layer);
    if (it == cap.layers.end()) return;
    auto& dst = cap.rows[size_t(it - cap.layers.begin())];
    dst.insert(dst.end(), y, y + size_t(n_tok) * size_t(cap.hidden));
  };
  auto b = make_ref_backend(spec, std::move(w), ro);
  GreedyOptions go;
  go.progress = opt.progress;
  GreedyRun run = greedy_run(*b, prompt, steps, go);
  cap.tokens = prompt;
  cap.tokens.insert(cap.tokens.end(), run.tokens.begin(), run.tokens.end() - 1);  // the last one is not fed
  for (const auto& r : cap.rows)
    M3_CHECK(r.size() == size_t(cap.n_rows()) * size_t(cap.hidden), "router capture: {} values for {} rows of {}",
             r.size(), cap.n_rows(), cap.hidden);
  return cap;
}

}  // namespace m3::ref
