// libFuzzer target: a whole checkpoint directory (model.safetensors.index.json plus 1-3 shard
// files, or one model.safetensors) through SafetensorsSet::open, the weight table binding and the
// CPU reference's loader (load_model_weights), against a fixed config.
//
// Contract: every input either loads, or fails with an m3::Error whose message names the file it
// is about (every loader message leads with a path inside the checkpoint directory). Nothing else
// may escape (no std::filesystem_error, json exception, out_of_range, bad_alloc), and no sanitizer
// report. A load that binds (with config.json's quantization_config when the input has one) must
// convert, unless a value no format may hold is refused (E8M0 255, an E4M3 NaN code): then
// load_model_weights succeeds and every weight it returns equals convert_to_f32 of the bound
// tensor, bitwise (micro config).
//
// Input format (a small container, so that mutations land in the JSON the loader reads rather
// than in megabytes of tensor data):
//   byte 0           flags: bits 0-1 = shard count n (0: a single model.safetensors, no index;
//                    1..3: n shards model-0000i-of-0000n.safetensors plus the index);
//                    bit 2 = config (0: "micro", a 2-layer model built like tiny; 1: the make-tiny
//                    "tiny" preset); bit 3 = a config.json (its text the next section after the
//                    index, whose quantization_config the binding reads). Other bits are ignored.
//   section          the index JSON text (written as model.safetensors.index.json when n > 0)
//   section          (bit 3 only) the config.json text
//   per file:
//     section        the safetensors header JSON (the 8-byte length prefix is computed from it:
//                    fuzz_safetensors_header fuzzes the prefix itself)
//     u32            the data section's length, capped at kMaxShardData
//     section        a byte pattern; the data section is the pattern repeated over its first
//                    kPatternSpan bytes, zeros after that (empty pattern: all zeros)
// A section is a u32 little-endian length then that many bytes; a short input leaves the rest
// empty. Running the binary with M3_FUZZ_WRITE_SEEDS=DIR writes the seed corpus (checkpoints made
// by the make-tiny writer, converted into this format) into DIR and exits.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "core/check.h"
#include "model/load_weights.h"
#include "model/safetensors.h"
#include "model/spec.h"
#include "model/synthetic.h"
#include "model/weight_table.h"

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxShardData = uint64_t(24) << 20;  // tiny's whole checkpoint is ~9.6 MB
constexpr size_t kPatternSpan = size_t(64) << 10;

struct Shard {
  std::string header;
  uint64_t data_len = 0;
  std::string pattern;
};
struct Input {
  uint8_t flags = 0;
  std::string index;
  std::string config;  // flags bit 3: config.json
  std::vector<Shard> shards;  // n files (1 when there is no index)
  int num_shards() const { return flags & 3; }
  bool tiny() const { return (flags & 4) != 0; }
  bool has_config() const { return (flags & 8) != 0; }
};

struct Reader {
  const uint8_t* p;
  size_t n;
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4 && n > 0; ++i, ++p, --n) v |= uint32_t(*p) << (8 * i);
    return v;
  }
  std::string section() {
    size_t len = std::min<size_t>(u32(), n);
    std::string s(reinterpret_cast<const char*>(p), len);
    p += len;
    n -= len;
    return s;
  }
};

Input decode(const uint8_t* data, size_t size) {
  Input in;
  Reader r{data, size};
  if (r.n) {
    in.flags = *r.p++;
    --r.n;
  }
  in.index = r.section();
  if (in.has_config()) in.config = r.section();
  in.shards.resize(size_t(std::max(1, in.num_shards())));
  for (auto& s : in.shards) {
    s.header = r.section();
    s.data_len = std::min<uint64_t>(r.u32(), kMaxShardData);
    s.pattern = r.section();
  }
  return in;
}

