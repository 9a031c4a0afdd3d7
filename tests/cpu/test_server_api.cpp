// The /v1/completions contract without HTTP: every bad input maps to the right 4xx status, param,
// code and a message naming the problem; good inputs map to the right engine requests; response
// and chunk JSON have the fields clients read; /metrics is valid Prometheus text.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "serve/completion_api.h"
#include "serve/metrics.h"
#include "serve/server.h"
#include "serve/smoke.h"

using namespace m3;
using namespace m3::serve;
using nlohmann::json;

namespace {

ApiLimits limits() {
  ApiLimits l;
  l.model = "tiny";
  l.vocab_size = 1024;
  l.max_model_len = 64;
  l.max_prompt_tokens = 40;
  l.max_completion_tokens = 32;
  l.max_prompts = 4;
  return l;
}

std::string with(const std::string& extra) {  // a valid body plus/overriding fields
  json j = {{"model", "tiny"}, {"prompt", {1, 2, 3}}, {"max_tokens", 4}};
  json e = json::parse(extra);
  for (auto it = e.begin(); it != e.end(); ++it) {
    if (it.value().is_null() && it.key().rfind("-", 0) == 0) continue;
    j[it.key()] = it.value();
  }
  return j.dump();
}
std::string without(const std::string& key) {
  json j = {{"model", "tiny"}, {"prompt", {1, 2, 3}}, {"max_tokens", 4}};
  j.erase(key);
  return j.dump();
}

struct BadCase {
  std::string body;
  int status;
  std::string param, code, message;  // message: a substring the error must contain
};

}  // namespace

