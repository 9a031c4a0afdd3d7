// The OpenAI /v1/completions contract, without HTTP: parsing and validating a request body into
// engine requests (every bad input becomes an ApiError with a 4xx status naming the field), and
// writing responses, stream chunks, model lists and errors as JSON. Prompts are strings (encoded
// with the checkpoint's tokenizer.json, when the model directory has one) or token ids; the
// generated ids come back in choices[i].token_ids, and choices[i].text holds their decoded text
// (without a tokenizer: the same ids separated by spaces).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/request.h"
#include "serve/reasoning.h"
#include "serve/tool_calls.h"

namespace m3::text {
class Tokenizer;
}

namespace m3::serve {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" = null
  std::string code;   // "" = null
};
std::string error_json(const ApiError& e);

struct ApiLimits {
  std::string model;              // the served model id
  int vocab_size = 0;
  int max_model_len = 0;          // prompt + completion
  int max_prompt_tokens = 0;      // per prompt
  int max_completion_tokens = 0;  // max_tokens upper bound
  int max_prompts = 64;           // prompts in one request (prompt as a list of lists), and choices (prompts x n)
  // Checked before the body is parsed (parsing allocates about 20x a body's size, more with deep
  // nesting): longer bodies get 413, deeper ones 400.
  size_t max_body_bytes = 1 << 20;
  int max_json_depth = 32;        // arrays and objects, counting the body's own object
  int max_stop_strings = 16;      // entries of 'stop'
  int max_stop_bytes = 256;       // length of one stop string
  // The checkpoint's tokenizer, or null (token-id mode: text prompts and stop strings get a 400).
  const text::Tokenizer* tokenizer = nullptr;
};

struct CompletionParams {
  std::vector<std::vector<int32_t>> prompts;  // n choices per prompt
  int n = 1;  // choices per prompt: choice c samples prompt c / n (its seed, when given, + c % n)
  int max_tokens = 16;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;
  std::optional<uint64_t> seed;
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;  // stop strings (non-empty each); need the tokenizer
  bool text_output = false;       // a tokenizer is loaded: choices carry decoded text
  bool skip_special_tokens = true;
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // -1: none; k in [0, 20]: each token's log-probability and its k most likely alternatives
  // (completions: "logprobs": k; chat: "logprobs": true and "top_logprobs": k)
  int logprobs = -1;
  // Chat requests: the thinking mode (chat_template_kwargs.thinking_mode, default adaptive) that
  // splits a text choice into reasoning_content and content (serve/reasoning.h); none: no split.
  std::optional<ThinkingMode> thinking;
  // Chat requests with tools (and tool_choice not "none"): the tools, whose calls in a text choice
  // become tool_calls (serve/tool_calls.h); null: no parsing.
  nlohmann::json tools;
  size_t choices() const { return prompts.size() * size_t(n); }
  // The engine request of choice c (seed: the given one + c % n, else `fallback_seed`).
  GenerationRequest request(size_t c, uint64_t fallback_seed) const;
};

// Returns the parsed parameters, or nullopt with `err` set to the first problem found (status 4xx).
// Any bytes may come in: no exception leaves it, and it parses nothing before the size and
// nesting caps are checked. The server answers /v1/completions with exactly this.
std::optional<CompletionParams> parse_completion_request(std::string_view body, const ApiLimits& lim, ApiError& err);

// The 413 for a body longer than `max_body_bytes` (the server's reader sends it too).
ApiError body_too_large_error(size_t max_body_bytes);

// The deepest nesting of arrays and objects in `text` read as JSON, counting brackets outside
// strings; it stops at the first bracket deeper than `stop_above` and returns that depth. Exact
// for valid JSON; for any other text an upper bound of nothing in particular, never negative (the
// parser rejects such text anyway).
int json_nesting_depth(std::string_view text, int stop_above);

// One choice's result, for whole responses and stream chunks.
// One generated token's log-probability, as the API shows it: the token as text (its decoded
// bytes; "token_id:N" without a tokenizer) and its top alternatives.
struct LogprobText {
  std::string token;
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;
};
struct ChoiceResult {
  int index = 0;
  std::vector<int32_t> tokens;  // for chunks: the new tokens only
  std::string finish_reason;    // "", "length", "stop"
  int32_t stop_token = -1;      // the id that ended it with "stop", else -1
  std::string stop_string;      // the stop string that ended it ("stop_reason"), else ""
  std::optional<std::string> text;  // decoded text (for chunks: the new text); none: ids_text
  // Chat with a thinking split: the reasoning (for chunks: the new reasoning); none: no split, or
  // (a whole choice) no reasoning was opened.
  std::optional<std::string> reasoning;
  // Chat with tools: the calls parsed (for chunks: the new ones, the first being the choice's call
  // number tool_call_index).
  std::vector<ToolCall> tool_calls;
  int tool_call_index = 0;
  // when the request asked for logprobs: one per token of `tokens` (for chunks: the new ones)
  std::optional<std::vector<LogprobText>> logprobs;
};
struct Usage {
  int prompt_tokens = 0, completion_tokens = 0;
};

// " "-separated ids; `leading_space` when the text continues earlier tokens (stream chunks).
std::string ids_text(const std::vector<int32_t>& ids, bool leading_space = false);
std::string completion_json(const std::string& id, int64_t created, const std::string& model,
                            const std::vector<ChoiceResult>& choices, const Usage& usage);
std::string chunk_json(const std::string& id, int64_t created, const std::string& model, const ChoiceResult& choice,
                       bool continues);
std::string usage_chunk_json(const std::string& id, int64_t created, const std::string& model, const Usage& usage);
std::string models_json(const ApiLimits& lim, int64_t created);

}  // namespace m3::serve
