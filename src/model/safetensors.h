// safetensors reading (memory-mapped, zero-copy) and writing.
// File format: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data section; offsets are relative to the start of the data section.
// The reader trusts nothing in a file: every length, offset, shape and dtype is checked before a
// view is made, and every failure is an m3::Error naming the file and the tensor.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace m3 {

// Largest JSON header accepted (the released checkpoints' headers are well under 1 MiB).
inline constexpr uint64_t kMaxSafetensorsHeader = uint64_t(100) << 20;

struct TensorInfo {  // one validated header entry
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  uint64_t header_len = 0;  // N; the data section starts at byte 8 + N
  uint64_t data_size = 0;   // bytes after the header
  std::vector<TensorInfo> tensors;  // in header (name) order
  std::map<std::string, std::string> metadata;
};

// Parses and validates the header of a whole safetensors file held in `file_bytes`: the length
// prefix (bounded by kMaxSafetensorsHeader and by the file), JSON syntax, duplicate names,
// dtype names, shapes (non-negative, no overflow), data_offsets (inside the data section,
// begin <= end), shape x dtype size == byte length, and no two tensors sharing a byte.
// `file` only names the source in messages.
SafetensorsHeader parse_safetensors(std::span<const uint8_t> file_bytes, const std::string& file);

// A zero-copy view of one tensor's bytes inside a mapped file. `data` has no alignment guarantee
// (the header length need not be a multiple of 8): read it with memcpy.
struct TensorView {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // the file holding it
  int64_t numel() const;
  std::string shape_str() const;  // "[1024, 256]"
};

// One memory-mapped safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorView>& tensors() const { return views_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorView* find(std::string_view name) const;

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::vector<TensorView> views_;
  std::map<std::string, size_t, std::less<>> by_name_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint: one file, or the shards named by model.safetensors.index.json
// (checked both ways: every mapped tensor is in its shard, every shard tensor is mapped there).
class SafetensorsSet {
 public:
  // `path`: a directory (model.safetensors.index.json if present, else model.safetensors), an
  // index .json file, or one .safetensors file.
  static SafetensorsSet open(const std::filesystem::path& path);

  const TensorView* find(std::string_view name) const;
  const TensorView& get(std::string_view name) const;  // throws naming the tensor and the source
  std::vector<std::string> names() const;              // sorted
  size_t size() const { return index_.size(); }
  const std::string& source() const { return source_; }  // what was opened, for messages
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*, std::less<>> index_;
};

// Builds a safetensors file: declare tensors (their bytes given or produced on demand by a fill
// callback, so large files stream through one buffer), then write. Tensors are laid out in the
// order added; the header is padded with spaces to a multiple of 8 bytes.
class SafetensorsWriter {
 public:
  using Fill = std::function<void(uint8_t* dst, size_t nbytes)>;
  void add(std::string name, DType dtype, std::vector<int64_t> shape, Fill fill);
  void add(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  void set_metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }
  uint64_t data_bytes() const { return offset_; }
  size_t count() const { return entries_.size(); }
  // Writes to path (through a temporary file renamed at the end). progress(done, total) is called
  // after each tensor with byte counts.
  void write(const std::filesystem::path& path,
             const std::function<void(uint64_t, uint64_t)>& progress = {}) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
    Fill fill;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
  uint64_t offset_ = 0;
};

}  // namespace m3