TEST(CompletionApi, EveryBadInputGetsItsError) {
  const std::string p41 = json(std::vector<int>(41, 7)).dump();
  const std::string p40 = json(std::vector<int>(40, 7)).dump();
  const std::vector<BadCase> cases = {
      {"{", 400, "", "invalid_json", "not valid JSON"},
      {"", 400, "", "invalid_json", "not valid JSON"},
      {"[1,2]", 400, "", "", "must be a JSON object"},
      // a NUL byte ended the input for the JSON parser, so this parsed as a valid request
      // (fuzz_completion_request; the input it found is fuzz/corpus/completion_request/regress-nul-ends-json)
      {std::string(R"({"model":"tiny","prompt":[1]})") + '\0' + "{", 400, "", "invalid_json", "NUL byte"},
      {std::string(R"({"model":"tiny","prompt":[1],"user":"a)") + '\0' + R"("})", 400, "", "invalid_json", "NUL byte"},
      {without("model"), 400, "model", "", "'model' is required"},
      {with(R"({"model": 5})"), 400, "model", "", "'model' must be a string"},
      {with(R"({"model": "gpt-4"})"), 404, "model", "model_not_found", "'gpt-4' does not exist"},
      {without("prompt"), 400, "prompt", "", "'prompt' is required"},
      {with(R"({"prompt": "hello"})"), 400, "prompt", "no_tokenizer", "no tokenizer"},
      {with(R"({"prompt": ["hello", "world"]})"), 400, "prompt", "no_tokenizer", "no tokenizer"},
      {with(R"({"prompt": {"a": 1}})"), 400, "prompt", "", "must be a list of token ids"},
      {with(R"({"prompt": []})"), 400, "prompt", "empty_prompt", "empty"},
      {with(R"({"prompt": [[1], []]})"), 400, "prompt", "empty_prompt", "'prompt[1]' is empty"},
      {with(R"({"prompt": [[1], 2]})"), 400, "prompt", "", "'prompt[1]' must be a list"},
      {with(R"({"prompt": [[1], [2], [3], [4], [5]]})"), 400, "prompt", "", "at most 4 prompts"},
      {with(R"({"prompt": [1, 2.5]})"), 400, "prompt", "", "'prompt[1]' must be an integer token id"},
      {with(R"({"prompt": [1, true]})"), 400, "prompt", "", "'prompt[1]' must be an integer token id, got a boolean"},
      {with(R"({"prompt": [1, null]})"), 400, "prompt", "", "'prompt[1]' must be an integer"},
      {with(R"({"prompt": [1, 1024]})"), 400, "prompt", "invalid_token_id", "'prompt[1]' = 1024 is outside the vocabulary [0, 1024)"},
      {with(R"({"prompt": [-1]})"), 400, "prompt", "invalid_token_id", "= -1 is outside"},
      {with(R"({"prompt": [[5], [3, 99999999999]]})"), 400, "prompt", "invalid_token_id", "'prompt[1][1]' = 99999999999"},
      // past INT64_MAX: was param 'prompt[0]', no code (seen in fuzz_completion_request's corpus)
      {with(R"({"prompt": [18446744073709551615]})"), 400, "prompt", "invalid_token_id",
       "'prompt[0]' = 18446744073709551615 is outside"},
      {with(R"({"stop_token_ids": [9223372036854775808]})"), 400, "stop_token_ids", "invalid_token_id",
       "'stop_token_ids[0]' = 9223372036854775808 is outside"},
      {with(R"({"prompt": )" + p41 + "}"), 400, "prompt", "context_length_exceeded", "41 tokens; this server accepts at most 40"},
      {with(R"({"prompt": )" + p40 + R"(, "max_tokens": 30})"), 400, "max_tokens", "context_length_exceeded",
       "maximum context length is 64 tokens, but 70"},
      {with(R"({"max_tokens": 0})"), 400, "max_tokens", "", "at least 1"},
      {with(R"({"max_tokens": -3})"), 400, "max_tokens", "", "at least 1"},
      {with(R"({"max_tokens": 33})"), 400, "max_tokens", "", "limit of 32"},
      {with(R"({"max_tokens": "5"})"), 400, "max_tokens", "", "must be an integer, got a string"},
      {with(R"({"max_tokens": 2.5})"), 400, "max_tokens", "", "must be an integer"},
      {with(R"({"temperature": 2.5})"), 400, "temperature", "", "[0, 2]"},
      {with(R"({"temperature": -0.1})"), 400, "temperature", "", "[0, 2]"},
      {with(R"({"temperature": "hot"})"), 400, "temperature", "", "must be a number"},
      {with(R"({"top_p": 0})"), 400, "top_p", "", "(0, 1]"},
      {with(R"({"top_p": 1.5})"), 400, "top_p", "", "(0, 1]"},
      {with(R"({"top_k": -2})"), 400, "top_k", "", "top_k"},
      {with(R"({"n": 0})"), 400, "n", "", "'n' must be in [1, "},
      {with(R"({"n": 99})"), 400, "n", "", "'n' must be in [1, "},
      {R"({"model":"tiny","prompt":[[1],[2],[3]],"n":2})", 400, "n", "", "3 prompts x n = 2 make 6 choices"},
      {with(R"({"best_of": 3})"), 400, "best_of", "", "best_of"},
      {with(R"({"echo": true})"), 400, "echo", "", "not supported"},
      {with(R"({"logprobs": 21})"), 400, "logprobs", "", "'logprobs' must be in [0, 20]"},
      {with(R"({"logprobs": -1})"), 400, "logprobs", "", "'logprobs' must be in [0, 20]"},
      {with(R"({"logprobs": true})"), 400, "logprobs", "", "must be an integer"},
      {with(R"({"suffix": "x"})"), 400, "suffix", "", "not supported"},
      {with(R"({"presence_penalty": 0.5})"), 400, "presence_penalty", "", "not supported"},
      {with(R"({"frequency_penalty": 3})"), 400, "frequency_penalty", "", "[-2, 2]"},
      {with(R"({"logit_bias": {"5": 1}})"), 400, "logit_bias", "", "not supported"},
      {with(R"({"stop": "\n"})"), 400, "stop", "no_tokenizer", "stop_token_ids"},
      {with(R"({"stop": ["a", "b"]})"), 400, "stop", "no_tokenizer", "stop_token_ids"},
      {with(R"({"stop": 5})"), 400, "stop", "", "must be a string or a list"},
      {with(R"({"stop_token_ids": [5000]})"), 400, "stop_token_ids", "invalid_token_id", "'stop_token_ids[0]' = 5000"},
      {with(R"({"stop_token_ids": 5})"), 400, "stop_token_ids", "", "must be a list of token ids"},
      {with(R"({"ignore_eos": "no"})"), 400, "ignore_eos", "", "must be a boolean"},
      {with(R"({"seed": 1.5})"), 400, "seed", "", "must be an integer"},
      {with(R"({"stream": "yes"})"), 400, "stream", "", "must be a boolean"},
      {with(R"({"stream_options": {"include_usage": true}})"), 400, "stream_options", "", "only allowed when 'stream' is true"},
      {with(R"({"stream": true, "stream_options": {"include_usage": 1}})"), 400, "stream_options.include_usage", "",
       "must be a boolean"},
      {with(R"({"user": 5})"), 400, "user", "", "must be a string"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.body);
    ApiError e;
    auto p = parse_completion_request(c.body, limits(), e);
    ASSERT_FALSE(p.has_value());
    EXPECT_EQ(e.status, c.status);
    EXPECT_EQ(e.param, c.param);
    EXPECT_EQ(e.code, c.code);
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_NE(e.message.find(c.message), std::string::npos) << "message: " << e.message;
    // and the JSON clients get
    json j = json::parse(error_json(e));
    EXPECT_EQ(j["error"]["message"], e.message);
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_TRUE(c.param.empty() ? j["error"]["param"].is_null() : j["error"]["param"] == c.param);
    EXPECT_TRUE(c.code.empty() ? j["error"]["code"].is_null() : j["error"]["code"] == c.code);
  }
}

TEST(CompletionApi, GoodInputsBecomeEngineRequests) {
  ApiError e;
  auto p = parse_completion_request(R"({"model":"tiny","prompt":[1,2,3],"some_future_field":{"x":1}})", limits(), e);
  ASSERT_TRUE(p) << e.message;
  EXPECT_EQ(p->prompts, (std::vector<std::vector<int32_t>>{{1, 2, 3}}));
  EXPECT_EQ(p->max_tokens, 16);  // OpenAI's default
  EXPECT_EQ(p->temperature, 1.0f);
  EXPECT_FALSE(p->seed.has_value());
  EXPECT_FALSE(p->stream);
  GenerationRequest r = p->request(0, 4242);
  EXPECT_EQ(r.sampling.seed, 4242u);
  EXPECT_EQ(r.max_tokens, 16);

  p = parse_completion_request(
      R"({"model":"tiny","prompt":[[1],[2,1023]],"max_tokens":5,"temperature":0,"top_p":0.5,"top_k":-1,"seed":7,
          "stop_token_ids":[9],"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true},"n":1,
          "stop":[],"logit_bias":{},"user":"u","presence_penalty":0,"logprobs":null,"suffix":null,"echo":false})",
      limits(), e);
  ASSERT_TRUE(p) << e.message;
  ASSERT_EQ(p->prompts.size(), 2u);
  r = p->request(1, 99);
  EXPECT_EQ(r.prompt, (std::vector<int32_t>{2, 1023}));
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_EQ(r.sampling.seed, 7u);
  EXPECT_EQ(r.stop_token_ids, (std::vector<int32_t>{9}));
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_TRUE(p->stream);
  EXPECT_TRUE(p->include_usage);

  // n choices per prompt, prompt-major; a given seed steps by one per choice of a prompt
  p = parse_completion_request(R"({"model":"tiny","prompt":[[1],[2,3]],"n":2,"seed":40})", limits(), e);
  ASSERT_TRUE(p) << e.message;
  ASSERT_EQ(p->choices(), 4u);
  const std::vector<std::vector<int32_t>> want_prompt{{1}, {1}, {2, 3}, {2, 3}};
  for (size_t c = 0; c < 4; ++c) {
    EXPECT_EQ(p->request(c, 5).prompt, want_prompt[c]) << c;
    EXPECT_EQ(p->request(c, 5).sampling.seed, 40u + c % 2) << c;
  }

  // without max_tokens, the default shrinks to what the context leaves (64 - 60 = 4)
  ApiLimits roomy = limits();
  roomy.max_prompt_tokens = 63;
  json d = {{"model", "tiny"}, {"prompt", std::vector<int>(60, 1)}};
  p = parse_completion_request(d.dump(), roomy, e);
  ASSERT_TRUE(p) << e.message;
  EXPECT_EQ(p->max_tokens, 4);

  // exactly at the limits
  json j = {{"model", "tiny"}, {"prompt", std::vector<int>(40, 1023)}, {"max_tokens", 24}};
  EXPECT_TRUE(parse_completion_request(j.dump(), limits(), e)) << e.message;
}

