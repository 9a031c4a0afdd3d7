// The built-in "tiny" synthetic model and a CPU reference backend over it, built once per test
// binary (the scheduler and step-sampling tests share it).
#pragma once
#include <memory>

#include "model/synthetic.h"
#include "ref/engine.h"
#include "runtime/backend.h"

namespace m3::test {

struct TinyReference {
  ModelSpec spec = synthetic_preset("tiny");
  ModelWeights weights = synthetic_weights(spec);
  // A CPU reference backend with `blocks` cache blocks, 2 threads.
  std::unique_ptr<Backend> backend(int blocks) const { return ref::make_ref_backend(spec, weights, {blocks, 2}); }
};

inline const TinyReference& tiny() {
  static TinyReference t;
  return t;
}

}  // namespace m3::test
