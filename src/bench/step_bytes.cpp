// Step byte / FLOP accounting over a PreparedLayout (step_bytes.h).
#include "bench/step_bytes.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/check.h"

namespace m3::bench {

double expected_distinct_experts(int E, int k, int64_t tokens) {
  M3_CHECK(E >= 1 && k >= 1 && k <= E, "bench: top_k {} of {} experts", k, E);
  M3_CHECK(tokens >= 0, "bench: {} tokens", tokens);
  // P(a given expert is missed by one token) = 1 - k/E; tokens choose independently.
  return double(E) * (1.0 - std::pow(1.0 - double(k) / double(E), double(tokens)));
}

CacheBytes cache_bytes_per_token(const PreparedLayout& L, const StepBytesOptions& o) {
  CacheBytes c;
  c.kv = double(L.kv_heads) * L.spec.head_dim * double(dtype_size(o.kv_dtype));
  c.ik = double(L.spec.index_dim) * double(dtype_size(o.ik_dtype));
  return c;
}

namespace {

// K/V tokens a sparse-layer row of causal length len attends to: every token while the context
// has at most topk blocks, else topk - 1 full blocks plus its own (partial) block.
int64_t sparse_window(const ModelSpec& s, int64_t len) {
  const int64_t bs = s.index_block, nb = (len + bs - 1) / bs;
  if (nb <= s.index_topk) return len;
  return int64_t(s.index_topk - 1) * bs + ((len - 1) % bs + 1);
}

void add_tensor(StepOp& op, const PTensor& t, bool regions) {
  if (t.empty()) return;
  op.bytes += double(t.bytes);
  if (regions) op.regions.push_back(Region{Space::Arena, -1, -1, int64_t(t.offset), int64_t(t.bytes)});
}
void add_slot(StepOp& op, const PTensor& t, int slot, bool regions) {
  const uint64_t b = t.slot_bytes();
  op.bytes += double(b);
  if (regions) op.regions.push_back(Region{Space::Arena, -1, -1, int64_t(t.offset + uint64_t(slot) * b), int64_t(b)});
}

}  // namespace

std::vector<StepOp> step_ops(const PreparedLayout& L, const BenchCase& c, const StepBytesOptions& o, bool regions,
                             uint64_t seed) {
  const ModelSpec& s = L.spec;
  const int n = s.num_layers;
  M3_CHECK(o.experts_hit.empty() || int(o.experts_hit.size()) == n,
           "bench: experts_hit has {} entries for {} layers", o.experts_hit.size(), n);
  M3_CHECK(c.batch >= 1, "bench: batch {} < 1", c.batch);
  M3_CHECK(c.context >= 0 && c.prefill >= 0, "bench: context {} / prefill {} < 0", c.context, c.prefill);
  M3_CHECK(!c.is_prefill() || c.batch == 1, "bench: a prefill case has one request, got batch {}", c.batch);
  const CacheBytes cb = cache_bytes_per_token(L, o);
  const double T = double(c.tokens());
  const int rows = c.is_prefill() ? 1 : c.batch;
  const int64_t len = c.max_len();  // causal length of every decode row (its last token); T for the prefill request
  const double H = s.hidden, D = s.head_dim;
  std::mt19937_64 rng(seed);

  std::vector<StepOp> ops;
  {  // embedding rows of the new tokens (ids 0..T-1: distinct rows)
    StepOp e{"embed"};
    const int64_t nrow = std::min<int64_t>(c.tokens(), L.embed.rows);
    e.bytes = double(nrow) * double(L.embed.row_bytes);
    if (regions) e.regions.push_back(Region{Space::Arena, -1, -1, int64_t(L.embed.offset), int64_t(e.bytes)});
    ops.push_back(std::move(e));
  }
  for (int l = 0; l < n; ++l) {
    const PreparedLayerLayout& Y = L.layers[size_t(l)];
    StepOp norms{"norms", l};
    for (const PTensor* t : {&Y.input_norm, &Y.q_norm, &Y.k_norm, &Y.iq_norm, &Y.ik_norm, &Y.post_norm})
      add_tensor(norms, *t, regions);
    ops.push_back(std::move(norms));

    StepOp qkv{"qkv", l};
    add_tensor(qkv, Y.qkv.codes, regions);
    add_tensor(qkv, Y.qkv.scales, regions);
    qkv.flops = 2 * T * double(Y.qkv.codes.rows) * double(Y.qkv.codes.cols);
    ops.push_back(std::move(qkv));

    const double heads = double(L.heads);
    if (Y.sparse) {
      StepOp ik{"index_k", l};
      const double ih = double(L.index_heads), id = double(s.index_dim);
      if (c.is_prefill()) {
        ik.bytes = T * cb.ik;
        ik.flops = ih * id * T * (T + 1);  // sum over p of 2 * ih * id * (p + 1)
        if (regions) ik.regions.push_back(Region{Space::IKCache, l, 0, 0, c.prefill});
      } else {
        ik.bytes = double(rows) * double(len) * cb.ik;
        ik.flops = double(rows) * c.query * 2 * ih * id * double(len);  // (a verify row's tokens: ~len each)
        if (regions)
          for (int r = 0; r < rows; ++r) ik.regions.push_back(Region{Space::IKCache, l, r, 0, len});
      }
      ops.push_back(std::move(ik));
    }
    {
      StepOp kv{"kv", l};
      if (c.is_prefill()) {
        kv.bytes = 2 * T * cb.kv;
        double keys = 0;
        for (int64_t p = 0; p < c.prefill; ++p) keys += double(Y.sparse ? sparse_window(s, p + 1) : p + 1);
        kv.flops = 4 * heads * D * keys;
        if (regions) {
          kv.regions.push_back(Region{Space::KCache, l, 0, 0, c.prefill});
          kv.regions.push_back(Region{Space::VCache, l, 0, 0, c.prefill});
        }
      } else {
        const int64_t keys = Y.sparse ? sparse_window(s, len) : len;
        kv.bytes = double(rows) * 2 * double(keys) * cb.kv;
        kv.flops = double(rows) * c.query * 4 * heads * D * double(keys);
        if (regions)
          for (int r = 0; r < rows; ++r) {
            kv.regions.push_back(Region{Space::KCache, l, r, len - keys, keys});
            kv.regions.push_back(Region{Space::VCache, l, r, len - keys, keys});
          }
      }
      ops.push_back(std::move(kv));
    }
    StepOp op_o{"o", l};
    add_tensor(op_o, Y.o.codes, regions);
    add_tensor(op_o, Y.o.scales, regions);
    op_o.flops = 2 * T * double(Y.o.codes.rows) * double(Y.o.codes.cols);
    ops.push_back(std::move(op_o));

    if (!Y.moe) {
      StepOp d{"dense_mlp", l};
      add_tensor(d, Y.dense_gate_up, regions);
      add_tensor(d, Y.dense_down, regions);
      d.flops = 2 * T * (double(Y.dense_gate_up.rows) * double(Y.dense_gate_up.cols) +
                         double(Y.dense_down.rows) * double(Y.dense_down.cols));
      ops.push_back(std::move(d));
      continue;
    }
    const int E = s.num_experts, K = s.top_k;
    StepOp router{"router", l};
    add_tensor(router, Y.router, regions);
    add_tensor(router, Y.router_bias, regions);
    router.flops = 2 * T * double(E) * H;
    ops.push_back(std::move(router));

    const double hit = o.experts_hit.empty() ? expected_distinct_experts(E, K, c.tokens()) : o.experts_hit[size_t(l)];
    M3_CHECK(hit >= 0 && hit <= E, "bench: layer {}: {} experts hit of {}", l, hit, E);
    const double slot = double(Y.w13.codes.slot_bytes() + Y.w13.scales.slot_bytes() + Y.w2.codes.slot_bytes() +
                               Y.w2.scales.slot_bytes());
    const double expert_flops = 2 * (double(Y.w13.codes.rows) * double(Y.w13.codes.cols) +
                                     double(Y.w2.codes.rows) * double(Y.w2.codes.cols));
    StepOp ex{"experts", l};
    ex.bytes = hit * slot;
    ex.flops = T * K * expert_flops;
    if (regions) {
      std::vector<int> perm(static_cast<size_t>(E));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      perm.resize(size_t(std::lround(hit)));
      std::sort(perm.begin(), perm.end());
      StepOp tmp;
      for (int e : perm)
        for (const PTensor* t : {&Y.w13.codes, &Y.w13.scales, &Y.w2.codes, &Y.w2.scales}) add_slot(tmp, *t, e, true);
      ex.regions = std::move(tmp.regions);
    }
    ops.push_back(std::move(ex));

    StepOp sh{"shared_expert", l};
    if (Y.shared_in_slot) {
      for (const PTensor* t : {&Y.w13.codes, &Y.w13.scales, &Y.w2.codes, &Y.w2.scales}) add_slot(sh, *t, E, regions);
      sh.flops = T * expert_flops;
    } else if (!Y.shared_w13.codes.empty()) {
      for (const PTensor* t : {&Y.shared_w13.codes, &Y.shared_w13.scales, &Y.shared_w2.codes, &Y.shared_w2.scales})
        add_tensor(sh, *t, regions);
      sh.flops = 2 * T *
                 (double(Y.shared_w13.codes.rows) * double(Y.shared_w13.codes.cols) +
                  double(Y.shared_w2.codes.rows) * double(Y.shared_w2.codes.cols));
    }
    if (sh.bytes > 0) ops.push_back(std::move(sh));
  }
  StepOp head{"lm_head"};
  add_tensor(head, L.final_norm, regions);
  add_tensor(head, L.lm_head, regions);
  head.flops = 2 * double(rows) * double(L.lm_head.rows) * double(L.lm_head.cols);
  ops.push_back(std::move(head));
  return ops;
}

StepBytes step_bytes(const PreparedLayout& L, const BenchCase& c, const StepBytesOptions& o) {
  std::vector<StepOp> ops = step_ops(L, c, o, false);
  StepBytes b;
  b.expert_model = o.experts_hit.empty() ? "expected-random" : "given";
  int moe_layers = 0;
  for (const StepOp& op : ops) {
    auto it = std::find_if(b.ops.begin(), b.ops.end(), [&](const OpTotal& t) { return t.op == op.op; });
    if (it == b.ops.end()) it = b.ops.insert(b.ops.end(), OpTotal{op.op});
    it->bytes += op.bytes;
    it->flops += op.flops;
    it->count += 1;
    const bool cache = op.op == "kv" || op.op == "index_k";
    (cache ? b.cache : b.weights) += op.bytes;
    if (op.op == "kv") b.kv += op.bytes;
    if (op.op == "index_k") b.index_k += op.bytes;
    if (op.op == "lm_head") b.lm_head += op.bytes;
    if (op.op == "experts") {
      b.experts += op.bytes;
      ++moe_layers;
    }
    b.flops += op.flops;
  }
  b.total = b.weights + b.cache;
  if (moe_layers > 0) {
    double hits = 0;
    const ModelSpec& s = L.spec;
    for (int l = 0; l < s.num_layers; ++l)
      if (s.moe(l)) hits += o.experts_hit.empty() ? expected_distinct_experts(s.num_experts, s.top_k, c.tokens())
                                                  : o.experts_hit[size_t(l)];
    b.experts_hit_mean = hits / moe_layers;
  }
  return b;
}

}  // namespace m3::bench
