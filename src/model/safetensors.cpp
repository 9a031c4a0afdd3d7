// safetensors: header validation, memory-mapped files, sharded sets and the writer.
// NOTE: nothing read from a file is used as a size, offset or count before it is checked; a
// malformed file is an m3::Error naming the file and the tensor, never an out-of-bounds read.
#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "core/check.h"
#include "model/json_brief.h"

namespace m3 {

using json = nlohmann::json;

namespace {

std::string show(const json& j) { return json_brief(j); }  // bounded: the file may nest without end

// A non-negative JSON integer that fits in int64, or nullopt.
std::optional<uint64_t> as_count(const json& v) {
  if (v.is_number_unsigned()) {
    uint64_t x = v.get<uint64_t>();
    if (x > uint64_t(INT64_MAX)) return std::nullopt;
    return x;
  }
  if (v.is_number_integer()) {
    int64_t x = v.get<int64_t>();
    if (x < 0) return std::nullopt;
    return uint64_t(x);
  }
  return std::nullopt;
}

TensorInfo parse_entry(const std::string& name, const json& e, uint64_t data_size, const std::string& file) {
  const char* f = file.c_str();
  const char* n = name.c_str();
  M3_CHECK(!name.empty(), "{}: a tensor has an empty name", f);
  M3_CHECK(e.is_object(), "{}: tensor '{}': header entry must be an object, got {}", f, n, show(e));
  TensorInfo t;
  t.name = name;

  auto dt = e.find("dtype");
  M3_CHECK(dt != e.end(), "{}: tensor '{}': missing 'dtype'", f, n);
  M3_CHECK(dt->is_string(), "{}: tensor '{}': 'dtype' must be a string, got {}", f, n, show(*dt));
  auto parsed = dtype_from_name(dt->get_ref<const std::string&>());
  M3_CHECK(parsed.has_value(), "{}: tensor '{}': unknown dtype {}", f, n, show(*dt));
  t.dtype = *parsed;

  auto sh = e.find("shape");
  M3_CHECK(sh != e.end(), "{}: tensor '{}': missing 'shape'", f, n);
  M3_CHECK(sh->is_array(), "{}: tensor '{}': 'shape' must be a list, got {}", f, n, show(*sh));
  M3_CHECK(sh->size() <= 16, "{}: tensor '{}': shape has {} dimensions (at most 16)", f, n, sh->size());
  uint64_t numel = 1;
  bool overflow = false;
  for (size_t i = 0; i < sh->size(); ++i) {
    auto d = as_count((*sh)[i]);
    M3_CHECK(d.has_value(), "{}: tensor '{}': shape[{}] = {} is not a non-negative integer", f, n, i,
             show((*sh)[i]));
    t.shape.push_back(int64_t(*d));
    overflow |= __builtin_mul_overflow(numel, *d, &numel);
    // TensorView::numel() multiplies the same dimensions in int64: no partial product may pass
    // INT64_MAX, even when a later dimension is 0 ([2^32, 3 * 2^30, 0] holds no element)
    overflow |= numel > uint64_t(INT64_MAX);
  }
  uint64_t want = 0;
  overflow |= __builtin_mul_overflow(numel, uint64_t(dtype_size(t.dtype)), &want);
  M3_CHECK(!overflow, "{}: tensor '{}': shape {} x {} overflows", f, n, show(*sh), dtype_name(t.dtype));

  auto off = e.find("data_offsets");
  M3_CHECK(off != e.end(), "{}: tensor '{}': missing 'data_offsets'", f, n);
  M3_CHECK(off->is_array() && off->size() == 2, "{}: tensor '{}': 'data_offsets' must be [begin, end], got {}", f, n,
           show(*off));
  auto b = as_count((*off)[0]), en = as_count((*off)[1]);
  M3_CHECK(b && en, "{}: tensor '{}': data_offsets {} are not non-negative integers", f, n, show(*off));
  M3_CHECK(*b <= *en, "{}: tensor '{}': data_offsets begin {} > end {}", f, n, *b, *en);
  M3_CHECK(*en <= data_size, "{}: tensor '{}': data_offsets [{}, {}] run past the data section ({} bytes)", f, n, *b,
           *en, data_size);
  t.begin = *b;
  t.end = *en;
  M3_CHECK(t.nbytes() == want, "{}: tensor '{}': {} {} needs {} bytes but data_offsets span {}", f, n,
           dtype_name(t.dtype), show(*sh), want, t.nbytes());
  return t;
}

}  // namespace

SafetensorsHeader parse_safetensors(std::span<const uint8_t> bytes, const std::string& file) {
  const char* f = file.c_str();
  M3_CHECK(bytes.size() >= 8, "{}: truncated: {} bytes, a safetensors file has at least 8", f, bytes.size());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[size_t(i)];
  M3_CHECK(n <= kMaxSafetensorsHeader, "{}: header length {} exceeds the limit of {} bytes", f, n,
           kMaxSafetensorsHeader);
  M3_CHECK(n <= bytes.size() - 8, "{}: truncated: header length {} but only {} bytes follow", f, n,
           bytes.size() - 8);
  SafetensorsHeader h;
  h.header_len = n;
  h.data_size = bytes.size() - 8 - n;

  // Duplicate top-level keys are silently merged by a JSON DOM; catch them while parsing.
  std::set<std::string> seen;
  std::string dup;
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth == 1 && ev == json::parse_event_t::key && parsed.is_string()) {
      if (!seen.insert(parsed.get<std::string>()).second && dup.empty()) dup = parsed.get<std::string>();
    }
    return true;
  };
  const char* text = reinterpret_cast<const char*>(bytes.data() + 8);
  json root;
  try {
    root = json::parse(text, text + n, cb);
  } catch (const json::exception& e) {
    M3_FAIL("{}: header is not valid JSON: {}", f, e.what());
  }
  M3_CHECK(dup.empty(), "{}: tensor '{}' appears twice in the header", f, dup);
  M3_CHECK(root.is_object(), "{}: header must be a JSON object, got {}", f, show(root));

  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__") {
      M3_CHECK(it->is_object(), "{}: __metadata__ must be an object, got {}", f, show(*it));
      for (auto m = it->begin(); m != it->end(); ++m) {
        M3_CHECK(m->is_string(), "{}: __metadata__ '{}' must be a string, got {}", f, m.key(), show(*m));
        h.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_entry(it.key(), *it, h.data_size, file));
  }

  // No byte may belong to two tensors (empty tensors own no bytes).
  std::vector<const TensorInfo*> order;
  for (const auto& t : h.tensors)
    if (t.nbytes() > 0) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    M3_CHECK(order[i]->begin >= order[i - 1]->end, "{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", f,
             order[i - 1]->name, order[i - 1]->begin, order[i - 1]->end, order[i]->name, order[i]->begin,
             order[i]->end);
  }
  return h;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string TensorView::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---- SafetensorsFile ----

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path.string()) {
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  M3_CHECK(fd >= 0, "{}: cannot open: {}", path_, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    M3_FAIL("{}: cannot stat: {}", path_, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    M3_FAIL("{}: not a regular file", path_);
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      M3_FAIL("{}: mmap of {} bytes failed: {}", path_, size_, std::strerror(err));
    }
  } else {
    ::close(fd);
  }
  try {
    const auto* base = static_cast<const uint8_t*>(map_);
    SafetensorsHeader h = parse_safetensors(std::span<const uint8_t>(base, size_), path_);
    metadata_ = std::move(h.metadata);
    views_.reserve(h.tensors.size());
    const uint8_t* data = base + 8 + h.header_len;
    for (auto& t : h.tensors) {
      TensorView v;
      v.name = std::move(t.name);
      v.dtype = t.dtype;
      v.shape = std::move(t.shape);
      v.data = data + t.begin;
      v.nbytes = size_t(t.nbytes());
      v.file = path_;
      by_name_.emplace(v.name, views_.size());
      views_.push_back(std::move(v));
    }
  } catch (...) {
    if (map_) ::munmap(map_, size_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &views_[it->second];
}

// ---- SafetensorsSet ----

namespace {

std::string read_text(const std::filesystem::path& p, uint64_t limit) {
  std::error_code ec;
  auto size = std::filesystem::file_size(p, ec);
  M3_CHECK(!ec, "{}: cannot read: {}", p.string(), ec.message());
  M3_CHECK(size <= limit, "{}: {} bytes exceeds the limit of {} bytes", p.string(), size, limit);
  std::ifstream in(p, std::ios::binary);
  M3_CHECK(in.good(), "{}: cannot open", p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A shard name from an index must stay inside the checkpoint directory.
void check_shard_name(const std::string& index, const std::string& tensor, const std::string& shard) {
  std::filesystem::path p(shard);
  bool ok = !shard.empty() && p.is_relative() && shard.find('\0') == std::string::npos;
  for (const auto& part : p) ok = ok && part != "..";
  M3_CHECK(ok, "{}: tensor '{}' maps to shard '{}', which is not a file name inside the checkpoint directory",
           index, tensor, shard);
}

}  // namespace

SafetensorsSet SafetensorsSet::open(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  SafetensorsSet s;
  std::error_code ec;
  fs::path target = path;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(path / "model.safetensors.index.json", ec)) target = path / "model.safetensors.index.json";
    else if (fs::exists(path / "model.safetensors", ec)) target = path / "model.safetensors";
    else M3_FAIL("{}: neither model.safetensors.index.json nor model.safetensors is present", path.string());
  }
  s.source_ = target.string();

  if (target.extension() != ".json") {
    s.files_.push_back(std::make_unique<SafetensorsFile>(target));
    for (const auto& v : s.files_.back()->tensors()) s.index_.emplace(v.name, &v);
    return s;
  }

  // Sharded: the index maps every tensor to a shard file in the same directory.
  const std::string idx = target.string();
  json root;
  try {
    root = json::parse(read_text(target, kMaxSafetensorsHeader));
  } catch (const json::exception& e) {
    M3_FAIL("{}: invalid JSON: {}", idx, e.what());
  }
  M3_CHECK(root.is_object(), "{}: must be a JSON object, got {}", idx, show(root));
  auto wm = root.find("weight_map");
  M3_CHECK(wm != root.end(), "{}: missing 'weight_map'", idx);
  M3_CHECK(wm->is_object(), "{}: 'weight_map' must be an object, got {}", idx, show(*wm));
  std::map<std::string, std::string> map;  // tensor -> shard
  std::map<std::string, size_t> shard_ids;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    M3_CHECK(it->is_string(), "{}: weight_map['{}'] must be a shard file name, got {}", idx, it.key(), show(*it));
    const auto& shard = it->get_ref<const std::string&>();
    check_shard_name(idx, it.key(), shard);
    map[it.key()] = shard;
    if (!shard_ids.count(shard)) {
      fs::path sp = target.parent_path() / shard;
      M3_CHECK(fs::is_regular_file(sp, ec), "{}: shard '{}' (holding tensor '{}') does not exist", idx, sp.string(),
               it.key());
      shard_ids[shard] = s.files_.size();
      s.files_.push_back(std::make_unique<SafetensorsFile>(sp));
    }
  }
  for (const auto& [name, shard] : map) {
    const SafetensorsFile& file = *s.files_[shard_ids[shard]];
    const TensorView* v = file.find(name);
    M3_CHECK(v, "{}: tensor '{}' is mapped to shard '{}', which does not contain it", idx, name, file.path());
    s.index_.emplace(name, v);
  }
  for (const auto& file : s.files_) {
    for (const auto& v : file->tensors()) {
      auto it = map.find(v.name);
      M3_CHECK(it != map.end(), "{}: tensor '{}' in shard '{}' is not listed in the index weight_map", idx, v.name,
               file->path());
      M3_CHECK(s.index_.at(v.name) == &v, "{}: tensor '{}' in shard '{}' is mapped to shard '{}'", idx, v.name,
               file->path(), it->second);
    }
  }
  return s;
}

const TensorView* SafetensorsSet::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const TensorView& SafetensorsSet::get(std::string_view name) const {
  const TensorView* v = find(name);
  M3_CHECK(v, "{}: tensor '{}' not found", source_, name);
  return *v;
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [n, v] : index_) out.push_back(n);
  return out;
}

