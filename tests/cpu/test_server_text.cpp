// Text in the server, with the tiny checkpoint's tokenizer (make-tiny's tokenizer.json, vocab
// 1024): TextStream (incremental decoding + stop strings held back across tokens), text prompts
// and stop strings in /v1/completions parsing, /tokenize and /detokenize parsing and errors, and
// the HTTP server end to end: a scripted backend emits chosen tokens so that a multi-byte
// character split across tokens and a stop string split across chunks can be streamed on
// purpose; the CPU reference backend checks text == decode(token_ids) whole and streamed.
// Random inputs come from a fresh seed per test, printed (M3_TEST_SEED replays one).
#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <thread>

#include "common/random.h"
#include "model/synthetic.h"
#include "common/tiny_reference.h"
#include "ref/engine.h"
#include "runtime/engine.h"
#include "serve/completion_api.h"
#include "serve/server.h"
#include "serve/text_stream.h"
#include "serve/tokenize_api.h"
#include "text/template_chat.h"
#include "text/tiny_chat_template.h"
#include "text/tiny_tokenizer.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

using namespace m3;
using namespace m3::serve;
using nlohmann::json;

namespace {

// the built-in tiny model, built once per binary (common/tiny_reference.h)
const ModelSpec& tiny_spec() { return m3::test::tiny().spec; }
const ModelWeights& tiny_weights() { return m3::test::tiny().weights; }
std::shared_ptr<const text::Tokenizer> tiny_tokenizer() {
  static auto t = std::make_shared<const text::Tokenizer>(text::Tokenizer::from_json_text(
      text::tiny_tokenizer_json(tiny_spec().vocab_size, tiny_spec().bos_id, tiny_spec().eos_id), tiny_spec().vocab_size));
  return t;
}

uint64_t announce_seed(const char* test) {
  uint64_t seed = test::fresh_seed();
  std::printf("[ seed     ] %s: M3_TEST_SEED=%llu\n", test, (unsigned long long)seed);
  return seed;
}

// Random text mixing ASCII words, Latin accents, CJK, emoji and whitespace: multi-byte characters
// that the tiny vocabulary (trained mostly on English) splits over several byte tokens.
std::string random_text(std::mt19937_64& rng, int pieces) {
  static const std::vector<std::string> parts = {"the", " dog", " robot", "é", "ü", "ñ", "你", "好", "世界", "😀",
                                                 "🚀", "ß", " ", "\n", ",", ".", "42", " hello", "Привет", "ç"};
  std::string s;
  for (int i = 0; i < pieces; ++i) s += parts[rng() % parts.size()];
  return s;
}

// True when the token's bytes alone are not complete UTF-8 (it splits a character).
bool splits_character(const text::Tokenizer& t, int32_t id) {
  std::string bytes;
  bool emitted = false;
  t.append_token_bytes(id, false, bytes, emitted);
  return !(text::utf8_invalid_at(bytes) == std::string_view::npos);
}

ApiLimits text_limits() {
  ApiLimits l;
  l.model = "tiny";
  l.vocab_size = 1024;
  l.max_model_len = 256;
  l.max_prompt_tokens = 200;
  l.max_completion_tokens = 64;
  l.max_prompts = 4;
  l.tokenizer = tiny_tokenizer().get();
  return l;
}

}  // namespace

