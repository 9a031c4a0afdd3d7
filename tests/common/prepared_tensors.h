// Every non-empty tensor of a prepared layout (model/prepare.h): one layer's, or the whole arena's
// (embedding, lm_head, final norm, then layer by layer), for the tests that walk them all.
#pragma once
#include <vector>

#include "model/prepare.h"

namespace m3::test {

inline std::vector<const PTensor*> layer_tensors(const PreparedLayerLayout& Y) {
  std::vector<const PTensor*> v;
  for (const PTensor* t : {&Y.input_norm, &Y.post_norm, &Y.q_norm, &Y.k_norm, &Y.iq_norm, &Y.ik_norm, &Y.qkv.codes,
                           &Y.qkv.scales, &Y.o.codes, &Y.o.scales, &Y.dense_gate_up, &Y.dense_down, &Y.router,
                           &Y.router_bias, &Y.w13.codes, &Y.w13.scales, &Y.w2.codes, &Y.w2.scales,
                           &Y.shared_w13.codes, &Y.shared_w13.scales, &Y.shared_w2.codes, &Y.shared_w2.scales})
    if (!t->empty()) v.push_back(t);
  return v;
}

inline std::vector<const PTensor*> prepared_tensors(const PreparedLayout& L) {
  std::vector<const PTensor*> v;
  for (const PTensor* t : {&L.embed, &L.lm_head, &L.final_norm})
    if (!t->empty()) v.push_back(t);
  for (const auto& Y : L.layers)
    for (const PTensor* t : layer_tensors(Y)) v.push_back(t);
  return v;
}

}  // namespace m3::test
