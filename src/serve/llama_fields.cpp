#include "serve/llama_fields.h"

#include "serve/json_fields.h"

namespace bmoe {

using namespace json_fields;

const std::set<std::string>& llama_server_fields() {
  static const std::set<std::string> kFields = {
      "n_predict", "n_probs", "n_keep", "typical_p", "mirostat", "mirostat_tau", "mirostat_eta", "dynatemp_range",
      "dynatemp_exponent", "top_n_sigma", "xtc_probability", "xtc_threshold", "dry_multiplier", "dry_base",
      "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers", "min_keep", "samplers",
      "reasoning_format", "reasoning_budget_tokens", "continue_final_message", "return_tokens",
      "post_sampling_probs", "timings_per_token", "t_max_predict_ms", "repetition_penalty",
      // What llama.cpp's own web UI sends with every chat request.
      "return_progress", "sse_ping_interval", "reasoning_control", "backend_sampling", "thinking_budget_tokens",
      // The rest of llama-server's (tools/server/server-schema.cpp) a client may send.
      "verbose", "n_indent", "n_discard", "n_cache_reuse", "t_max_prompt_ms", "response_fields", "lora",
      "adaptive_target", "adaptive_decay", "n_cmpl", "reasoning_budget_message", "add_generation_prompt"};
  return kFields;
}

namespace {

// llama-server's `samplers`: a list of names or a string of their letters ("kypmxt").
void read_sampler_order(const json& body, SamplerConfig& s) {
  if (!body.contains("samplers") || body["samplers"].is_null()) return;
  const json& v = body["samplers"];
  std::vector<std::string> names;
  if (v.is_string()) {
    for (char ch : v.get<std::string>()) names.emplace_back(1, ch);
  } else if (v.is_array()) {
    for (const json& e : v) {
      if (!e.is_string()) bad_request("'samplers' must be a list of sampler names", "samplers");
      names.push_back(e.get<std::string>());
    }
  } else {
    bad_request("'samplers' must be a list of sampler names or a string of their letters", "samplers");
  }
  s.order.clear();
  s.use_penalties = s.use_dry = false;
  for (const std::string& name : names) {
    SamplerStep step = SamplerStep::TopK;
    std::string penalty;
    if (!sampler_step_named(name, &step, &penalty)) bad_request(fmt::format("'samplers': unknown sampler '{}'", utf8_sanitize(name)), "samplers");
    if (penalty == "penalties") s.use_penalties = true;
    else if (penalty == "dry") s.use_dry = true;
    else s.order.push_back(step);
  }
  // An empty chain still draws (at temperature 1): llama.cpp's does the same.
}

// DRY's sequence breakers: each string's tokens (llama.cpp's defaults: newline, colon, quote,
// asterisk).
void read_dry_breakers(const json& body, const Tokenizer* tok, SamplerConfig& s) {
  std::vector<std::string> breakers = {"\n", ":", "\"", "*"};
  if (body.contains("dry_sequence_breakers") && !body["dry_sequence_breakers"].is_null()) {
    const json& v = body["dry_sequence_breakers"];
    if (!v.is_array() || v.size() > 64) bad_request("'dry_sequence_breakers' must be a list of up to 64 strings", "dry_sequence_breakers");
    breakers.clear();
    for (const json& e : v) {
      if (!e.is_string() || e.get<std::string>().empty()) bad_request("'dry_sequence_breakers' holds non-empty strings", "dry_sequence_breakers");
      breakers.push_back(e.get<std::string>());
    }
  }
  if (tok == nullptr || !s.dry()) return;
  for (const std::string& b : breakers) {
    for (int32_t t : tok->encode(b, false, false)) s.dry_breakers.push_back(t);
  }
}

}  // namespace

void read_llama_sampling(const json& body, const Tokenizer* tok, SamplerConfig& s) {
  const auto real = [&](const char* key, float fallback, double lo, double hi) {
    return static_cast<float>(number_field(body, key, fallback, lo, hi));
  };
  const auto whole = [&](const char* key, int fallback, int64_t lo, int64_t hi) {
    return static_cast<int>(int_field(body, key, fallback, lo, hi));
  };
  s.typical_p = real("typical_p", s.typical_p, 0.0, 1.0);
  s.mirostat = whole("mirostat", s.mirostat, 0, 2);
  s.mirostat_tau = real("mirostat_tau", s.mirostat_tau, 0.0, 100.0);
  s.mirostat_eta = real("mirostat_eta", s.mirostat_eta, 0.0, 10.0);
  s.dynatemp_range = real("dynatemp_range", s.dynatemp_range, 0.0, 100.0);
  s.dynatemp_exponent = real("dynatemp_exponent", s.dynatemp_exponent, 0.0, 100.0);
  s.top_n_sigma = real("top_n_sigma", s.top_n_sigma, -1.0, 1000.0);
  s.xtc_probability = real("xtc_probability", s.xtc_probability, 0.0, 1.0);
  s.xtc_threshold = real("xtc_threshold", s.xtc_threshold, 0.0, 1.0);
  s.dry_multiplier = real("dry_multiplier", s.dry_multiplier, 0.0, 100.0);
  s.dry_base = real("dry_base", s.dry_base, 1.0, 100.0);
  s.dry_allowed_length = whole("dry_allowed_length", s.dry_allowed_length, 1, 1 << 20);
  s.dry_penalty_last_n = whole("dry_penalty_last_n", s.dry_penalty_last_n, -1, 1 << 24);
  s.min_keep = whole("min_keep", s.min_keep, 0, 1 << 24);
  read_sampler_order(body, s);
  read_dry_breakers(body, tok, s);
}

// Accepted only at llama-server's default, what bmoe does: a 400 naming the field otherwise.
void only_llama_default(const json& body, const char* key, const json& neutral, const char* why) {
  if (body.contains(key) && !body[key].is_null() && body[key] != neutral) {
    bad_request(fmt::format("'{}' is not supported (only {}): {}", key, neutral.dump(), why), key);
  }
}

void check_llama_neutral_fields(const json& body) {
  int_field(body, "n_keep", 0, -1, 1 << 24);  // llama-server keeps these on a context shift; bmoe never shifts
  int_field(body, "n_discard", 0, 0, 1 << 24);
  int_field(body, "n_cache_reuse", 0, 0, 1 << 24);  // reuse by KV shifting; bmoe reuses the common prefix
  int_field(body, "t_max_prompt_ms", -1, -1, INT64_MAX / 2);  // llama-server reads it and does nothing yet
  only_llama_default(body, "verbose", false, "bmoe adds no debug fields");
  only_llama_default(body, "n_indent", 0, "bmoe does not indent");
  only_llama_default(body, "response_fields", json::array(), "the answer has all its fields");
  only_llama_default(body, "lora", json::array(), "bmoe loads no adapters");
  if (number_field(body, "adaptive_target", -1.0, -1e9, 1.0) >= 0) {
    bad_request("'adaptive_target' is not supported (only negative: off): bmoe has no adaptive-p sampler", "adaptive_target");
  }
  number_field(body, "adaptive_decay", 0.9, 0.0, 0.99);  // used only with adaptive_target
  if (body.contains("reasoning_budget_message") && !body["reasoning_budget_message"].is_string() &&
      !body["reasoning_budget_message"].is_null()) {
    bad_request("'reasoning_budget_message' must be a string", "reasoning_budget_message");
  }
  // reasoning_control arms llama-server's endpoint that ends reasoning at runtime (bmoe has none);
  // backend_sampling samples on a GPU backend where there is one (bmoe samples on the CPU).
  bool_field(body, "reasoning_control", false);
  bool_field(body, "backend_sampling", false);
}

}  // namespace bmoe
