// The tokenizer (text/tokenizer.h) against the Python `tokenizers` library: tests/py/
// make_tokenizer_cases.py builds tokenizer.json files (M3's layout with its split pattern and added
// tokens, GPT-2's, an NFC + template layout, other split behaviors) and records the library's ids
// and decodes of a corpus (Unicode, CJK, emoji, code, whitespace runs, digits, markers inside text,
// random code points and bytes; fresh seed each run, printed; M3_TOKENIZER_SEED fixes it). Here
// every encode must equal the library's, decode(encode(x)) == x wherever the library round-trips,
// decodes of random ids equal, and incremental decoding equals whole decoding without ever emitting
// a broken character. Also: load errors name the field or token, and encoding speed is measured.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>

#include "common/process.h"
#include "common/temp_dir.h"
#include "core/check.h"
#include "text/m3_tokens.h"
#include "text/tiny_tokenizer.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

using namespace m3;
using namespace m3::text;
using json = nlohmann::json;

namespace {

// (exit code, stdout + stderr) of a shell command
std::pair<int, std::string> run(const std::string& cmd) {
  const m3::test::CmdResult r = m3::test::run_shell(cmd);
  return {r.rc, r.out};
}
using m3::test::read_file;

// "" when equal, else where they first differ.
std::string first_diff(const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  if (i == got.size() && i == want.size()) return "";
  auto at = [](const std::vector<int32_t>& v, size_t k) { return k < v.size() ? std::to_string(v[k]) : "(end)"; };
  return "ids differ at position " + std::to_string(i) + ": got " + at(got, i) + ", want " + at(want, i) + " (lengths " +
         std::to_string(got.size()) + " vs " + std::to_string(want.size()) + ")";
}

std::string first_diff(const std::string& got, const std::string& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  if (i == got.size() && i == want.size()) return "";
  auto ctx = [&](const std::string& s) { return json(utf8_lossy(s.substr(i > 8 ? i - 8 : 0, 24))).dump(); };
  return "text differs at byte " + std::to_string(i) + ": got ..." + ctx(got) + "..., want ..." + ctx(want) +
         "... (lengths " + std::to_string(got.size()) + " vs " + std::to_string(want.size()) + ")";
}

int64_t vocab_bound(const std::string& tokenizer_json) {  // max id + 1, rounded up to 64
  json j = json::parse(read_file(tokenizer_json));
  int64_t mx = 0;
  for (auto& [k, v] : j["model"]["vocab"].items()) mx = std::max<int64_t>(mx, v.get<int64_t>());
  for (auto& a : j["added_tokens"]) mx = std::max<int64_t>(mx, a["id"].get<int64_t>());
  return (mx + 1 + 63) / 64 * 64;
}

// The files and cases, built once per process.
struct Cases {
  test::TempDir dir;
  std::vector<json> rows;
  std::map<std::string, std::unique_ptr<Tokenizer>> tok;
  std::string log;
};

Cases& cases() {
  static std::unique_ptr<Cases> c = [] {
    auto c = std::make_unique<Cases>();
    std::string cmd = "python3 " + std::string(M3_SOURCE_DIR) + "/tests/py/make_tokenizer_cases.py " + c->dir.path.string();
    auto [rc, out] = run(cmd);
    c->log = out;
    std::printf("%s", out.c_str());
    if (rc != 0) {
      ADD_FAILURE() << "make_tokenizer_cases.py failed (is the `tokenizers` package installed? "
                       "scripts/install-deps.sh installs it):\n" << out;
      return c;
    }
    std::ifstream in(c->dir / "cases.jsonl");
    for (std::string line; std::getline(in, line);) c->rows.push_back(json::parse(line));
    for (const char* name : {"m3", "gpt2", "nfc", "splits"}) {
      std::string f = c->dir / (std::string(name) + "/tokenizer.json");
      c->tok[name] = std::make_unique<Tokenizer>(Tokenizer::load(f, vocab_bound(f)));
    }
    return c;
  }();
  return *c;
}

std::vector<int32_t> ids_of(const json& a) { return a.get<std::vector<int32_t>>(); }

struct Tally {
  size_t compared = 0, failed = 0, skipped_nfc = 0;
  bool report(const std::string& what, const std::string& diff, const json& row) {
    ++compared;
    if (diff.empty()) return true;
    if (++failed <= 10) ADD_FAILURE() << what << " [" << row["layout"].get<std::string>() << "] " << diff << "\n  case: " << row.dump();
    return false;
  }
};

// Runs every text case through `tok` (or the layout's tokenizer); returns the number of mismatches.
Tally check_encodes(const std::string& only_layout = "", bool expect_failures = false) {
  Cases& c = cases();
  Tally t;
  for (const json& row : c.rows) {
    if (row["kind"] != "text") continue;
    std::string layout = row["layout"];
    if (!only_layout.empty() && layout != only_layout) continue;
    const Tokenizer& tok = *c.tok[layout];
    std::string text = row["text"];
    if (row.value("nfc_old_tables", false)) {  // the library's NFC lacks newer combining classes
      ++t.skipped_nfc;
      continue;
    }
    std::vector<int32_t> got = tok.encode(text, true), plain = tok.encode(text, false);
    if (expect_failures) {
      t.compared += 2;
      t.failed += !first_diff(got, ids_of(row["ids"])).empty() + !first_diff(plain, ids_of(row["ids_plain"])).empty();
      continue;
    }
    t.report("encode (add_special_tokens)", first_diff(got, ids_of(row["ids"])), row);
    t.report("encode", first_diff(plain, ids_of(row["ids_plain"])), row);
    std::vector<int32_t> want = ids_of(row["ids_plain"]);
    std::string dec = tok.decode(want);
    t.report("decode", first_diff(dec, row["decoded"].get<std::string>()), row);
    t.report("decode (skip_special_tokens)", first_diff(tok.decode(want, true), row["decoded_skip"].get<std::string>()), row);
    if (row["round_trip"].get<bool>()) t.report("decode(encode(x)) == x", first_diff(tok.decode(plain), text), row);
  }
  return t;
}

TEST(Tokenizer, EncodeDecodeEqualTokenizersLibrary) {
  Cases& c = cases();
  ASSERT_FALSE(c.rows.empty());
  Tally t = check_encodes();
  size_t strings = 0, round_trips = 0;
  for (const json& row : c.rows)
    if (row["kind"] == "text") ++strings, round_trips += row["round_trip"].get<bool>();
  std::printf("compared %zu strings over 4 layouts (%zu round-trip in the library): %zu comparisons, %zu failed; "
              "%zu skipped (the library's NFC tables are older than Unicode 14's)\n",
              strings, round_trips, t.compared, t.failed, t.skipped_nfc);
  EXPECT_EQ(t.failed, 0u);
  EXPECT_GT(strings, 1000u);
}

TEST(Tokenizer, DecodeOfRandomIdsEqualsLibrary) {
  Cases& c = cases();
  Tally t;
  for (const json& row : c.rows) {
    if (row["kind"] != "ids") continue;
    const Tokenizer& tok = *c.tok[row["layout"].get<std::string>()];
    std::vector<int32_t> ids = ids_of(row["ids"]);
    t.report("decode", first_diff(tok.decode(ids), row["decoded"].get<std::string>()), row);
    t.report("decode (skip_special_tokens)", first_diff(tok.decode(ids, true), row["decoded_skip"].get<std::string>()), row);
  }
  std::printf("compared %zu decodes of random id lists, %zu failed\n", t.compared, t.failed);
  EXPECT_GT(t.compared, 100u);
  EXPECT_EQ(t.failed, 0u);
}

// Incremental decoding equals whole decoding, and no chunk is invalid UTF-8 (a character split
// across tokens is never emitted broken).
TEST(Tokenizer, StreamDecodeEqualsWholeDecode) {
  Cases& c = cases();
  Tally t;
  size_t held_back = 0;
  for (const json& row : c.rows) {
    const Tokenizer& tok = *c.tok[row["layout"].get<std::string>()];
    std::vector<int32_t> ids = ids_of(row["kind"] == "text" ? row["ids_plain"] : row["ids"]);
    for (bool skip : {false, true}) {
      StreamDecoder sd(tok, skip);
      std::string all;
      bool chunks_valid = true;
      for (int32_t id : ids) {
        std::string chunk = sd.push(id);
        chunks_valid &= utf8_invalid_at(chunk) == std::string::npos;
        if (chunk.empty()) ++held_back;
        all += chunk;
      }
      all += sd.finish();
      t.report("stream decode", first_diff(all, tok.decode(ids, skip)), row);
      t.report("stream chunk is valid UTF-8", chunks_valid ? "" : "a chunk is not valid UTF-8", row);
    }
  }
  std::printf("compared %zu incremental decodes (%zu pushes held text back)\n", t.compared / 2, held_back);
  EXPECT_EQ(t.failed, 0u);
  EXPECT_GT(held_back, 0u);
}

// The comparison can fail: with one merge dropped from the model, encodes must stop matching.
TEST(Tokenizer, ComparisonDetectsABrokenMerge) {
  Cases& c = cases();
  ASSERT_FALSE(c.rows.empty());
  std::string f = c.dir / "m3/tokenizer.json";
  auto broken = std::make_unique<Tokenizer>(Tokenizer::load(f, vocab_bound(f)));
  broken->model_for_test().disable_merge_for_test(0);  // the most frequent pair
  std::swap(c.tok["m3"], broken);
  Tally t = check_encodes("m3", true);
  std::swap(c.tok["m3"], broken);
  std::printf("with merge rank 0 dropped: %zu of %zu encodes differ from the library\n", t.failed, t.compared);
  EXPECT_GT(t.failed, 10u);
}

TEST(Tokenizer, EncodeSpeed) {
  Cases& c = cases();
  ASSERT_FALSE(c.rows.empty());
  // realistic text: the layout's fixed strings and fragment cases, repeated to 4 MB
  std::string corpus;
  for (const json& row : c.rows)
    if (row["kind"] == "text" && row["layout"] == "m3") corpus += row["text"].get<std::string>() + "\n";
  std::string big;
  while (big.size() < (4u << 20)) big += corpus;
  const Tokenizer& tok = *c.tok["m3"];
  size_t warm = 1 << 20;
  while ((static_cast<unsigned char>(big[warm]) & 0xC0) == 0x80) --warm;  // a character boundary
  tok.encode(big.substr(0, warm));  // warm the word cache as a server's would be
  // "on one core": the thread's CPU time (the suite runs tests in parallel on a shared machine),
  // best of three; wall time is printed too
  auto cpu_now = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  };
  double s = 1e9, wall = 1e9;
  std::vector<int32_t> ids;
  for (int r = 0; r < 3; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    double c0 = cpu_now();
    ids = tok.encode(big);
    s = std::min(s, cpu_now() - c0);
    wall = std::min(wall, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  double mbps = double(big.size()) / 1e6 / s;
  std::printf("encode speed: %.2f MB in %.3f s of CPU = %.1f MB/s on one core (wall %.3f s; %zu tokens)\n",
              double(big.size()) / 1e6, s, mbps, wall, ids.size());
  const char* min_env = std::getenv("M3_TOKENIZER_MIN_MBPS");
  double min_mbps = min_env ? std::atof(min_env) : 5.0;
  EXPECT_GE(mbps, min_mbps) << "set M3_TOKENIZER_MIN_MBPS to change the bound on a loaded machine";
}

// --- load errors name the field or token ---------------------------------------------------------

json minimal() {
  json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = json::array({{{"id", 3}, {"content", "<s>"}, {"special", true}, {"normalized", false},
                                    {"lstrip", false}, {"rstrip", false}, {"single_word", false}}});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", json::array({"a b"})}};
  return j;
}

std::string load_error(const json& j, int64_t vocab = 64) {
  try {
    Tokenizer::from_json_text(j.dump(), vocab);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Tokenizer, MinimalLoadsAndMergesInBothSpellings) {
  json j = minimal();
  Tokenizer a = Tokenizer::from_json_text(j.dump(), 4);
  EXPECT_EQ(a.encode("ab<s>ba"), (std::vector<int32_t>{2, 3, 1, 0}));
  j["model"]["merges"] = json::array({json::array({"a", "b"})});
  Tokenizer b = Tokenizer::from_json_text(j.dump(), 4);
  EXPECT_EQ(b.encode("ab<s>ba"), (std::vector<int32_t>{2, 3, 1, 0}));
  EXPECT_EQ(b.decode(std::vector<int32_t>{2, 3, 1}), "ab<s>b");
  EXPECT_EQ(b.decode(std::vector<int32_t>{2, 3, 1}, true), "abb");
}

TEST(Tokenizer, LoadErrorsNameTheField) {
  auto expect_error = [](const json& j, const std::string& needle, int64_t vocab = 64) {
    std::string e = load_error(j, vocab);
    EXPECT_NE(e.find(needle), std::string::npos) << "error '" << e << "' does not mention '" << needle << "'";
  };
  json j = minimal();
  j["normalizer"] = {{"type", "Lowercase"}};
  expect_error(j, "normalizer.type 'Lowercase'");
  j = minimal();
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}, {{"type", "Strip"}}})}};
  expect_error(j, "normalizer.normalizers[1].type 'Strip'");
  j = minimal();
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", json::array({{{"type", "Metaspace"}}})}};
  expect_error(j, "pre_tokenizer.pretokenizers[0].type 'Metaspace'");
  j = minimal();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\bx"}}}, {"behavior", "Isolated"}, {"invert", false}};
  expect_error(j, "pre_tokenizer.pattern.Regex");
  j = minimal();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}, {"invert", false}};
  expect_error(j, "does not compile");
  j = minimal();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error(j, "decoder.type 'WordPiece'");
  j = minimal();
  j["post_processor"] = {{"type", "Weird"}};
  expect_error(j, "post_processor.type 'Weird'");
  j = minimal();
  j["model"]["type"] = "Unigram";
  expect_error(j, "model.type");
  j = minimal();
  j["model"]["byte_fallback"] = true;
  expect_error(j, "model.byte_fallback");
  j = minimal();
  j["model"]["dropout"] = 0.1;
  expect_error(j, "model.dropout");
  j = minimal();
  j["truncation"] = {{"max_length", 5}};
  expect_error(j, "truncation");
  j = minimal();
  j["model"]["merges"] = json::array({"a c"});
  expect_error(j, "model.merges[0]: token 'c'");
  j = minimal();
  j["model"]["merges"] = json::array({"a b c"});
  expect_error(j, "model.merges[0]");
  j = minimal();
  j["added_tokens"][0]["id"] = 7;
  expect_error(j, "added_tokens[0] '<s>' says id 7, but tokenizers gives it id 3");
  // ids below the model's vocab size
  expect_error(minimal(), "token '<s>' (added_tokens) has id 3, which is not below the model's vocab size 3", 3);
  j = minimal();
  j["model"]["vocab"]["zz"] = 100;
  j["added_tokens"][0]["id"] = 4;
  expect_error(j, "token 'zz' (model.vocab) has id 100");
  j = minimal();
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", json::array({{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}},
                                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                         {"special_tokens", {{"<bos>", {{"id", "<bos>"}, {"ids", {70}}, {"tokens", {"<bos>"}}}}}}};
  expect_error(j, "token '<bos>' (post_processor) has id 70");
  EXPECT_NE(load_error(json::object({{"version", "1.0"}}), 8).find("model is missing"), std::string::npos);
  try {
    Tokenizer::from_json_text("{not json", 8);
    ADD_FAILURE() << "bad JSON loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, BadInputIsAClearError) {
  Tokenizer t = Tokenizer::from_json_text(minimal().dump(), 8);
  try {
    t.encode("ok \xC3(");
    ADD_FAILURE() << "invalid UTF-8 encoded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid UTF-8 (byte 3"), std::string::npos) << e.what();
  }
  try {
    t.decode(std::vector<int32_t>{0, 8});
    ADD_FAILURE() << "id past the vocabulary decoded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 8 (position 1)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(t.decode(std::vector<int32_t>{0, 5, 1}), "ab");  // ids with no token (padding rows) decode to nothing
}

