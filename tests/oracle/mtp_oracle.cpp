// llama.cpp's MTP draft path (the prebuilt library of node-llama-cpp) as the reference for
// bmoe's MTP head: the trunk runs a prompt of token ids, then an MTP context (ctx_type MTP)
// runs the prompt with the trunk's h_nextn rows shifted by one (zeros first), as common/
// speculative.cpp's draft-mtp does, then the first draft step (the trunk's greedy next token at
// position n, paired with the last trunk row) and one chained step (the head's own pick and
// hidden state). Prints {"next": id, "steps": [[logits], [logits]]}, one line per prompt.
//
//   mtp_oracle MODEL 1,2,3,...[;4,5,...] BACKEND_DIR [EXCLUDED_VARIANT,...] [f32]
// Several prompts (separated by ';') share one model load; each runs in fresh contexts.
// loads the best-scoring CPU backend of BACKEND_DIR (ggml's own score) but the excluded ones, as
// the conformance peer does (tests/conformance/common.py: PEER_EXCLUDED_CPU). With `f32`, the
// caches hold f32 and attention takes the classic path (bmoe's --kv-type f32), so that a model
// whose weights are all f32 rounds nowhere.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ggml-backend.h"

#include "llama.h"
#include "llama-ext.h"

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "mtp_oracle: %s\n", what);
  std::exit(1);
}

std::vector<llama_token> parse_ids(const char* text) {
  std::vector<llama_token> ids;
  for (const char* p = text; *p;) {
    char* end = nullptr;
    ids.push_back(static_cast<llama_token>(std::strtol(p, &end, 10)));
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p) die("bad id list");
  }
  return ids;
}

int argmax(const float* v, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i) if (v[i] > v[best]) best = i;
  return best;
}

// One MTP decode of rows (token, hidden, position); the logits of the last row.
void mtp_decode(llama_context* ctx, llama_batch& b, const std::vector<llama_token>& tokens,
                const std::vector<float>& hidden, int first_pos, int n_embd) {
  b.n_tokens = static_cast<int32_t>(tokens.size());
  for (int i = 0; i < b.n_tokens; ++i) {
    b.token[i] = tokens[static_cast<size_t>(i)];
    std::memcpy(b.embd + static_cast<size_t>(i) * n_embd, hidden.data() + static_cast<size_t>(i) * n_embd,
                sizeof(float) * static_cast<size_t>(n_embd));
    b.pos[i] = first_pos + i;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = 0;
    b.logits[i] = i + 1 == b.n_tokens;
  }
  if (llama_decode(ctx, b) != 0) die("MTP decode failed");
}

void load_cpu_backend(const std::string& dir, const std::string& excluded) {
  std::string best;
  int best_score = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("libggml-cpu-", 0) != 0) continue;
    const std::string variant = name.substr(12, name.find('.') - 12);
    if (("," + excluded + ",").find("," + variant + ",") != std::string::npos) continue;
    void* lib = dlopen(entry.path().c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) continue;
    using ScoreFn = int (*)();
    auto score = reinterpret_cast<ScoreFn>(dlsym(lib, "ggml_backend_score"));
    const int s = score ? score() : 0;
    if (s > best_score) {
      best_score = s;
      best = entry.path().string();
    }
    dlclose(lib);
  }
  if (best.empty() || !ggml_backend_load(best.c_str())) die("no CPU backend to load");
  std::fprintf(stderr, "mtp_oracle: CPU backend %s\n", best.c_str());
}

// The prompt through the trunk, then the MTP context over it and two draft steps (fresh
// contexts, so that each prompt starts as in its own process); prints the JSON line.
void run_prompt(llama_model* model, const llama_context_params& trunk_params, const std::vector<llama_token>& prompt) {
  const int n = static_cast<int>(prompt.size());
  llama_context_params cp = trunk_params;
  llama_context* trunk = llama_init_from_model(model, cp);
  cp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
  llama_context* head = llama_init_from_model(model, cp);
  if (!trunk || !head) die("cannot create the contexts");
  llama_set_embeddings_nextn(trunk, true, false);
  llama_set_embeddings_nextn(head, true, true);
  // The hidden rows' width: n_embd, or deepseek4's n_embd per hyper-connection stream (n_embd_out).
  const int n_embd = llama_model_n_embd_out(model);
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

  llama_batch tb = llama_batch_get_one(const_cast<llama_token*>(prompt.data()), n);
  if (llama_decode(trunk, tb) != 0) die("trunk decode failed");
  const llama_token next = argmax(llama_get_logits_ith(trunk, -1), n_vocab);
  std::vector<float> h(static_cast<size_t>(n) * n_embd);
  for (int i = 0; i < n; ++i) {
    std::memcpy(h.data() + static_cast<size_t>(i) * n_embd, llama_get_embeddings_nextn_ith(trunk, i), sizeof(float) * n_embd);
  }

  llama_batch b = llama_batch_init(512, n_embd, 1);
  b.token = static_cast<llama_token*>(std::malloc(sizeof(llama_token) * 512));
  // The prompt: row i pairs h[i - 1] (zeros for row 0) with prompt[i].
  std::vector<float> shifted(static_cast<size_t>(n) * n_embd, 0.0f);
  std::memcpy(shifted.data() + n_embd, h.data(), sizeof(float) * static_cast<size_t>(n - 1) * n_embd);
  mtp_decode(head, b, prompt, shifted, 0, n_embd);
  std::vector<std::vector<float>> steps;
  std::vector<float> last(h.end() - n_embd, h.end());
  llama_token token = next;
  for (int k = 0; k < 2; ++k) {
    mtp_decode(head, b, {token}, last, n + k, n_embd);
    const float* logits = llama_get_logits_ith(head, -1);
    steps.emplace_back(logits, logits + n_vocab);
    token = argmax(logits, n_vocab);
    const float* hn = llama_get_embeddings_nextn_ith(head, -1);
    last.assign(hn, hn + n_embd);
  }
  std::printf("{\"next\": %d, \"steps\": [", next);
  for (size_t k = 0; k < steps.size(); ++k) {
    std::printf("%s[", k ? ", " : "");
    for (int i = 0; i < n_vocab; ++i) std::printf("%s%.9g", i ? "," : "", steps[k][static_cast<size_t>(i)]);
    std::printf("]");
  }
  std::printf("]}\n");
  std::free(b.token);
  b.token = nullptr;
  llama_batch_free(b);
  llama_free(head);
  llama_free(trunk);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) die("usage: mtp_oracle MODEL IDS[;IDS...] BACKEND_DIR [EXCLUDED] [f32]");
  const bool f32_cache = argc > 5 && std::strcmp(argv[5], "f32") == 0;
  load_cpu_backend(argv[3], argc > 4 ? argv[4] : "");
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.load_mtp = true;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) die("cannot load the model");
  if (llama_model_n_layer_nextn(model) < 1) die("the model has no MTP layer");
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 512;
  cp.n_batch = 512;
  cp.n_ubatch = 512;
  cp.n_threads = cp.n_threads_batch = 2;
  if (f32_cache) {
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  }
  std::string prompts = argv[2];
  for (size_t start = 0; start <= prompts.size();) {
    size_t end = prompts.find(';', start);
    if (end == std::string::npos) end = prompts.size();
    run_prompt(model, cp, parse_ids(prompts.substr(start, end - start).c_str()));
    start = end + 1;
  }
  llama_model_free(model);
  return 0;
}