// ---- SafetensorsWriter ----

void SafetensorsWriter::add(std::string name, DType dtype, std::vector<int64_t> shape, Fill fill) {
  M3_CHECK(!name.empty() && name != "__metadata__", "safetensors writer: invalid tensor name '{}'", name);
  for (const auto& e : entries_) M3_CHECK(e.name != name, "safetensors writer: tensor '{}' added twice", name);
  uint64_t n = dtype_size(dtype);
  for (auto d : shape) {
    M3_CHECK(d >= 0, "safetensors writer: tensor '{}' has a negative dimension {}", name, d);
    M3_CHECK(!__builtin_mul_overflow(n, uint64_t(d), &n), "safetensors writer: tensor '{}' is too large", name);
  }
  entries_.push_back(Entry{std::move(name), dtype, std::move(shape), offset_, offset_ + n, std::move(fill)});
  offset_ += n;
}

void SafetensorsWriter::add(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
  uint64_t want = dtype_size(dtype);
  for (auto d : shape) want *= uint64_t(std::max<int64_t>(d, 0));
  TensorView shown;
  shown.shape = shape;
  M3_CHECK(bytes.size() == want, "safetensors writer: tensor '{}' has {} bytes, {} {} needs {}", name, bytes.size(),
           dtype_name(dtype), shown.shape_str(), want);
  auto shared = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  add(std::move(name), dtype, std::move(shape),
      [shared](uint8_t* dst, size_t n) { std::memcpy(dst, shared->data(), n); });
}

void SafetensorsWriter::write(const std::filesystem::path& path,
                              const std::function<void(uint64_t, uint64_t)>& progress) const {
  json h = json::object();
  if (!metadata_.empty()) h["__metadata__"] = metadata_;
  for (const auto& e : entries_)
    h[e.name] = {{"dtype", std::string(dtype_name(e.dtype))}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  std::string text = h.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  M3_CHECK(text.size() <= kMaxSafetensorsHeader, "safetensors writer: header of {} bytes is too large", text.size());

  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    M3_CHECK(out.good(), "{}: cannot create", tmp.string());
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), std::streamsize(text.size()));
    std::vector<uint8_t> buf;
    for (const auto& e : entries_) {
      size_t n = size_t(e.end - e.begin);
      buf.assign(n, 0);
      if (e.fill && n) e.fill(buf.data(), n);
      out.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(n));
      if (progress) progress(e.end, offset_);
    }
    out.flush();
    M3_CHECK(out.good(), "{}: write failed", tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  M3_CHECK(!ec, "{}: cannot rename to {}: {}", tmp.string(), path.string(), ec.message());
}

}  // namespace m3