TEST(Tokenizer, Utf8LossyAndStreamAgree) {
  std::mt19937 rng(7);
  for (int k = 0; k < 2000; ++k) {
    std::string bytes;
    size_t n = rng() % 12;
    for (size_t i = 0; i < n; ++i) {
      static const unsigned char pool[] = {'a', 0x80, 0xBF, 0xC2, 0xC3, 0xE0, 0xE2, 0xED, 0xF0, 0xF4, 0xF5, 0xFF, 0x9F, 0xA0, 0x8F};
      bytes += char(pool[rng() % sizeof pool]);
    }
    Utf8Stream s;
    std::string out;
    for (char ch : bytes) out += s.push(std::string(1, ch));
    out += s.finish();
    ASSERT_EQ(out, utf8_lossy(bytes));
    ASSERT_EQ(utf8_invalid_at(out), std::string::npos);
  }
  EXPECT_EQ(utf8_lossy("\xE2\x82"), "\xEF\xBF\xBD");        // one maximal subpart
  EXPECT_EQ(utf8_lossy("\xE2\x82" "a"), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate: three
}

// make-tiny's tokenizer: M3's layout sized to the vocabulary, config's BOS/EOS on M3's markers.
TEST(Tokenizer, TinyTokenizerFitsTheVocabulary) {
  Tokenizer t = Tokenizer::from_json_text(tiny_tokenizer_json(1024, 1, 2), 1024);
  EXPECT_EQ(t.token_to_id("]~!b["), 1);
  EXPECT_EQ(t.token_to_id("[e~["), 2);
  const auto& added = m3_added_tokens();
  // the other 59 right after the merges, the last at 1020 (as 200060 of 200064), 3 rows of padding
  EXPECT_EQ(t.token_to_id(added.front().content), 1024 - 3 - int(added.size()) + 2);
  EXPECT_EQ(t.token_to_id(added.back().content), 1024 - 4);
  EXPECT_FALSE(t.id_to_token(1023).has_value());
  std::string text = "]~!b[]~b]user\nHello, world! 你好 😀<mm:think>x</mm:think>[e~[";
  std::vector<int32_t> ids = t.encode(text);
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
  EXPECT_LT(ids.size(), text.size() / 2) << "the merges should compress English";
  try {
    tiny_tokenizer_json(300, 1, 2);
    ADD_FAILURE() << "a 300-row vocabulary took a byte-level BPE";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs at least 320"), std::string::npos) << e.what();
  }
}

}  // namespace