void put_u32(std::string& out, uint64_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(char(uint8_t(v >> (8 * i))));
}
std::string encode(const Input& in) {
  std::string out(1, char(in.flags));
  put_u32(out, in.index.size());
  out += in.index;
  if (in.has_config()) {
    put_u32(out, in.config.size());
    out += in.config;
  }
  for (const auto& s : in.shards) {
    put_u32(out, s.header.size());
    out += s.header;
    put_u32(out, s.data_len);
    put_u32(out, s.pattern.size());
    out += s.pattern;
  }
  return out;
}

std::string shard_name(int i, int n) {
  return n == 0 ? std::string("model.safetensors") : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
}

// A model with every kind of layer and tensor of tiny (full + dense, sparse + MoE with a shared
// expert), at a size where a whole load takes well under a millisecond. hidden 40 gives matrices
// whose rows need two MXFP8 scale groups, one of them partial.
m3::ModelSpec micro_spec() {
  m3::ModelSpec s = m3::synthetic_preset("tiny");
  s.num_layers = 2;
  s.attn = {m3::AttnKind::Full, m3::AttnKind::Sparse};
  s.mlp = {m3::MlpKind::Dense, m3::MlpKind::MoE};
  s.vocab_size = 64;
  s.hidden = 40;
  s.num_heads = 2;
  s.num_kv_heads = 1;
  s.head_dim = 16;
  s.rotary_dim = 8;
  s.dense_inter = 24;
  s.moe_inter = 16;
  s.shared_inter = 8;
  s.num_experts = 2;
  s.top_k = 1;
  s.index_heads = 1;
  s.index_dim = 16;
  s.index_block = 4;
  s.index_topk = 2;
  s.max_positions = 256;
  s.validate("fuzz_checkpoint micro spec");
  return s;
}

const m3::ModelSpec& spec_for(const Input& in) {
  static const m3::ModelSpec micro = micro_spec(), tiny = m3::synthetic_preset("tiny");
  return in.tiny() ? tiny : micro;
}

// One directory per process (tmpfs when there is one), reused by every input, removed at exit.
// Held through a pointer that is never freed: the exit handler runs after static destructors.
const fs::path& work_dir() {
  static const fs::path* dir = [] {
    std::error_code ec;
    fs::path base = fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
    auto* d = new fs::path(base / fmt::format("m3-fuzz-checkpoint-{}", ::getpid()));
    fs::remove_all(*d, ec);
    fs::create_directories(*d);
    std::atexit([] { std::error_code e; fs::remove_all(work_dir(), e); });
    return d;
  }();
  return *dir;
}

void write_file(const fs::path& p, const std::string& head, const Shard* s) {
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) __builtin_trap();  // the harness's own directory: not the loader's fault
  auto put = [&](const char* b, size_t n) {
    while (n) {
      ssize_t w = ::write(fd, b, n);
      if (w <= 0) __builtin_trap();
      b += w;
      n -= size_t(w);
    }
  };
  put(head.data(), head.size());
  if (s && s->data_len) {
    if (!s->pattern.empty()) {
      std::string buf(size_t(std::min<uint64_t>(s->data_len, kPatternSpan)), '\0');
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = s->pattern[i % s->pattern.size()];
      put(buf.data(), buf.size());
    }
    if (::ftruncate(fd, off_t(head.size() + s->data_len)) != 0) __builtin_trap();  // zeros after
  }
  ::close(fd);
}

// Writes the input's files into the (reused) work directory, removing the previous input's.
fs::path materialize(const Input& in) {
  const fs::path dir = work_dir();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) fs::remove(e.path(), ec);
  const int n = in.num_shards();
  if (n > 0) write_file(dir / "model.safetensors.index.json", in.index, nullptr);
  if (in.has_config()) write_file(dir / "config.json", in.config, nullptr);
  for (int i = 0; i < int(in.shards.size()); ++i) {
    const Shard& s = in.shards[size_t(i)];
    std::string head(8, '\0');
    for (int b = 0; b < 8; ++b) head[size_t(b)] = char(uint8_t(uint64_t(s.header.size()) >> (8 * b)));
    head += s.header;
    write_file(dir / shard_name(i, n), head, &s);
  }
  return dir;
}

