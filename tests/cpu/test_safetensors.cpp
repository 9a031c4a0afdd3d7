// safetensors reader and writer: round trips of every dtype (random shapes, zero-size and scalar
// tensors), sharded sets, and every malformed-file case, each of which must be an m3::Error that
// names the file and the tensor. A randomized mutation test checks that corrupt headers either
// parse into in-bounds views or fail cleanly.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/temp_dir.h"
#include "core/check.h"
#include "model/safetensors.h"

using namespace m3;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

using m3::test::TempDir;

// A file holding exactly: 8-byte length (len, or the header's size) + header + data.
void write_raw(const std::string& p, const std::string& header, size_t data_bytes, std::optional<uint64_t> len = {}) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  uint64_t n = len.value_or(header.size());
  for (int i = 0; i < 8; ++i) out.put(char(uint8_t(n >> (8 * i))));
  out << header;
  std::string data(data_bytes, '\x5a');
  out << data;
}

std::string error_opening(const std::string& p) {
  try {
    SafetensorsSet::open(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<uint8_t> read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

const DType kAll[] = {DType::BF16, DType::F16, DType::F32,  DType::F64, DType::F8_E4M3, DType::F8_E5M2,
                      DType::U8,   DType::I8,  DType::I16, DType::I32, DType::I64,     DType::BOOL};

}  // namespace

TEST(Safetensors, RoundTripEveryDtype) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  TempDir dir;
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  struct Want {
    std::string name;
    DType dt;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Want> want;
  int i = 0;
  for (DType dt : kAll) {
    for (int rep = 0; rep < 2; ++rep) {
      std::vector<int64_t> shape;
      int rank = int(rng() % 4);  // 0 = scalar
      for (int r = 0; r < rank; ++r) shape.push_back(int64_t(rng() % 7));  // zero-size dims included
      size_t n = dtype_size(dt);
      for (auto d : shape) n *= size_t(d);
      std::vector<uint8_t> b(n);
      for (auto& x : b) x = uint8_t(rng());
      std::string name = fmt::format("t{}.{}", i++, dtype_name(dt));
      w.add(name, dt, shape, b);
      want.push_back({name, dt, shape, b});
    }
  }
  w.write(dir / "a.safetensors");
  auto raw = read_bytes(dir / "a.safetensors");
  uint64_t hlen = 0;
  std::memcpy(&hlen, raw.data(), 8);
  EXPECT_EQ(hlen % 8, 0u) << "header is padded to 8 bytes";

  SafetensorsFile f(dir / "a.safetensors");
  EXPECT_EQ(f.tensors().size(), want.size());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  for (const auto& x : want) {
    const TensorView* v = f.find(x.name);
    ASSERT_NE(v, nullptr) << x.name;
    EXPECT_EQ(v->dtype, x.dt);
    EXPECT_EQ(v->shape, x.shape);
    ASSERT_EQ(v->nbytes, x.bytes.size());
    EXPECT_EQ(v->file, dir / "a.safetensors");
    EXPECT_TRUE(v->nbytes == 0 || std::memcmp(v->data, x.bytes.data(), v->nbytes) == 0) << x.name;
  }
  auto set = SafetensorsSet::open(dir / "a.safetensors");
  EXPECT_EQ(set.size(), want.size());
  EXPECT_EQ(set.get(want[3].name).shape, want[3].shape);
  try {
    set.get("nope.weight");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope.weight"), std::string::npos);
  }
}

TEST(Safetensors, ReadsTheFixture) {
  auto set = SafetensorsSet::open(std::string(M3_TEST_DATA) + "/tiny-m3-a");
  EXPECT_EQ(set.size(), 236u);
  const auto& v = set.get("language_model.model.layers.1.block_sparse_moe.gate.weight");
  EXPECT_EQ(v.dtype, DType::F32);
  EXPECT_EQ(v.shape, (std::vector<int64_t>{16, 256}));
  EXPECT_EQ(v.nbytes, 16u * 256 * 4);
}

struct BadCase {
  const char* what;
  std::string header;
  size_t data;
  std::vector<const char*> expect;
};

TEST(Safetensors, MalformedFiles) {
  TempDir dir;
  const std::string ok = R"({"a.weight":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]}})";
  std::vector<BadCase> cases = {
      {"invalid json", R"({"a.weight":{"dtype":"BF16",)", 12, {"not valid JSON"}},
      {"not an object", R"([1,2,3])", 0, {"JSON object"}},
      {"entry not object", R"({"a.weight":[1]})", 0, {"'a.weight'", "object"}},
      {"missing dtype", R"({"a.weight":{"shape":[2],"data_offsets":[0,4]}})", 4, {"'a.weight'", "dtype"}},
      {"missing shape", R"({"a.weight":{"dtype":"BF16","data_offsets":[0,4]}})", 4, {"'a.weight'", "shape"}},
      {"missing offsets", R"({"a.weight":{"dtype":"BF16","shape":[2]}})", 4, {"'a.weight'", "data_offsets"}},
      {"unknown dtype", R"({"a.weight":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,4]}})", 4,
       {"'a.weight'", "unknown dtype", "Q4_K"}},
      {"dtype not string", R"({"a.weight":{"dtype":7,"shape":[2],"data_offsets":[0,4]}})", 4, {"'a.weight'", "dtype"}},
      {"negative dim", R"({"a.weight":{"dtype":"BF16","shape":[2,-3],"data_offsets":[0,12]}})", 12,
       {"'a.weight'", "shape[1]", "-3"}},
      {"float dim", R"({"a.weight":{"dtype":"BF16","shape":[2.5],"data_offsets":[0,4]}})", 4, {"'a.weight'", "shape[0]"}},
      {"overflowing shape",
       R"({"a.weight":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4,
       {"'a.weight'", "overflows"}},
      // no element, but TensorView::numel() would overflow int64 on the way to the 0 (fuzz_checkpoint)
      {"int64-overflowing empty shape",
       R"({"a.weight":{"dtype":"U8","shape":[4294967296,3221225472,0],"data_offsets":[0,0]}})", 0,
       {"'a.weight'", "overflows"}},
      // a value nested past any stack: the message shows it briefly (fuzz_checkpoint)
      {"deep entry", R"({"a.weight":)" + std::string(100000, '[') + std::string(100000, ']') + "}", 0,
       {"'a.weight'", "object", "[[[[...]]]]"}},
      {"deep root", std::string(100000, '[') + std::string(100000, ']'), 0, {"JSON object", "[[[[...]]]]"}},
      {"huge dim", R"({"a.weight":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,4]}})", 4,
       {"'a.weight'", "shape[0]"}},
      {"offsets past end", R"({"a.weight":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]}})", 11,
       {"'a.weight'", "past the data section"}},
      {"begin > end", R"({"a.weight":{"dtype":"BF16","shape":[0],"data_offsets":[8,4]}})", 12,
       {"'a.weight'", "begin 8 > end 4"}},
      {"three offsets", R"({"a.weight":{"dtype":"BF16","shape":[2],"data_offsets":[0,4,8]}})", 8,
       {"'a.weight'", "[begin, end]"}},
      {"negative offset", R"({"a.weight":{"dtype":"BF16","shape":[2],"data_offsets":[-4,0]}})", 8,
       {"'a.weight'", "data_offsets"}},
      {"size mismatch", R"({"a.weight":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,10]}})", 12,
       {"'a.weight'", "needs 12 bytes", "span 10"}},
      {"overlap",
       R"({"a.weight":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},"b.weight":{"dtype":"F32","shape":[1],"data_offsets":[6,10]}})",
       12, {"'a.weight'", "'b.weight'", "overlap"}},
      {"duplicate", R"({"a.weight":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a.weight":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
       2, {"'a.weight'", "twice"}},
      {"metadata not string", R"({"__metadata__":{"format":3}})", 0, {"__metadata__", "format"}},
      {"metadata not object", R"({"__metadata__":[1]})", 0, {"__metadata__"}},
      {"empty name", R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1, {"empty name"}},
      {"bad utf8", "{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, {"not valid JSON"}},
  };
  int i = 0;
  for (const auto& c : cases) {
    std::string p = dir / ("bad" + std::to_string(i++) + ".safetensors");
    write_raw(p, c.header, c.data);
    std::string msg = error_opening(p);
    ASSERT_FALSE(msg.empty()) << c.what << ": accepted";
    EXPECT_NE(msg.find(p), std::string::npos) << c.what << ": message does not name the file: " << msg;
    for (const char* want : c.expect) EXPECT_NE(msg.find(want), std::string::npos) << c.what << ": " << msg;
  }
  // the same header, well formed, is accepted (so the cases above fail for their own reason)
  write_raw(dir / "ok.safetensors", ok, 12);
  EXPECT_EQ(error_opening(dir / "ok.safetensors"), "");

  // length prefix problems
  {
    std::string p = dir / "short.safetensors";
    std::ofstream(p, std::ios::binary) << "abc";
    EXPECT_NE(error_opening(p).find("truncated"), std::string::npos);
    std::ofstream(p, std::ios::binary | std::ios::trunc);  // empty file
    EXPECT_NE(error_opening(p).find("truncated"), std::string::npos);
    write_raw(p, ok, 12, uint64_t(ok.size()) + 100);  // header runs past the file
    std::string msg = error_opening(p);
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
    write_raw(p, ok, 12, (uint64_t(100) << 20) + 1);  // beyond the 100 MiB bound
    msg = error_opening(p);
    EXPECT_NE(msg.find("exceeds the limit"), std::string::npos) << msg;
    write_raw(p, ok, 12, ~uint64_t(0));
    EXPECT_NE(error_opening(p).find("exceeds the limit"), std::string::npos);
  }
  // a file cut short inside the data section
  {
    SafetensorsWriter w;
    w.add("x.weight", DType::F32, {64}, std::vector<uint8_t>(256, 1));
    w.add("y.weight", DType::F32, {64}, std::vector<uint8_t>(256, 2));
    std::string p = dir / "cut.safetensors";
    w.write(p);
    fs::resize_file(p, fs::file_size(p) - 5);
    std::string msg = error_opening(p);
    EXPECT_NE(msg.find("'y.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("past the data section"), std::string::npos) << msg;
  }
  // not found / not a file
  EXPECT_NE(error_opening(dir / "missing.safetensors").find("cannot open"), std::string::npos);
  fs::create_directories(dir.path / "empty_dir");
  EXPECT_NE(error_opening(dir / "empty_dir").find("neither"), std::string::npos);
}

TEST(Safetensors, Sharded) {
  TempDir dir;
  auto shard = [&](const std::string& name, std::vector<std::pair<std::string, float>> ts) {
    SafetensorsWriter w;
    for (auto& [n, v] : ts) {
      std::vector<uint8_t> b(8);
      std::memcpy(b.data(), &v, 4);
      std::memcpy(b.data() + 4, &v, 4);
      w.add(n, DType::F32, {2}, b);
    }
    w.write(dir / name);
  };
  auto index = [&](json map) {
    std::ofstream(dir / "model.safetensors.index.json", std::ios::trunc)
        << json{{"metadata", {{"total_size", 32}}}, {"weight_map", map}}.dump();
  };
  shard("model-00001-of-00002.safetensors", {{"a", 1.f}, {"b", 2.f}});
  shard("model-00002-of-00002.safetensors", {{"c", 3.f}, {"d", 4.f}});
  json map = {{"a", "model-00001-of-00002.safetensors"}, {"b", "model-00001-of-00002.safetensors"},
              {"c", "model-00002-of-00002.safetensors"}, {"d", "model-00002-of-00002.safetensors"}};
  index(map);
  {
    auto set = SafetensorsSet::open(dir.path);
    EXPECT_EQ(set.size(), 4u);
    EXPECT_EQ(set.files().size(), 2u);
    float v;
    std::memcpy(&v, set.get("c").data + 4, 4);
    EXPECT_EQ(v, 3.f);
    EXPECT_NE(set.get("d").file.find("model-00002-of-00002"), std::string::npos);
    EXPECT_EQ(set.names(), (std::vector<std::string>{"a", "b", "c", "d"}));
  }
  const std::string idx = dir / "model.safetensors.index.json";
  auto expect_error = [&](json m, std::vector<const char*> want) {
    index(m);
    std::string msg = error_opening(dir.path);
    ASSERT_FALSE(msg.empty()) << m.dump();
    EXPECT_NE(msg.find(idx), std::string::npos) << msg;
    for (auto w : want) EXPECT_NE(msg.find(w), std::string::npos) << msg;
  };
  {  // index names a shard that does not exist
    json m = map;
    m["d"] = "model-00003-of-00003.safetensors";
    expect_error(m, {"model-00003-of-00003.safetensors", "does not exist", "'d'"});
  }
  {  // tensor mapped to a shard that does not hold it
    json m = map;
    m["e"] = "model-00002-of-00002.safetensors";
    expect_error(m, {"'e'", "does not contain"});
  }
  {  // tensor mapped to the wrong shard
    json m = map;
    m["c"] = "model-00001-of-00002.safetensors";
    expect_error(m, {"'c'", "does not contain"});
  }
  {  // shard tensor missing from the index
    json m = map;
    m.erase("b");
    expect_error(m, {"'b'", "not listed"});
  }
  {  // shard name escaping the directory
    json m = map;
    m["a"] = "../model-00001-of-00002.safetensors";
    expect_error(m, {"'a'", "inside the checkpoint directory"});
  }
  {
    json m = map;
    m["a"] = 5;
    expect_error(m, {"weight_map['a']"});
  }
  std::ofstream(idx, std::ios::trunc) << "{\"weight_map\": ";
  EXPECT_NE(error_opening(dir.path).find("invalid JSON"), std::string::npos);
  std::ofstream(idx, std::ios::trunc) << "{\"metadata\": {}}";
  EXPECT_NE(error_opening(dir.path).find("weight_map"), std::string::npos);
}

// Random corruption of a valid file: parse_safetensors must either throw m3::Error or return
// entries whose byte ranges lie inside the buffer and match their shapes.
TEST(Safetensors, RandomCorruptionFailsCleanly) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  TempDir dir;
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  w.add("a.weight", DType::BF16, {3, 4}, std::vector<uint8_t>(24, 7));
  w.add("b.bias", DType::F32, {5}, std::vector<uint8_t>(20, 9));
  w.add("c", DType::I64, {0, 2}, std::vector<uint8_t>());
  w.write(dir / "v.safetensors");
  const auto good = read_bytes(dir / "v.safetensors");
  int accepted = 0;
  for (int it = 0; it < 3000; ++it) {
    auto b = good;
    int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 4) {
        case 0: b[rng() % b.size()] = uint8_t(rng()); break;                             // random byte
        case 1:  // a JSON-ish byte in the header
          if (b.size() > 8) b[8 + rng() % (b.size() - 8)] = "0123456789[]{},:\"-"[rng() % 18];
          break;
        case 2: b.resize(1 + rng() % b.size()); break;  // truncate
        case 3:  // the length prefix
          if (b.size() >= 8) b[rng() % 8] = uint8_t(rng());
          break;
      }
    }
    try {
      SafetensorsHeader h = parse_safetensors(b, "mutant");
      ++accepted;
      for (const auto& t : h.tensors) {
        ASSERT_LE(t.begin, t.end);
        ASSERT_LE(8 + h.header_len + t.end, b.size());
        uint64_t n = dtype_size(t.dtype);
        for (auto d : t.shape) n *= uint64_t(d);
        ASSERT_EQ(n, t.nbytes());
      }
    } catch (const Error&) {
    }
  }
  EXPECT_GT(accepted, 0);  // some mutants stay valid (e.g. edits in padding or in data bytes)
}
