// Helpers of the whole-model GPU tests (test_cuda_backend.cpp, test_model_vs_ref.cpp): a model
// prepared on the device plus the same arena dequantized for the CPU reference, logits
// comparators (cosine, worst relative difference, top-1 margin) and the selection comparison that
// tells near-ties (flips between blocks whose scores agree within rounding) from real errors.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "model/prepare.h"
#include "model/synthetic.h"
#include "mono/mono.h"
#include "native/cuda_backend.h"
#include "native/cuda_check.h"
#include "native/prepared.h"
#include "ref/engine.h"
#include "runtime/backend.h"

namespace m3::test {

inline uint64_t model_test_seed() {
  if (const char* s = std::getenv("M3_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
}

// The test data folder: $M3_TEST_DATA when set (the GPU machine runs binaries built elsewhere, in
// another checkout path), else the source tree's tests/data.
inline std::filesystem::path test_data_dir() {
  if (const char* d = std::getenv("M3_TEST_DATA")) return d;
  return M3_TEST_DATA;
}

struct PreparedModel {
  ModelSpec spec;
  std::shared_ptr<native::PreparedWeights> pw;
  ModelWeights deq;  // the arena dequantized to fp32: what the CPU reference runs on
};

inline PreparedModel prepare_from_memory(const ModelSpec& spec, const ModelWeights& w) {
  native::PrepareLoadOptions lo;
  lo.progress = false;
  auto src = make_weight_source(w);
  PreparedModel m;
  m.spec = spec;
  m.pw = native::PreparedWeights::create(spec, *src, {}, lo);
  m.deq = dequantize_prepared(m.pw->layout(), m.pw->reader());
  return m;
}

inline PreparedModel prepare_from_dir(const std::filesystem::path& dir) {
  native::PrepareLoadOptions lo;
  lo.progress = false;
  PreparedModel m;
  m.pw = native::PreparedWeights::load(dir, {}, lo);
  m.spec = m.pw->spec();
  m.deq = dequantize_prepared(m.pw->layout(), m.pw->reader());
  return m;
}

// A CUDA backend over m with the mono path added (a refusal of mono's creation fails the test).
inline std::unique_ptr<native::CudaBackend> with_mono(const PreparedModel& m, const native::CudaBackendOptions& o,
                                                      const mono::MonoOptions& mo = {}) {
  auto be = native::make_cuda_backend(m.pw, o);
  auto r = mono::create(be->model(), mo);
  if (auto* refusal = std::get_if<mono::Refusal>(&r)) ADD_FAILURE() << refusal->text();
  else be->add_layer_range_runner(std::move(std::get<std::unique_ptr<mono::MonoRunner>>(r)));
  return be;
}

inline std::unique_ptr<Backend> ref_backend(const PreparedModel& m, int blocks) {
  return ref::make_ref_backend(m.spec, m.deq, ref::RefOptions{blocks, 0});
}

// The reference's routing margin of one FFN input row y (MoE layer weights L, in double): the
// k-th best expert's score (sigmoid + bias) minus the (k+1)-th's. A GPU row may route otherwise
// where it is tiny (a tie under the GPU's other summation order, not an error).
inline double router_topk_gap(const ModelSpec& spec, const LayerWeights& L, const float* y) {
  std::vector<double> choice(size_t(spec.num_experts));
  for (int e = 0; e < spec.num_experts; ++e) {
    double d = 0;
    for (int h = 0; h < spec.hidden; ++h) d += double(L.router.row(e)[h]) * y[h];
    choice[size_t(e)] = 1.0 / (1.0 + std::exp(-d)) + L.router_bias[size_t(e)];
  }
  std::sort(choice.begin(), choice.end(), std::greater<double>());
  return choice[size_t(spec.top_k) - 1] - choice[size_t(spec.top_k)];
}

inline double cosine(const float* a, const float* b, int n) {
  double ab = 0, aa = 0, bb = 0;
  for (int i = 0; i < n; ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  if (!(aa > 0 && bb > 0)) return (aa == 0 && bb == 0) ? 1.0 : 0.0;
  return ab / std::sqrt(aa * bb);  // NaN in a propagates (and fails any >= check)
}

// max |got - ref| / max |ref| (NaN in got -> +inf).
inline double rel_maxdiff(const float* got, const float* ref, int n) {
  double md = 0, mx = 0;
  for (int i = 0; i < n; ++i) {
    const double d = std::fabs(double(got[i]) - ref[i]);
    if (std::isnan(d)) return INFINITY;
    md = std::max(md, d);
    mx = std::max(mx, double(std::fabs(ref[i])));
  }
  return mx > 0 ? md / mx : md;
}

inline int argmax_of(const float* x, int n) {
  int b = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[b]) b = i;
  return b;
}

inline double top1_margin(const float* x, int n) {
  const int b = argmax_of(x, n);
  double second = -INFINITY;
  for (int i = 0; i < n; ++i)
    if (i != b) second = std::max(second, double(x[i]));
  return double(x[b]) - second;
}

// Running statistics over the logits rows of a run.
struct LogitsStats {
  int rows = 0, argmax_diff = 0;
  double min_cos = 1, max_rel = 0;
  std::vector<double> cos;  // every row's cosine
  std::string first_diff;  // first argmax difference: row, ids, the reference's top-1 margin
  double median_cos() const {
    if (cos.empty()) return 1;
    std::vector<double> c = cos;
    std::nth_element(c.begin(), c.begin() + ptrdiff_t(c.size() / 2), c.end());
    return c[c.size() / 2];
  }
  void add(const float* got, const float* ref, int V, const std::string& where) {
    ++rows;
    cos.push_back(cosine(got, ref, V));
    min_cos = std::min(min_cos, cos.back());
    max_rel = std::max(max_rel, rel_maxdiff(got, ref, V));
    const int ag = argmax_of(got, V), ar = argmax_of(ref, V);
    if (ag != ar) {
      if (argmax_diff++ == 0) {
        char buf[256];
        std::snprintf(buf, sizeof buf, "%s: got %d ref %d, reference top-1 margin %.4g (max|ref| scale)", where.c_str(),
                      ag, ar, top1_margin(ref, V));
        first_diff = buf;
      }
    }
  }
};

// Selections compared as sets per (sparse layer, token, group). A row whose sets differ is a
// near-tie when the blocks only the GPU chose and the blocks only the reference chose have GPU
// block scores within tie_rel of each other, relative to the row's largest |score|.
struct SelectionStats {
  int64_t rows = 0, differ = 0, near_ties = 0, real = 0;
  double worst_gap = 0;  // largest relative gap among differing rows
  std::string first_real;
};

inline SelectionStats compare_selections(const SelectionTrace& got, const SelectionTrace& ref,
                                         const native::BlockScoreTrace* scores, double tie_rel) {
  SelectionStats st;
  if (got.layers != ref.layers) {
    st.real = 1;
    st.first_real = "different sparse layer lists";
    return st;
  }
  for (size_t k = 0; k < got.layers.size(); ++k) {
    const auto& G = got.blocks[k];
    const auto& R = ref.blocks[k];
    if (G.size() != R.size()) {
      ++st.real;
      st.first_real = "layer " + std::to_string(got.layers[k]) + ": token counts differ";
      continue;
    }
    for (size_t t = 0; t < G.size(); ++t)
      for (size_t g = 0; g < G[t].size(); ++g) {
        ++st.rows;
        std::vector<int32_t> a = G[t][g], b = R[t][g];
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        if (a == b) continue;
        ++st.differ;
        std::vector<int32_t> only_gpu, only_ref;
        std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(only_gpu));
        std::set_difference(b.begin(), b.end(), a.begin(), a.end(), std::back_inserter(only_ref));
        double gap = INFINITY;
        if (scores && only_gpu.size() == only_ref.size()) {
          const auto& sc = scores->scores[k][t][g];
          double mx = 0, lo = INFINITY, hi = -INFINITY;
          for (float s : sc)
            if (std::isfinite(s)) mx = std::max(mx, double(std::fabs(s)));
          for (int32_t blk : only_gpu) lo = std::min(lo, double(sc[size_t(blk)]));
          for (int32_t blk : only_ref) hi = std::max(hi, double(sc[size_t(blk)]));
          gap = mx > 0 ? std::fabs(lo - hi) / mx : INFINITY;
        }
        st.worst_gap = std::max(st.worst_gap, gap);
        if (gap <= tie_rel) {
          ++st.near_ties;
        } else if (st.real++ == 0) {
          st.first_real = "layer " + std::to_string(got.layers[k]) + " token " + std::to_string(t) + " group " +
                          std::to_string(g) + ": relative score gap " + std::to_string(gap);
        }
      }
  }
  return st;
}

}  // namespace m3::test