void check_error(const m3::Error& e, const fs::path& dir) {
  // every loader error leads with the index, the shard or the set it is about
  if (std::string_view(e.what()).find(dir.string()) == std::string_view::npos) {
    std::fprintf(stderr, "error without the checkpoint's path: %s\n", e.what());
    __builtin_trap();
  }
}

void run(const Input& in) {
  const fs::path dir = materialize(in);
  const m3::ModelSpec& spec = spec_for(in);
  volatile uint8_t sink = 0;
  try {
    m3::SafetensorsSet files = m3::SafetensorsSet::open(dir);
    // every tensor of the set, claimed or not: size consistent with shape x dtype, bytes readable
    for (const auto& f : files.files())
      for (const auto& v : f->tensors()) {
        uint64_t n = m3::dtype_size(v.dtype);
        bool zero = false;
        for (auto d : v.shape) {
          if (d < 0) __builtin_trap();
          zero |= d == 0;
        }
        for (auto d : v.shape)
          if (!zero && __builtin_mul_overflow(n, uint64_t(d), &n)) __builtin_trap();
        if (zero) n = 0;
        if (n != v.nbytes || (v.numel() == 0) != (n == 0)) __builtin_trap();
        if (v.nbytes) sink = sink ^ v.data[0] ^ v.data[v.nbytes - 1];
        if (&files.get(v.name) != &v) __builtin_trap();  // the set maps each name to its one file
      }
    // the binding of the loader (with config.json's quantization_config, when there is one)
    m3::WeightBinding b = m3::bind_weights(m3::build_checkpoint_table(spec, files, dir), files);
    if (b.weights.size() != b.table.entries.size()) __builtin_trap();
    for (const auto& w : b.weights) {
      if (!w.tensor) __builtin_trap();
      const auto& e = w.entry->shape;
      const bool mx = w.quant == m3::WeightQuant::Mxfp8 || w.quant == m3::WeightQuant::Mxfp4;
      switch (w.quant) {  // each format's shapes and dtypes, as bind_weights promises them
        case m3::WeightQuant::Float:
          if (w.tensor->shape != e || w.scale) __builtin_trap();
          break;
        case m3::WeightQuant::Mxfp8:
        case m3::WeightQuant::Fp8Tensor:
          if (w.tensor->dtype != m3::DType::F8_E4M3 || w.tensor->shape != e || !w.scale) __builtin_trap();
          break;
        case m3::WeightQuant::Mxfp4:
          if (w.tensor->dtype != m3::DType::U8 || e.size() != 2 || w.tensor->shape[0] != e[0] ||
              w.tensor->shape[1] != (e[1] + 1) / 2 || !w.scale)
            __builtin_trap();
          break;
      }
      if (mx && w.scale->nbytes != size_t(e[0] * ((e[1] + 31) / 32))) __builtin_trap();
      if (w.quant == m3::WeightQuant::Fp8Tensor && w.scale->nbytes != 4) __builtin_trap();
    }
    // bound: the loader must convert every tensor, into the right slot; the only refusals left
    // after binding are values no format may hold (E8M0 255, the E4M3 NaN codes), named with
    // the file
    m3::ModelWeights mw;
    try {
      mw = m3::load_model_weights(dir, spec);
    } catch (const m3::Error& e) {
      const std::string_view m = e.what();
      if (m.find("NaN") == std::string_view::npos) {
        std::fprintf(stderr, "bound but did not load: %s\n", e.what());
        __builtin_trap();
      }
      check_error(e, dir);
      return;
    }
    // every slot against its own conversion (the micro model; tiny's 4.5 M elements only load)
    std::vector<float> want;
    if (!in.tiny())
      for (const auto& w : b.weights) {
        m3::WeightSlot slot = m3::weight_slot(mw, w.entry->role, w.entry->layer, w.entry->expert);
        want.assign(slot.size(), 0.f);
        m3::convert_to_f32(w, want.data());
        if (std::memcmp(want.data(), slot.data, want.size() * sizeof(float)) != 0) __builtin_trap();
      }
  } catch (const m3::Error& e) {
    check_error(e, dir);
  }
  (void)sink;
}