// Sizes and nesting are capped before the body is parsed: a body over max_body_bytes is 413, one
// nested deeper than max_json_depth is 400, whatever follows (even invalid JSON).
TEST(CompletionApi, SizeAndNestingAreCheckedBeforeParsing) {
  ApiLimits l = limits();
  l.max_body_bytes = 200;
  l.max_json_depth = 4;
  ApiError e;
  const std::string ok = R"({"model":"tiny","prompt":[[1,2]],"x":[{"y":[]}]})";  // depth 4
  ASSERT_TRUE(parse_completion_request(ok, l, e)) << e.message;
  std::string big = R"({"model":"tiny","prompt":[1],"pad":")" + std::string(200, 'a') + "\"}";
  EXPECT_FALSE(parse_completion_request(big, l, e));
  EXPECT_EQ(e.status, 413);
  EXPECT_EQ(e.code, "body_too_large");
  EXPECT_NE(e.message.find("limit of 200 bytes"), std::string::npos) << e.message;
  for (const std::string& deep : {std::string(R"({"model":"tiny","prompt":[[1,2]],"x":[{"y":[[]]}]})"),
                                 std::string(5, '['), std::string("{\"a\":") + std::string(150, '{')}) {
    SCOPED_TRACE(deep);
    EXPECT_FALSE(parse_completion_request(deep, l, e));
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "json_too_deep");
    EXPECT_NE(e.message.find("nested deeper than 4 levels"), std::string::npos) << e.message;
  }
  // brackets inside strings are not nesting
  const std::string in_str = R"({"model":"tiny","prompt":[1],"user":"[[[[[{{{{\"\\[[[["})";
  EXPECT_TRUE(parse_completion_request(in_str, l, e)) << e.message;

  EXPECT_EQ(json_nesting_depth("", 10), 0);
  EXPECT_EQ(json_nesting_depth("123", 10), 0);
  EXPECT_EQ(json_nesting_depth("[]", 10), 1);
  EXPECT_EQ(json_nesting_depth(R"([{"a":[1]},[[2]]])", 10), 3);
  EXPECT_EQ(json_nesting_depth(R"(["]]][[[", "\\", "\"[[", [[]]])", 10), 3);
  EXPECT_EQ(json_nesting_depth(R"("\\"[[)", 10), 2);  // the escaped backslash does not escape the quote
  EXPECT_EQ(json_nesting_depth("]]]][", 10), 1);      // invalid JSON: a bound, and never negative
  EXPECT_EQ(json_nesting_depth(std::string(1000, '['), 10), 11);  // stops once past the cap
}

TEST(CompletionApi, ResponseAndChunkJson) {
  std::vector<ChoiceResult> ch = {{.index = 0, .tokens = {5, 17, 3}, .finish_reason = "length"},
                                  {.index = 1, .tokens = {8, 2}, .finish_reason = "stop", .stop_token = 2}};
  json r = json::parse(completion_json("cmpl-1", 123, "tiny", ch, Usage{7, 5}));
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "tiny");
  EXPECT_EQ(r["created"], 123);
  EXPECT_EQ(r["choices"][0]["text"], "5 17 3");
  EXPECT_EQ(r["choices"][0]["token_ids"], json({5, 17, 3}));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(r["choices"][0]["stop_reason"].is_null());
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(r["choices"][1]["index"], 1);
  EXPECT_EQ(r["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(r["choices"][1]["stop_reason"], 2);
  EXPECT_EQ(r["usage"], json({{"prompt_tokens", 7}, {"completion_tokens", 5}, {"total_tokens", 12}}));

  json c0 = json::parse(chunk_json("cmpl-1", 1, "tiny", ChoiceResult{.index = 0, .tokens = {5}}, false));
  json c1 = json::parse(
      chunk_json("cmpl-1", 1, "tiny", ChoiceResult{.index = 0, .tokens = {17}, .finish_reason = "length"}, true));
  EXPECT_EQ(c0["choices"][0]["text"].get<std::string>() + c1["choices"][0]["text"].get<std::string>(), "5 17");
  EXPECT_TRUE(c0["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(c1["choices"][0]["finish_reason"], "length");
  json u = json::parse(usage_chunk_json("cmpl-1", 1, "tiny", Usage{3, 2}));
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 5);

  json m = json::parse(models_json(limits(), 9));
  EXPECT_EQ(m["object"], "list");
  EXPECT_EQ(m["data"][0]["id"], "tiny");
  EXPECT_EQ(m["data"][0]["vocab_size"], 1024);
  EXPECT_EQ(m["data"][0]["max_model_len"], 64);
}

TEST(CompletionApi, ConstantTimeEqual) {
  EXPECT_TRUE(constant_time_equal("", ""));
  EXPECT_TRUE(constant_time_equal("Bearer abc", "Bearer abc"));
  EXPECT_FALSE(constant_time_equal("Bearer abc", "Bearer abd"));
  EXPECT_FALSE(constant_time_equal("Bearer ab", "Bearer abc"));
  EXPECT_FALSE(constant_time_equal("Bearer abc", "Bearer ab"));
  EXPECT_FALSE(constant_time_equal("", "x"));
  EXPECT_FALSE(constant_time_equal(std::string("a\0b", 3), std::string("a\0c", 3)));
}

// Checks the Prometheus text exposition format line by line; returns the problems found.
static std::vector<std::string> prom_problems(const std::string& page) {
  static const std::regex help(R"(^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*)$)");
  static const std::regex type(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (gauge|counter|histogram|summary|untyped)$)");
  static const std::regex sample(
      R"re(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:\\.|[^"\\])*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:\\.|[^"\\])*")*\})? (-?[0-9.eE+-]+|\+Inf|-Inf|NaN)$)re");
  std::vector<std::string> bad;
  std::istringstream in(page);
  std::string line, family, ftype;
  std::set<std::string> seen;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, help)) {
      family = m[1];
      if (!seen.insert(family).second) bad.push_back("family declared twice: " + family);
      ftype.clear();
    } else if (std::regex_match(line, m, type)) {
      if (m[1] != family) bad.push_back("TYPE without its HELP: " + line);
      ftype = m[2];
    } else if (std::regex_match(line, m, sample)) {
      std::string n = m[1];
      bool ok = n == family;
      if (ftype == "histogram") ok = n == family + "_bucket" || n == family + "_sum" || n == family + "_count";
      if (!ok || ftype.empty()) bad.push_back("sample outside its family: " + line);
    } else {
      bad.push_back("not a valid line: " + line);
    }
  }
  if (!page.empty() && page.back() != '\n') bad.push_back("page does not end with a newline");
  return bad;
}

TEST(Metrics, PrometheusTextFormat) {
  EngineStats e;
  e.backend = "cpu\"ref\\x\ny";
  e.waiting = 3;
  e.running = 5;
  e.cache_blocks_total = 100;
  e.cache_blocks_used = 42;
  e.cache_block_size = 16;
  e.steps = 7;
  e.generation_tokens = 30;
  e.tokens_per_second = 12.5;
  e.step_latency = Histogram({0.001, 0.01, 0.1});
  for (double v : {0.0005, 0.002, 0.003, 0.05, 0.5, 0.001}) e.step_latency.observe(v);
  e.batch_size = Histogram({1, 2, 4});
  e.batch_size.observe(3);
  e.steps_by_path["native"] = 5;
  e.steps_by_path["mono"] = 2;
  e.fallbacks[{"native", "mono:prefill"}] = 4;
  e.requests_finished["length"] = 9;
  ServerCounters s;
  s.active_requests = 2;
  s.responses_by_code[200] = 10;
  s.responses_by_code[400] = 1;
  e.prompt_tokens = 77;
  e.time_to_first_token = Histogram({0.01, 0.1});
  for (double v : {0.005, 0.05, 0.5}) e.time_to_first_token.observe(v);
  e.inter_token_latency = Histogram({0.01});
  e.inter_token_latency.observe(0.002);
  e.e2e_latency = Histogram({1.0});
  const std::string page = render_metrics(e, s, "m\"3");
  for (const auto& p : prom_problems(page)) ADD_FAILURE() << p;

  auto has = [&](const std::string& line) {
    EXPECT_NE(page.find("\n" + line + "\n"), std::string::npos) << "missing line: " << line << "\n" << page;
  };
  has(R"(m3_backend_info{backend="cpu\"ref\\x\ny"} 1)");
  has("m3_queue_depth 3");
  has("m3_requests_running 5");
  has("m3_cache_blocks_used 42");
  has("m3_cache_blocks_free 58");
  has("m3_generation_tokens_per_second 12.5");
  has(R"(m3_steps_total{path="mono"} 2)");
  has(R"(m3_steps_total{path="native"} 5)");
  has(R"(m3_step_fallbacks_total{path="native",reason="mono:prefill"} 4)");
  // buckets are cumulative; le is inclusive (0.001 falls in the first bucket)
  has(R"(m3_step_latency_seconds_bucket{le="0.001"} 2)");
  has(R"(m3_step_latency_seconds_bucket{le="0.01"} 4)");
  has(R"(m3_step_latency_seconds_bucket{le="0.1"} 5)");
  has(R"(m3_step_latency_seconds_bucket{le="+Inf"} 6)");
  has("m3_step_latency_seconds_count 6");
  has(R"(m3_requests_finished_total{reason="length"} 9)");
  has(R"(m3_requests_finished_total{reason="cancelled"} 0)");
  has(R"(m3_http_responses_total{code="400"} 1)");
  // vLLM's names, labelled with the model (escaped)
  has(R"(vllm:num_requests_running{model_name="m\"3"} 5)");
  has(R"(vllm:num_requests_waiting{model_name="m\"3"} 3)");
  has(R"(vllm:kv_cache_usage_perc{model_name="m\"3"} 0.42)");
  has(R"(vllm:generation_tokens_total{model_name="m\"3"} 30)");
  has(R"(vllm:prompt_tokens_total{model_name="m\"3"} 77)");
  has(R"(vllm:time_to_first_token_seconds_bucket{model_name="m\"3",le="0.01"} 1)");
  has(R"(vllm:time_to_first_token_seconds_bucket{model_name="m\"3",le="0.1"} 2)");
  has(R"(vllm:time_to_first_token_seconds_bucket{model_name="m\"3",le="+Inf"} 3)");
  has(R"(vllm:time_to_first_token_seconds_count{model_name="m\"3"} 3)");
  has(R"(vllm:inter_token_latency_seconds_count{model_name="m\"3"} 1)");
  has(R"(vllm:e2e_request_latency_seconds_count{model_name="m\"3"} 0)");
  EXPECT_EQ(metric_value(page, "m3_cache_blocks_used"), 42);
  EXPECT_EQ(metric_value(page, "m3_step_latency_seconds_sum"), 0.5565);
  EXPECT_TRUE(std::isnan(metric_value(page, "m3_nonexistent")));

  // the checker itself rejects malformed pages
  EXPECT_FALSE(prom_problems("m3_x 1\n").empty());                                  // no family
  EXPECT_FALSE(prom_problems("# HELP m3_x h\n# TYPE m3_x gauge\nm3_x{a=\"b} 1\n").empty());  // bad label
  EXPECT_FALSE(prom_problems("# HELP m3_x h\n# TYPE m3_x gauge\nm3_y 1\n").empty());  // wrong family
  EXPECT_TRUE(prom_problems("# HELP m3_x h\n# TYPE m3_x gauge\nm3_x 1\n").empty());
}
