// Path registry, case block tables, and the built-in "stream" path (step_runner.h).
#include "bench/cuda/step_runner.h"

#include <fmt/format.h>

#include <map>

#include "bench/cuda/probes.h"
#include "mono/options.h"
#include "native/cuda_check.h"

namespace m3::bench {

int blocks_per_row(const BenchCase& c, int block_size) {
  return int((c.max_len() + block_size - 1) / block_size);
}
std::vector<int32_t> row_block_table(const BenchCase& c, int block_size, int row) {
  const int w = blocks_per_row(c, block_size);
  std::vector<int32_t> t(static_cast<size_t>(w));
  for (int i = 0; i < w; ++i) t[size_t(i)] = row * w + i;
  return t;
}

namespace {

std::vector<std::pair<std::string, StepRunnerFactory>>& registry() {
  static std::vector<std::pair<std::string, StepRunnerFactory>> r;
  return r;
}

// The step's bytes as plain-read segment lists (stream: one list per op; flat: one list for the
// sparse layer range, one for the rest).
class ReadRunner final : public StepRunner {
 public:
  ReadRunner(const StepEnv& env, bool flat) : env_(env), flat_(flat) {
    const ModelSpec& sp = *env.spec;
    sparse_first_ = sp.num_layers;
    while (sparse_first_ > 0 && sp.sparse(sparse_first_ - 1) && sp.moe(sparse_first_ - 1)) --sparse_first_;
  }
  std::string name() const override { return flat_ ? "flat" : "stream"; }

  void setup(const BenchCase& c, cudaStream_t s) override {
    reader_.clear();
    ops_ = step_ops(*env_.layout, c, env_.bytes_opt, true, env_.seed);
    const auto& sh = env_.cache->shape();
    const int rows = c.is_prefill() ? 1 : c.batch;
    const int64_t w = blocks_per_row(c, sh.block_size);
    M3_CHECK(int64_t(rows) * w <= sh.num_blocks, "bench {}: {} needs {} cache blocks, the cache has {}", name(),
             c.label(), int64_t(rows) * w, sh.num_blocks);
    const CacheBytes cb = cache_bytes_per_token(*env_.layout, env_.bytes_opt);
    bytes_ = 0;
    lists_.clear();
    std::vector<ReadSeg> sparse, other;
    for (const StepOp& op : ops_) {
      std::vector<ReadSeg> segs;
      for (const Region& r : op.regions) {
        if (r.space == Space::Arena) {
          segs.push_back(ReadSeg{env_.arena + r.begin, uint64_t(r.count)});
          continue;
        }
        native::KvLayerView v = env_.cache->layer(r.layer);
        const int64_t slot = int64_t(r.row) * w * sh.block_size + r.begin;
        const double per = r.space == Space::IKCache ? cb.ik : cb.kv;
        const uint8_t* base = static_cast<const uint8_t*>(r.space == Space::KCache   ? v.k
                                                          : r.space == Space::VCache ? v.v
                                                                                     : v.ik);
        M3_CHECK(base != nullptr, "bench {}: layer {} has no such cache", name(), r.layer);
        segs.push_back(ReadSeg{base + int64_t(double(slot) * per), uint64_t(double(r.count) * per)});
      }
      if (!flat_) {
        lists_.push_back(reader_.add(segs));
        bytes_ += double(reader_.bytes(lists_.back()));
      } else {
        auto& to = op.layer >= sparse_first_ ? sparse : other;
        to.insert(to.end(), segs.begin(), segs.end());
      }
    }
    if (flat_) {
      for (const auto* l : {&other, &sparse}) {
        lists_.push_back(reader_.add(*l));
        bytes_ += double(reader_.bytes(lists_.back()));
      }
      sparse_mb_ = double(reader_.bytes(lists_[1])) / 1e6;
    }
    enqueue(s, nullptr);
    M3_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  void enqueue(cudaStream_t s, OpRecorder* rec) override {
    if (flat_) {
      if (rec) rec->mark(s, "flat_other", -1);
      reader_.read(lists_[0], s);
      if (rec) rec->mark(s, "flat_sparse", -1);
      reader_.read(lists_[1], s);
      return;
    }
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (rec) rec->mark(s, ops_[i].op.c_str(), ops_[i].layer);
      reader_.read(lists_[i], s);
    }
  }
  double path_bytes() const override { return bytes_; }
  std::string note() const override {
    if (flat_)
      return fmt::format("plain cold read of the step's bytes in two launches: flat_other (embedding, dense layers, "
                         "lm_head) and flat_sparse (the {} MB of layers {} ..: what a fused sparse range could reach at "
                         "best)",
                         sparse_mb_, sparse_first_);
    return "plain cold read of the step's bytes, one launch per op (experts: a random set of round(expected) slots)";
  }

 private:
  StepEnv env_;
  bool flat_;
  int sparse_first_ = 0;
  double sparse_mb_ = 0;
  SegmentReader reader_;
  std::vector<StepOp> ops_;
  std::vector<int> lists_;
  double bytes_ = 0;
};

}  // namespace

void register_step_path(const std::string& name, StepRunnerFactory f) {
  for (auto& [n, g] : registry())
    if (n == name) {
      g = std::move(f);
      return;
    }
  registry().emplace_back(name, std::move(f));
}

std::vector<std::string> step_path_names() {
  std::vector<std::string> n;
  for (auto& [k, f] : registry()) n.push_back(k);
  return n;
}

StepRunnerFactory step_path(const std::string& name) {
  for (auto& [k, f] : registry())
    if (k == name) return f;
  if (name.rfind("mono:", 0) == 0) {  // a variant: mono with options (mono/options.h)
    const mono::MonoOptions o = mono::parse_options(name.substr(5));
    return [o, name](const StepEnv& env) { return make_mono_runner(env, o, name); };
  }
  std::string known;
  for (auto& [k, f] : registry()) known += (known.empty() ? "" : ", ") + k;
  M3_FAIL("bench: path '{}' is not available in this build (known: {})", name, known);
}

std::unique_ptr<StepRunner> make_stream_runner(const StepEnv& env) { return std::make_unique<ReadRunner>(env, false); }

void register_builtin_paths() {
  register_step_path("stream", make_stream_runner);
  register_step_path("flat", [](const StepEnv& env) { return std::make_unique<ReadRunner>(env, true); });
  register_step_path("native", make_native_runner);
  register_step_path("mono", [](const StepEnv& env) { return make_mono_runner(env, mono::MonoOptions{}, "mono"); });
}

}  // namespace m3::bench