// ---- the seed corpus (M3_FUZZ_WRITE_SEEDS) ----

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) M3_FAIL("{}: cannot read", p.string());
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A checkpoint directory written with n shards (0: one model.safetensors) -> the container.
std::string convert_dir(const fs::path& dir, int n, bool tiny) {
  Input in;
  in.flags = uint8_t(n | (tiny ? 4 : 0));
  if (n > 0) in.index = read_all(dir / "model.safetensors.index.json");
  for (int i = 0; i < std::max(1, n); ++i) {
    std::string bytes = read_all(dir / shard_name(i, n));
    M3_CHECK(bytes.size() >= 8, "{}: too short", shard_name(i, n));
    uint64_t hl = 0;
    for (int b = 7; b >= 0; --b) hl = (hl << 8) | uint8_t(bytes[size_t(b)]);
    Shard s;
    s.header = bytes.substr(8, size_t(hl));
    s.data_len = bytes.size() - 8 - hl;
    M3_CHECK(s.data_len <= kMaxShardData, "{}: data section of {} bytes is past the cap", shard_name(i, n), s.data_len);
    s.pattern = bytes.substr(size_t(8 + hl), 64);
    in.shards.push_back(std::move(s));
  }
  return encode(in);
}

// Every weight in another accepted dtype: matrices cycle BF16, F16, F32 and F8_E4M3 with its U8
// scale companion, vectors BF16, F16, F32; bare text prefix (no "language_model."); n shards.
void write_dtype_mix(const fs::path& dir, const m3::ModelSpec& spec, int n) {
  m3::WeightTable t = m3::build_weight_table(spec, "");
  std::vector<m3::SafetensorsWriter> w(size_t(std::max(1, n)));
  std::string index = "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {";
  int k = 0;
  auto add = [&](const std::string& name, m3::DType dt, std::vector<int64_t> shape) {
    const int f = k % int(w.size());
    w[size_t(f)].add(name, dt, std::move(shape), m3::SafetensorsWriter::Fill{});
    index += fmt::format("{}\"{}\": \"{}\"", k ? ", " : "", name, shard_name(f, n));
    ++k;
  };
  int m = 0, v = 0;
  for (const auto& e : t.entries) {
    if (e.matrix()) {
      const m3::DType d[4] = {m3::DType::BF16, m3::DType::F16, m3::DType::F32, m3::DType::F8_E4M3};
      const m3::DType dt = d[m++ % 4];
      add(e.names.back(), dt, e.shape);
      if (dt == m3::DType::F8_E4M3)
        add(e.names.back() + "_scale_inv", m3::DType::U8, {e.shape[0], (e.shape[1] + 31) / 32});
    } else {
      const m3::DType d[3] = {m3::DType::BF16, m3::DType::F16, m3::DType::F32};
      add(e.names.back(), d[v++ % 3], e.shape);
    }
  }
  add("mtp.layers.0.input_layernorm.weight", m3::DType::BF16, {spec.hidden});
  index += "}}";
  fs::create_directories(dir);
  for (size_t i = 0; i < w.size(); ++i) w[i].write(dir / shard_name(int(i), n));
  if (n > 0) {
    std::ofstream(dir / "model.safetensors.index.json") << index;
  }
}