TEST(TextStream, SplitCharactersAreNeverEmittedBroken) {
  const uint64_t seed = announce_seed("TextStream.SplitCharactersAreNeverEmittedBroken");
  SCOPED_TRACE("M3_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const auto& tok = *tiny_tokenizer();
  int split_tokens = 0;
  for (int round = 0; round < 200; ++round) {
    const std::string s = random_text(rng, 1 + int(rng() % 12));
    std::vector<int32_t> ids = tok.encode(s, false);
    TextStream ts(tok, {}, false);
    std::string out;
    for (int32_t id : ids) {
      split_tokens += splits_character(tok, id);
      std::string piece = ts.push(id);
      ASSERT_TRUE((text::utf8_invalid_at(piece) == std::string_view::npos)) << "a broken character was emitted for '" << s << "'";
      out += piece;
    }
    out += ts.finish();
    EXPECT_EQ(out, s);
    EXPECT_FALSE(ts.stopped());
  }
  EXPECT_GT(split_tokens, 50) << "the texts should hold characters split across tokens";
}

TEST(TextStream, StopStringsAreHeldBackAndRemoved) {
  const uint64_t seed = announce_seed("TextStream.StopStringsAreHeldBackAndRemoved");
  SCOPED_TRACE("M3_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const auto& tok = *tiny_tokenizer();
  int spanning = 0;
  for (int round = 0; round < 300; ++round) {
    const std::string s = random_text(rng, 4 + int(rng() % 12));
    std::vector<int32_t> ids = tok.encode(s, false);
    // a stop string cut from the text at character boundaries, 1-4 characters long
    std::vector<size_t> starts;
    for (size_t i = 0; i < s.size(); i += text::utf8_char_len(s, i)) starts.push_back(i);
    starts.push_back(s.size());
    size_t a = rng() % (starts.size() - 1);
    size_t b = std::min(starts.size() - 1, a + 1 + rng() % 4);
    const std::string stop = s.substr(starts[a], starts[b] - starts[a]);
    const std::string decoy = stop + "\x01";  // a longer stop string that never matches
    const std::string want = s.substr(0, s.find(stop));
    SCOPED_TRACE("text '" + s + "' stop '" + stop + "'");

    TextStream ts(tok, {decoy, stop}, false);
    std::string out;
    size_t tokens_in_match = 0, at = 0;
    for (int32_t id : ids) {
      std::string bytes;
      bool emitted = false;
      tok.append_token_bytes(id, false, bytes, emitted);
      const size_t first = s.find(stop);
      if (at + bytes.size() > first && at < first + stop.size()) tokens_in_match++;
      at += bytes.size();
      out += ts.push(id);
      ASSERT_EQ(want.compare(0, out.size(), out), 0) << "emitted past the stop string: '" << out << "'";
      if (ts.stopped()) break;
    }
    spanning += tokens_in_match > 1;
    out += ts.finish();
    ASSERT_TRUE(ts.stopped());
    EXPECT_EQ(ts.matched_stop(), stop);
    EXPECT_EQ(out, want);
  }
  EXPECT_GT(spanning, 30) << "some stop strings should span several tokens";

  // no match: everything comes out at the end, the held-back tail included
  TextStream ts(tok, {"xyz"}, false);
  std::string out;
  for (int32_t id : tok.encode("a quick x", false)) out += ts.push(id);
  EXPECT_EQ(out, "a quick ");  // "x" could start "xyz"
  EXPECT_EQ(out + ts.finish(), "a quick x");
  EXPECT_FALSE(ts.stopped());

  EXPECT_EQ(held_back_length("hello wo", {"world", "low"}), 2u);
  EXPECT_EQ(held_back_length("hello", {"low"}), 2u);
  EXPECT_EQ(held_back_length("hello", {"xyz"}), 0u);
  EXPECT_EQ(held_back_length("ab", {"abc"}), 2u);
  EXPECT_EQ(held_back_length("abc", {"abc"}), 0u);  // a whole match is not "held back"
}

TEST(CompletionApiText, TextPromptsAndStopStrings) {
  const auto& tok = *tiny_tokenizer();
  ApiLimits lim = text_limits();
  ApiError e;
  auto p = parse_completion_request(R"({"model":"tiny","prompt":"Hello, wörld 😀","max_tokens":3})", lim, e);
  ASSERT_TRUE(p) << e.message;
  ASSERT_EQ(p->prompts.size(), 1u);
  EXPECT_EQ(p->prompts[0], tok.encode("Hello, wörld 😀"));
  EXPECT_TRUE(p->text_output);
  EXPECT_TRUE(p->skip_special_tokens);

  p = parse_completion_request(
      R"({"model":"tiny","prompt":["one", "two three", [5, 6]],"stop":["\n", "", "ab"],"skip_special_tokens":false})",
      lim, e);
  ASSERT_TRUE(p) << e.message;
  ASSERT_EQ(p->prompts.size(), 3u);
  EXPECT_EQ(p->prompts[1], tok.encode("two three"));
  EXPECT_EQ(p->prompts[2], (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(p->stop, (std::vector<std::string>{"\n", "ab"}));
  EXPECT_FALSE(p->skip_special_tokens);
  p = parse_completion_request(R"({"model":"tiny","prompt":"x","stop":"END"})", lim, e);
  ASSERT_TRUE(p) << e.message;
  EXPECT_EQ(p->stop, (std::vector<std::string>{"END"}));

  struct Bad {
    std::string body;
    int status;
    std::string param, code, message;
  };
  const std::string bad_utf8 = std::string(R"({"model":"tiny","prompt":"ab)") + "\xff\xfe" + R"(","max_tokens":2})";
  const std::string bad_utf8_stop = std::string(R"({"model":"tiny","prompt":"ab","stop":["x)") + "\xc3" + R"("]})";
  const std::vector<Bad> cases = {
      {bad_utf8, 400, "prompt", "invalid_utf8", "'prompt' is not valid UTF-8"},
      {bad_utf8_stop, 400, "stop", "invalid_utf8", "'stop' is not valid UTF-8"},
      {R"({"model":"tiny","prompt":"\ud800 lone"})", 400, "prompt", "invalid_utf8", "not valid UTF-8"},
      {R"({"model":"tiny","prompt":""})", 400, "prompt", "empty_prompt", "'prompt' is an empty string"},
      // a number overflowing a double is invalid JSON (nlohmann throws out_of_range, not parse_error)
      {R"({"model":"tiny","prompt":"a","max_tokens":1e400})", 400, "", "invalid_json", "not valid JSON"},
      {R"({"model":"tiny","prompt":["a", ""]})", 400, "prompt", "empty_prompt", "'prompt[1]' is an empty string"},
      {R"({"model":"tiny","prompt":["a", 5]})", 400, "prompt", "", "'prompt[1]' must be a string or a list of token ids"},
      {R"({"model":"tiny","prompt":["a", [1, "b"]]})", 400, "prompt", "", "'prompt[1][1]' must be an integer token id"},
      {R"({"model":"tiny","prompt":["a","b","c","d","e"]})", 400, "prompt", "", "at most 4 prompts"},
      {R"({"model":"tiny","prompt":"a","stop":["a", 3]})", 400, "stop", "", "'stop[1]' must be a string"},
      {R"({"model":"tiny","prompt":"a","stop":{"x":1}})", 400, "stop", "", "must be a string or a list of strings"},
      {R"({"model":"tiny","prompt":"a","add_special_tokens":"yes"})", 400, "add_special_tokens", "", "must be a boolean"},
      {R"({"model":"tiny","prompt":"a","skip_special_tokens":1})", 400, "skip_special_tokens", "", "must be a boolean"},
      {json{{"model", "tiny"}, {"prompt", "a"}, {"stop", std::string(300, 'x')}}.dump(), 400, "stop", "", "at most 256"},
      {json{{"model", "tiny"}, {"prompt", std::string(300, 'q') + " " + std::string(300, 'z')}}.dump(), 400, "prompt",
       "context_length_exceeded", "this server accepts at most 200"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.body);
    auto r = parse_completion_request(c.body, lim, e);
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(e.status, c.status);
    EXPECT_EQ(e.param, c.param);
    EXPECT_EQ(e.code, c.code);
    EXPECT_NE(e.message.find(c.message), std::string::npos) << "message: " << e.message;
  }

  // without a tokenizer: text prompts and stop strings name the missing tokenizer
  lim.tokenizer = nullptr;
  for (const char* body : {R"({"model":"tiny","prompt":"hi"})", R"({"model":"tiny","prompt":["hi"]})",
                           R"({"model":"tiny","prompt":[1],"stop":"x"})"}) {
    SCOPED_TRACE(body);
    ASSERT_FALSE(parse_completion_request(body, lim, e));
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "no_tokenizer");
    EXPECT_NE(e.message.find("no tokenizer.json"), std::string::npos) << e.message;
  }

  // the choice JSON: decoded text and the stop string as stop_reason
  ChoiceResult c{.index = 0, .tokens = {5, 6}, .finish_reason = "stop", .stop_token = -1, .stop_string = "END",
                 .text = std::string("héllo")};
  json j = json::parse(completion_json("cmpl-1", 1, "tiny", {c}, Usage{1, 2}));
  EXPECT_EQ(j["choices"][0]["text"], "héllo");
  EXPECT_EQ(j["choices"][0]["token_ids"], json({5, 6}));
  EXPECT_EQ(j["choices"][0]["stop_reason"], "END");
}

TEST(TokenizeApi, RoundTripAndErrors) {
  const uint64_t seed = announce_seed("TokenizeApi.RoundTripAndErrors");
  SCOPED_TRACE("M3_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const auto& tok = *tiny_tokenizer();
  ApiLimits lim = text_limits();
  ApiError e;
  for (int round = 0; round < 100; ++round) {
    const std::string s = random_text(rng, 1 + int(rng() % 10)) + (rng() % 2 ? "[e~[" : "");
    auto ids = parse_tokenize_request(json{{"prompt", s}}.dump(), lim, nullptr, e);
    ASSERT_TRUE(ids) << e.message;
    EXPECT_EQ(*ids, tok.encode(s, true));
    json r = json::parse(tokenize_json(*ids, lim.max_model_len));
    EXPECT_EQ(r["count"], ids->size());
    EXPECT_EQ(r["max_model_len"], 256);
    auto text = parse_detokenize_request(json{{"model", "tiny"}, {"tokens", r["tokens"]}}.dump(), lim, e);
    ASSERT_TRUE(text) << e.message;
    EXPECT_EQ(*text, s);
    EXPECT_EQ(json::parse(detokenize_json(*text))["prompt"], s);
  }
  // markers are added tokens: one id each
  auto ids = parse_tokenize_request(R"({"prompt":"]~b]user\nhi[e~[","add_special_tokens":false})", lim, nullptr, e);
  ASSERT_TRUE(ids) << e.message;
  EXPECT_EQ(ids->front(), *tok.token_to_id("]~b]"));
  EXPECT_EQ(ids->back(), *tok.token_to_id("[e~["));

  struct Bad {
    bool detok;
    std::string body;
    int status;
    std::string param, code, message;
  };
  const std::vector<Bad> cases = {
      {false, "{", 400, "", "invalid_json", "not valid JSON"},
      {false, R"({"prompt": 5})", 400, "prompt", "", "'prompt' must be a string, got an integer"},
      {false, R"({"prompt": ["a"]})", 400, "prompt", "", "'prompt' must be a string, got an array"},
      {false, std::string(R"({"prompt": "a)") + "\x80" + "\"}", 400, "prompt", "invalid_utf8", "'prompt' is not valid UTF-8"},
      {false, R"({"prompt": "a", "add_special_tokens": "no"})", 400, "add_special_tokens", "", "must be a boolean"},
      {false, R"({"prompt": "a", "model": "gpt-4"})", 404, "model", "model_not_found", "does not exist"},
      {false, R"({"prompt": "a", "model": 3})", 400, "model", "", "'model' must be a string"},
      {false, R"({"messages": []})", 400, "", "no_chat_template", "/tokenize with 'messages' needs"},
      {false, "{}", 400, "prompt", "", "or 'messages' (a chat) is required"},
      {true, "{}", 400, "tokens", "", "'tokens' is required"},
      {true, R"({"tokens": "1 2"})", 400, "tokens", "", "'tokens' must be a list of token ids, got a string"},
      {true, R"({"tokens": [1, "2"]})", 400, "tokens", "", "'tokens[1]' must be an integer token id, got a string"},
      {true, R"({"tokens": [1, 2.5]})", 400, "tokens", "", "'tokens[1]' must be an integer"},
      {true, R"({"tokens": [1, 1024]})", 400, "tokens", "invalid_token_id", "'tokens[1]' = 1024 is outside the vocabulary [0, 1024)"},
      {true, R"({"tokens": [-1]})", 400, "tokens", "invalid_token_id", "'tokens[0]' = -1 is outside"},
      {true, R"({"tokens": [18446744073709551615]})", 400, "tokens", "invalid_token_id", "is outside"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.body);
    bool ok = c.detok ? parse_detokenize_request(c.body, lim, e).has_value()
                      : parse_tokenize_request(c.body, lim, nullptr, e).has_value();
    ASSERT_FALSE(ok);
    EXPECT_EQ(e.status, c.status);
    EXPECT_EQ(e.param, c.param);
    EXPECT_EQ(e.code, c.code);
    EXPECT_NE(e.message.find(c.message), std::string::npos) << "message: " << e.message;
  }
  lim.tokenizer = nullptr;
  EXPECT_FALSE(parse_tokenize_request(R"({"prompt":"a"})", lim, nullptr, e));
  EXPECT_EQ(e.code, "no_tokenizer");
  EXPECT_NE(e.message.find("/tokenize needs a tokenizer"), std::string::npos) << e.message;
  EXPECT_FALSE(parse_detokenize_request(R"({"tokens":[1]})", lim, e));
  EXPECT_EQ(e.code, "no_tokenizer");
}

namespace {

// A backend that generates a fixed script: the token sampled after position p is
// script[p + 1 - prompt_len] (logits one-hot on it), so greedy decoding emits the script.
class ScriptedBackend : public Backend {
 public:
  ScriptedBackend(std::vector<int32_t> script, int prompt_len, double delay_s)
      : spec_(tiny_spec()), script_(std::move(script)), prompt_len_(prompt_len), delay_(delay_s) {}
  std::string name() const override { return "scripted"; }
  const ModelSpec& spec() const override { return spec_; }
  int cache_block_size() const override { return spec_.index_block; }
  int num_cache_blocks() const override { return 64; }
  StepOutput step(const StepBatch& b, SelectionTrace*) override {
    if (delay_ > 0) std::this_thread::sleep_for(std::chrono::duration<double>(delay_));
    StepOutput out;
    out.vocab = spec_.vocab_size;
    int row = 0;
    for (const auto& s : b.seqs) {
      const int n = s.all_logits ? int(s.tokens.size()) : 1;
      out.first_row.push_back(row);
      out.num_rows.push_back(n);
      for (int i = 0; i < n; ++i) {
        const int pos = s.start_pos + (s.all_logits ? i : int(s.tokens.size()) - 1);
        const int k = pos + 1 - prompt_len_;
        std::vector<float> logits(size_t(spec_.vocab_size), 0.0f);
        logits[size_t(script_[size_t(std::clamp(k, 0, int(script_.size()) - 1))])] = 100.0f;
        out.logits.insert(out.logits.end(), logits.begin(), logits.end());
      }
      row += n;
    }
    return out;
  }

 private:
  ModelSpec spec_;
  std::vector<int32_t> script_;
  int prompt_len_;
  double delay_;
};

struct LiveText {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Server> server;
  std::thread thread;
  int port = 0;
  LiveText(std::unique_ptr<Backend> b, std::shared_ptr<const text::Tokenizer> tok,
           std::shared_ptr<const text::ChatTemplate> chat = nullptr) {
    engine = std::make_unique<Engine>(std::move(b));
    ServerOptions o;
    o.port = 0;
    o.model_name = "tiny";
    o.tokenizer = std::move(tok);
    o.chat_template = std::move(chat);
    server = std::make_unique<Server>(*engine, o);
    port = server->bind();
    thread = std::thread([this] { server->serve(); });
    for (int i = 0; i < 200; ++i) {
      auto r = client().Get("/health");
      if (r && r->status == 200) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~LiveText() {
    server->shutdown(0);
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(std::chrono::seconds(60));
    return c;
  }
  json post(const std::string& path, const json& body, int want_status = 200) const {
    auto r = client().Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r) << path;
    if (!r) return json();
    EXPECT_EQ(r->status, want_status) << r->body;
    return json::parse(r->body);
  }
  // The stream's choice chunks (parsed), checking it ends with [DONE].
  std::vector<json> stream(const json& body, const std::string& path = "/v1/completions",
                           json* usage = nullptr) const {
    auto r = client().Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    std::vector<json> chunks;
    if (!r) return chunks;
    size_t start = 0, pos;
    bool done = false;
    while ((pos = r->body.find("\n\n", start)) != std::string::npos) {
      std::string ev = r->body.substr(start, pos - start);
      start = pos + 2;
      if (ev.rfind("data: ", 0) != 0) continue;
      if (ev == "data: [DONE]") {
        done = true;
        continue;
      }
      json j = json::parse(ev.substr(6));
      EXPECT_FALSE(j.contains("error")) << ev;
      if (!j["choices"].empty()) chunks.push_back(j["choices"][0]);
      if (usage && j.contains("usage") && !j["usage"].is_null()) *usage = j["usage"];
    }
    EXPECT_TRUE(done);
    return chunks;
  }
};

json text_body(const json& prompt, int max_tokens) {
  return {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
}

json streamed_body(json b) {
  b["stream"] = true;
  return b;
}

}  // namespace

// The script decodes to a text with multi-byte characters split over byte tokens and a stop
// string whose bytes span several tokens (so several stream chunks).
TEST(ServerText, ScriptedStreamKeepsCharactersAndHoldsBackStop) {
  const auto tok = tiny_tokenizer();
  const std::string text = "Grüße 😀 aus 東京! STOP here 🚀 after";
  std::vector<int32_t> script = tok->encode(text, false);
  int split = 0;
  for (int32_t id : script) split += splits_character(*tok, id);
  ASSERT_GE(split, 4) << "the script should split characters across tokens";
  const std::vector<int32_t> prompt = {5, 6, 7};
  LiveText live(std::make_unique<ScriptedBackend>(script, int(prompt.size()), 0.0), tok);
  const int n = int(script.size());

  // whole, no stop: the text is the script's
  json r = live.post("/v1/completions", text_body(prompt, n));
  EXPECT_EQ(r["choices"][0]["text"], text);
  EXPECT_EQ(r["choices"][0]["token_ids"], json(script));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");

  // streamed: every chunk is valid UTF-8 (it is JSON) and the chunks add up to the text; a chunk
  // whose token only starts a character carries no text
  std::string streamed;
  int empty_text_chunks = 0;
  for (const json& c : live.stream(streamed_body(text_body(prompt, n)))) {
    streamed += c["text"].get<std::string>();
    empty_text_chunks += c["text"].get<std::string>().empty();
  }
  EXPECT_EQ(streamed, text);
  EXPECT_GT(empty_text_chunks, 0);

  // a stop string split across tokens: held back, removed, finish_reason stop
  const std::string want = text.substr(0, text.find(" STOP"));
  json sb = text_body(prompt, n);
  sb["stop"] = json::array({"nowhere", " STOP"});
  r = live.post("/v1/completions", sb);
  EXPECT_EQ(r["choices"][0]["text"], want);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["choices"][0]["stop_reason"], " STOP");
  const int used = int(r["choices"][0]["token_ids"].size());
  EXPECT_LT(used, n);
  EXPECT_EQ(r["usage"]["completion_tokens"], used);
  EXPECT_GT(tok->decode(r["choices"][0]["token_ids"].get<std::vector<int32_t>>()).size(), want.size());

  sb["stream"] = true;
  streamed.clear();
  std::string finish;
  size_t chunks = 0;
  for (const json& c : live.stream(sb)) {
    streamed += c["text"].get<std::string>();
    EXPECT_EQ(want.compare(0, streamed.size(), streamed), 0) << "streamed past the stop: " << streamed;
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    ++chunks;
  }
  EXPECT_EQ(streamed, want);
  EXPECT_EQ(finish, "stop");
  EXPECT_GT(chunks, 3u);

  // /tokenize and /detokenize over HTTP
  json t = live.post("/tokenize", {{"prompt", text}, {"add_special_tokens", false}});
  EXPECT_EQ(t["tokens"], json(script));
  EXPECT_EQ(t["count"], script.size());
  EXPECT_EQ(live.post("/detokenize", {{"tokens", script}})["prompt"], text);
  json bad = live.post("/detokenize", {{"tokens", {1, 99999}}}, 400);
  EXPECT_EQ(bad["error"]["param"], "tokens");
}

// The reference model's own output: text is the decoded token_ids (special tokens skipped by
// default), whole and streamed alike, for text prompts and a list of them.
TEST(ServerText, ReferenceTextEqualsDecodedIds) {
  const uint64_t seed = announce_seed("ServerText.ReferenceTextEqualsDecodedIds");
  SCOPED_TRACE("M3_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const auto tok = tiny_tokenizer();
  LiveText live(ref::make_ref_backend(tiny_spec(), tiny_weights(), {64, 2}), tok);
  for (int round = 0; round < 3; ++round) {
    const std::string p1 = random_text(rng, 3 + int(rng() % 6)), p2 = random_text(rng, 3 + int(rng() % 6));
    SCOPED_TRACE("prompts '" + p1 + "', '" + p2 + "'");
    json r = live.post("/v1/completions", text_body(json::array({p1, p2}), 10));
    ASSERT_EQ(r["choices"].size(), 2u);
    for (int i = 0; i < 2; ++i) {
      auto ids = r["choices"][i]["token_ids"].get<std::vector<int32_t>>();
      EXPECT_EQ(ids.size(), 10u);
      EXPECT_EQ(r["choices"][i]["text"], tok->decode(ids, /*skip_special_tokens=*/true));
    }
    EXPECT_EQ(r["usage"]["prompt_tokens"], tok->encode(p1).size() + tok->encode(p2).size());
    std::string streamed;
    std::vector<int32_t> ids;
    for (const json& c : live.stream(streamed_body(text_body(p1, 10)))) {
      streamed += c["text"].get<std::string>();
      for (int32_t t : c["token_ids"]) ids.push_back(t);
    }
    EXPECT_EQ(ids, r["choices"][0]["token_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(streamed, r["choices"][0]["text"]);
  }
}

// /v1/chat/completions over make-tiny's chat template: the prompt is the rendered conversation
// encoded without special tokens; the reply is message.content (whole) or delta.content (streamed,
// role first); usage counts the rendered prompt; bad messages and template kwargs get 400s.
TEST(ServerText, ChatCompletions) {
  const auto tok = tiny_tokenizer();
  auto chat = std::make_shared<const text::ChatTemplate>(text::ChatTemplate::compile(text::tiny_chat_template()));
  const json messages = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                     {{"role", "user"}, {"content", "Grüße 😀, wie geht's?"}}});
  const std::string rendered = chat->render(nlohmann::ordered_json{
      {"messages", nlohmann::ordered_json::parse(messages.dump())}, {"add_generation_prompt", true},
      {"thinking_mode", "disabled"}});
  EXPECT_NE(rendered.find("]~b]ai\n</mm:think>"), std::string::npos) << rendered;
  const std::vector<int32_t> prompt = tok->encode(rendered, false);
  const std::string reply = "Gut, danke 🚀! Und dir?";
  const std::vector<int32_t> script = tok->encode(reply, false);
  LiveText live(std::make_unique<ScriptedBackend>(script, int(prompt.size()), 0.0), tok, chat);
  json body = {{"model", "tiny"}, {"messages", messages}, {"max_completion_tokens", script.size()},
               {"temperature", 0}, {"ignore_eos", true}, {"chat_template_kwargs", {{"thinking_mode", "disabled"}}}};
  json r = live.post("/v1/chat/completions", body);
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], reply);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(r["usage"]["completion_tokens"], script.size());
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  // chat logprobs: the scripted token (logit 100, the rest 0) has log-probability ~0 and leads its
  // top 2; each entry's token is its decoded text and bytes
  json lb = body;
  lb["logprobs"] = true;
  lb["top_logprobs"] = 2;
  const json lr = live.post("/v1/chat/completions", lb);
  const json& content = lr["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), script.size());
  for (size_t t = 0; t < script.size(); ++t) {
    const int32_t one[1] = {script[t]};
    const std::string text = tok->decode(std::span<const int32_t>(one, 1), false);
    EXPECT_NEAR(content[t]["logprob"].get<double>(), 0.0, 1e-6);
    EXPECT_EQ(content[t]["bytes"].size(), text.size());
    ASSERT_EQ(content[t]["top_logprobs"].size(), 2u);
    EXPECT_NEAR(content[t]["top_logprobs"][0]["logprob"].get<double>(), 0.0, 1e-6);
    EXPECT_LT(content[t]["top_logprobs"][1]["logprob"].get<double>(), -99.0);
  }

  json sb = body;
  sb["stream"] = true;
  sb["stream_options"] = {{"include_usage", true}};
  sb["stop"] = "danke";
  json usage;
  std::string streamed;
  std::vector<json> chunks = live.stream(sb, "/v1/chat/completions", &usage);
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(chunks[0]["delta"]["role"], "assistant");
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (i > 0) {
      EXPECT_FALSE(chunks[i]["delta"].contains("role"));
    }
    streamed += chunks[i]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(streamed, "Gut, ");
  EXPECT_EQ(chunks.back()["finish_reason"], "stop");
  EXPECT_EQ(usage["prompt_tokens"], prompt.size());

  // /tokenize renders the same chat
  json t = live.post("/tokenize", {{"messages", messages}, {"chat_template_kwargs", {{"thinking_mode", "disabled"}}}});
  EXPECT_EQ(t["tokens"], json(prompt));
  json te = live.post("/tokenize", {{"messages", messages}, {"prompt", "x"}}, 400);
  EXPECT_EQ(te["error"]["param"], "prompt");
  te = live.post("/tokenize", json{{"messages", json::array({json{{"role", "user"}}})}}, 400);
  EXPECT_NE(te["error"]["message"].get<std::string>().find("'messages[0].content' is required"), std::string::npos) << te;

  struct Bad {
    json patch;
    std::string param, code, message;
  };
  const std::vector<Bad> cases = {
      {{{"messages", "hi"}}, "messages", "", "'messages' must be a list of messages, got a string"},
      {{{"messages", json::array()}}, "messages", "", "'messages' is empty"},
      {{{"messages", json::array({json{{"role", "wizard"}, {"content", "x"}}})}}, "messages", "", "'messages[0].role' = 'wizard'"},
      {{{"messages", json::array({json{{"content", "x"}}})}}, "messages", "", "'messages[0].role' is required"},
      {{{"messages", json::array({json{{"role", "user"}, {"content", 5}}})}}, "messages", "", "'messages[0].content' must be a string"},
      {{{"messages", json::array({json{{"role", "user"}, {"content", json::array({json{{"type", "image_url"}}})}}})}}, "messages", "",
       "'messages[0].content[0].type' must be \"text\""},
      {{{"chat_template_kwargs", {{"thinking_mode", "loud"}}}}, "messages", "chat_template_error", "thinking_mode must be"},
      {{{"chat_template_kwargs", 3}}, "chat_template_kwargs", "", "must be an object"},
      {{{"tools", {{"type", "function"}}}}, "tools", "", "'tools' must be a list"},
      {{{"max_tokens", 3}}, "max_completion_tokens", "", "not both"},
      {{{"temperature", 9}}, "temperature", "", "[0, 2]"},
      {{{"top_logprobs", 3}}, "top_logprobs", "", "needs 'logprobs': true"},
      {{{"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs", "", "'top_logprobs' must be in [0, 20]"},
      {{{"logprobs", "yes"}}, "logprobs", "", "must be a boolean"},
  };
  for (const auto& c : cases) {
    json b = body;
    b.update(c.patch);
    SCOPED_TRACE(b.dump());
    json e = live.post("/v1/chat/completions", b, 400);
    EXPECT_EQ(e["error"]["param"], c.param);
    EXPECT_EQ(c.code.empty() ? json(nullptr) : json(c.code), e["error"]["code"]);
    EXPECT_NE(e["error"]["message"].get<std::string>().find(c.message), std::string::npos) << e.dump();
  }
}

// The thinking split over HTTP: a scripted model writes `<mm:think>…</mm:think>answer` (the markers as
// the tokenizer's added tokens, and spelled in pieces); chat completions return the reasoning in
// message.reasoning_content and the answer in content, whole and streamed (delta.reasoning_content,
// then delta.content; no marker text in either), as the request's thinking_mode says: enabled (the
// template prefilled the opener, so the script starts inside the reasoning), adaptive (the
// default), disabled (everything is content). /v1/completions never splits.
TEST(ServerText, ChatSplitsThinkingFromTheAnswer) {
  const auto tok = tiny_tokenizer();
  auto chat = std::make_shared<const text::ChatTemplate>(text::ChatTemplate::compile(text::tiny_chat_template()));
  const json messages = json::array({{{"role", "user"}, {"content", "Warum? 😀"}}});
  const std::string reasoning = "Weil es 🚀 so ist.", answer = "\n\nDarum, ganz einfach.";
  std::vector<int32_t> opener = tok->encode("<mm:think>", false), closer = tok->encode("</mm:think>", false);
  ASSERT_EQ(opener.size(), 1u);  // an added token
  ASSERT_EQ(closer.size(), 1u);
  auto ids = [&](const std::string& s) { return tok->encode(s, false); };
  auto cat = [](std::vector<std::vector<int32_t>> parts) {
    std::vector<int32_t> v;
    for (auto& p : parts) v.insert(v.end(), p.begin(), p.end());
    return v;
  };
  struct Case {
    const char* mode;
    std::vector<int32_t> script;
    std::string reasoning, content;  // reasoning "-": null
  };
  const std::vector<Case> cases = {
      {"adaptive", cat({opener, ids(reasoning), closer, ids(answer)}), reasoning, answer},
      {"adaptive", cat({ids("<mm:"), ids("think>"), ids(reasoning), ids("</mm"), ids(":think>"), ids(answer)}),
       reasoning, answer},
      {"enabled", cat({ids(reasoning), closer, ids(answer)}), reasoning, answer},
      {"adaptive", ids(answer), "-", answer},
      {"disabled", cat({opener, ids(reasoning), closer, ids(answer)}), "-",
       "<mm:think>" + reasoning + "</mm:think>" + answer},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.mode) + " " + c.content);
    json body = {{"model", "tiny"}, {"messages", messages}, {"max_completion_tokens", c.script.size()},
                 {"temperature", 0}, {"ignore_eos", true}};
    if (std::string(c.mode) != "adaptive") body["chat_template_kwargs"] = {{"thinking_mode", c.mode}};
    nlohmann::ordered_json ctx = {{"messages", nlohmann::ordered_json::parse(messages.dump())},
                                  {"add_generation_prompt", true}};
    if (body.contains("chat_template_kwargs")) ctx["thinking_mode"] = c.mode;
    const int prompt_len = int(tok->encode(chat->render(ctx), false).size());
    LiveText live(std::make_unique<ScriptedBackend>(c.script, prompt_len, 0.0), tok, chat);
    json r = live.post("/v1/chat/completions", body);
    const json& msg = r["choices"][0]["message"];
    EXPECT_EQ(msg["content"], c.content);
    if (c.reasoning == "-") EXPECT_TRUE(msg["reasoning_content"].is_null()) << msg;
    else EXPECT_EQ(msg["reasoning_content"], c.reasoning);
    EXPECT_EQ(r["choices"][0]["token_ids"], json(c.script));
    // streamed: the same text, reasoning chunks first, never a marker
    json sb = body;
    sb["stream"] = true;
    std::string rs, cs;
    bool content_seen = false;
    for (const json& ch : live.stream(sb, "/v1/chat/completions")) {
      const json& d = ch["delta"];
      if (d.contains("reasoning_content")) {
        EXPECT_FALSE(content_seen) << "reasoning after the answer began";
        rs += d["reasoning_content"].get<std::string>();
      }
      if (d.contains("content")) {
        cs += d["content"].get<std::string>();
        content_seen = content_seen || !d["content"].get<std::string>().empty();
      }
    }
    EXPECT_EQ(rs, c.reasoning == "-" ? "" : c.reasoning);
    EXPECT_EQ(cs, c.content);
    // the plain completions endpoint keeps the text as it is
    json pr = live.post("/v1/completions", text_body(std::vector<int32_t>(size_t(prompt_len), 5), int(c.script.size())));
    EXPECT_EQ(pr["choices"][0]["text"], tok->decode(c.script));
  }
  // a thinking_mode that a template ignores but the split does not know is a 400 naming the field
  auto plain = std::make_shared<const text::ChatTemplate>(
      text::ChatTemplate::compile("{% for m in messages %}{{ m.content }}{% endfor %}"));
  LiveText live(std::make_unique<ScriptedBackend>(ids(answer), 8, 0.0), tok, plain);
  for (const json& mode : {json("loud"), json(3)}) {
    json bad = {{"model", "tiny"}, {"messages", messages}, {"chat_template_kwargs", {{"thinking_mode", mode}}}};
    json e = live.post("/v1/chat/completions", bad, 400);
    EXPECT_EQ(e["error"]["param"], "chat_template_kwargs") << e;
    EXPECT_NE(e["error"]["message"].get<std::string>().find("thinking_mode"), std::string::npos) << e;
  }
}

// Tool calls over HTTP: a scripted model thinks, says a word, then writes a call block in M3's
// namespaced XML; the chat response carries message.tool_calls (typed by the request's schema,
// ids "call_…"), the reasoning and the text apart, no markup in content, finish_reason
// "tool_calls"; streamed, delta.tool_calls with their index; tool_choice "none" leaves the block
// as text; tools that are not function schemas are a 400 naming 'tools'.
TEST(ServerText, ChatToolCalls) {
  const auto tok = tiny_tokenizer();
  auto chat = std::make_shared<const text::ChatTemplate>(text::ChatTemplate::compile(text::tiny_chat_template()));
  const json messages = json::array({{{"role", "user"}, {"content", "Wetter in Köln?"}}});
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {
      "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
      "hours": {"type": "array", "items": {"type": "integer"}}}}}}])");
  const std::string NS(kToolNs);
  const std::string calls = NS + "<tool_call>\n" + NS + "<invoke name=\"get_weather\">" + NS + "<city>Köln" + NS +
                            "</city>" + NS + "<days>2" + NS + "</days>" + NS + "<hours>" + NS + "<item>9" + NS + "</item>" +
                            NS + "<item>18" + NS + "</item>" + NS + "</hours>" + NS + "</invoke>\n" + NS + "</tool_call>";
  const std::string text = "<mm:think>Ich frage das Wetter ab.</mm:think>Moment." + calls;
  std::vector<int32_t> script = tok->encode(text, false);
  script.push_back(tiny_spec().eos_id);  // the turn ends after the call
  json body = {{"model", "tiny"}, {"messages", messages}, {"tools", tools}, {"max_completion_tokens", script.size() + 4},
               {"temperature", 0}};
  nlohmann::ordered_json ctx = {{"messages", nlohmann::ordered_json::parse(messages.dump())},
                                {"tools", nlohmann::ordered_json::parse(tools.dump())},
                                {"add_generation_prompt", true}};
  const int prompt_len = int(tok->encode(chat->render(ctx), false).size());
  LiveText live(std::make_unique<ScriptedBackend>(script, prompt_len, 0.0), tok, chat);
  json r = live.post("/v1/chat/completions", body);
  const json& ch = r["choices"][0];
  EXPECT_EQ(ch["finish_reason"], "tool_calls") << r;
  EXPECT_EQ(ch["message"]["content"], "Moment.");
  EXPECT_EQ(ch["message"]["reasoning_content"], "Ich frage das Wetter ab.");
  ASSERT_EQ(ch["message"]["tool_calls"].size(), 1u) << r;
  const json& call = ch["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()),
            json::parse(R"({"city": "Köln", "days": 2, "hours": [9, 18]})"));

  json sb = body;
  sb["stream"] = true;
  std::string content, reasoning, finish;
  std::vector<json> streamed_calls;
  for (const json& c : live.stream(sb, "/v1/chat/completions")) {
    const json& d = c["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("tool_calls"))
      for (const json& k : d["tool_calls"]) streamed_calls.push_back(k);
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(content, "Moment.");
  EXPECT_EQ(content.find(NS), std::string::npos);
  EXPECT_EQ(reasoning, "Ich frage das Wetter ab.");
  ASSERT_EQ(streamed_calls.size(), 1u);
  EXPECT_EQ(streamed_calls[0]["index"], 0);
  EXPECT_EQ(streamed_calls[0]["function"]["arguments"], call["function"]["arguments"]);
  EXPECT_EQ(finish, "tool_calls");

  json none = body;
  none["tool_choice"] = "none";
  json rn = live.post("/v1/chat/completions", none);
  EXPECT_EQ(rn["choices"][0]["message"]["content"], "Moment." + calls);
  EXPECT_FALSE(rn["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(rn["choices"][0]["finish_reason"], "stop");

  for (const json& bad : {json::array({json{{"type", "function"}}}),
                          json::array({json{{"type", "function"}, {"function", {{"name", ""}}}}}),
                          json::array({json{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", "x"}}}}})}) {
    json b = body;
    b["tools"] = bad;
    json e = live.post("/v1/chat/completions", b, 400);
    EXPECT_EQ(e["error"]["param"], "tools") << e;
  }
}
