// llama-server's request fields beyond OpenAI's (and vLLM's repetition_penalty), read into the
// sampler's settings and the request. README ("Request fields") says what each does.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "text/sampler.h"
#include "text/tokenizer.h"

namespace bmoe {

// Their names, for the lists of known fields.
const std::set<std::string>& llama_server_fields();

// The samplers' fields (typical_p, mirostat*, dynatemp_*, top_n_sigma, xtc_*, dry_*, min_keep,
// samplers) into `s`; `tok` turns DRY's sequence breakers into tokens.
void read_llama_sampling(const nlohmann::ordered_json& body, const Tokenizer* tok, SamplerConfig& s);

// The fields accepted only where they change nothing bmoe does: n_keep, n_discard (bmoe never
// shifts the context), n_cache_reuse, t_max_prompt_ms, adaptive_decay, verbose false, n_indent
// 0, response_fields and lora empty, adaptive_target negative, reasoning_control and
// backend_sampling (booleans). post_sampling_probs is read with the log-probabilities.
void check_llama_neutral_fields(const nlohmann::ordered_json& body);

}  // namespace bmoe