void write_seeds(const fs::path& out) {
  fs::create_directories(out);
  const fs::path tmp = work_dir() / "seeds";
  auto emit = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(out / name, std::ios::binary) << bytes;
    std::printf("%s: %zu bytes\n", (out / name).c_str(), bytes.size());
  };
  struct Synth {
    const char* name;
    bool tiny;
    int shards;
    bool vision, mtp, block_sparse_moe;
  };
  const Synth synth[] = {
      {"tiny-1file", true, 0, true, false, false},
      {"tiny-3shards", true, 3, true, true, false},
      {"micro-1file", false, 0, true, false, false},
      {"micro-2shards-mtp", false, 2, false, true, false},
      {"micro-3shards-block-sparse-moe", false, 3, true, false, true},
      {"micro-1shard-index", false, 1, true, false, false},
  };
  for (const auto& s : synth) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    m3::SyntheticOptions o;
    o.seed = 1;
    o.vision = s.vision;
    o.mtp = s.mtp;
    o.shards = std::max(1, s.shards);
    o.dense_spelling = s.block_sparse_moe ? m3::DenseMlpSpelling::BlockSparseMoe : m3::DenseMlpSpelling::Mlp;
    const m3::ModelSpec spec = s.tiny ? m3::synthetic_preset("tiny") : micro_spec();
    m3::write_synthetic_checkpoint(tmp, spec, o);
    if (s.shards == 1) {  // the writer writes no index for one file: name it through one
      fs::rename(tmp / "model.safetensors", tmp / shard_name(0, 1));
      m3::SafetensorsFile f(tmp / shard_name(0, 1));
      std::string idx = "{\"metadata\": {}, \"weight_map\": {";
      for (size_t i = 0; i < f.tensors().size(); ++i)
        idx += fmt::format("{}\"{}\": \"{}\"", i ? ", " : "", f.tensors()[i].name, shard_name(0, 1));
      std::ofstream(tmp / "model.safetensors.index.json") << idx << "}}";
    }
    emit(s.name, convert_dir(tmp, s.shards, s.tiny));
  }
  // the released quantized layouts (make-tiny --format), with config.json and its quantization_config
  for (const m3::SyntheticFormat f :
       {m3::SyntheticFormat::Mxfp8, m3::SyntheticFormat::Mxfp4, m3::SyntheticFormat::Mxfp4AttnFp8}) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    m3::SyntheticOptions o;
    o.seed = 1;
    o.vision = false;
    o.format = f;
    m3::write_synthetic_checkpoint(tmp, micro_spec(), o);
    std::string bytes = convert_dir(tmp, 0, false);
    // flags bit 3 and the config section after the (empty) index section
    Input in = decode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    in.flags = uint8_t(in.flags | 8);
    in.config = read_all(tmp / "config.json");
    // the data as the pattern 00 00 00 3f (the container keeps a repeated pattern, not the bytes):
    // F32 scalars 0.5 (a per-tensor scale must be positive), E4M3 codes and E8M0 scales 0x00 /
    // 0x3f (no NaN), BF16 0 / 0.5; the micro model's data fits the pattern's span
    M3_CHECK(in.shards.size() == 1 && in.shards[0].data_len <= kPatternSpan, "seed {}: data of {} bytes past the "
             "pattern's span", m3::synthetic_format_name(f), in.shards[0].data_len);
    in.shards[0].pattern = std::string("\0\0\0\x3f", 4);
    emit(fmt::format("micro-{}-config", m3::synthetic_format_name(f)), encode(in));
  }
  for (int n : {0, 2}) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    write_dtype_mix(tmp, micro_spec(), n);
    emit(fmt::format("micro-dtype-mix-{}", n ? "2shards" : "1file"), convert_dir(tmp, n, false));
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* out = std::getenv("M3_FUZZ_WRITE_SEEDS"); out && *out) {
    try {
      write_seeds(out);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fuzz_checkpoint: writing seeds failed: %s\n", e.what());
      std::exit(1);
    }
    // every seed must load (they are the deep starting points)
    for (const auto& e : fs::directory_iterator(out)) {
      if (e.path().filename().string().rfind("regress-", 0) == 0) continue;
      std::string b = read_all(e.path());
      Input in = decode(reinterpret_cast<const uint8_t*>(b.data()), b.size());
      m3::load_model_weights(materialize(in), spec_for(in));
    }
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  run(decode(data, size));
  return 0;
}
