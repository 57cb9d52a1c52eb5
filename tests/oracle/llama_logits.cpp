// A minimal llama.cpp driver for deepseek4 (and any family): evaluates a prompt of token ids,
// writes the logits of every prompt position (f32, n_prompt x n_vocab) and prints the greedy
// continuation's ids. scripts/build-llama-oracle.sh links it against node-llama-cpp's prebuilt
// libraries (`prebuilt`, seconds) or against a llama.cpp source build (minutes).
//   llama_logits MODEL IDS(comma-separated) N_GEN f16|f32 BATCH(0: whole prompt) LOGITS_OUT
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "llama.h"

// LLAMA_DUMP=NAME prints the first values of every row of the graph tensors named NAME (debug).
static bool dump_tensor(struct ggml_tensor* t, bool ask, void*) {
  const char* want = std::getenv("LLAMA_DUMP");
  if (!want || std::strcmp(t->name, want) != 0) return false;
  if (ask) return true;
  if (t->type != GGML_TYPE_F32) return true;
  std::vector<float> v(ggml_nelements(t));
  ggml_backend_tensor_get(t, v.data(), 0, v.size() * 4);
  const int64_t rows = ggml_nelements(t) / t->ne[0];
  for (int64_t r = 0; r < rows && r < 64; ++r) {
    std::fprintf(stderr, "%s row %ld:", t->name, (long)r);
    for (int i = 0; i < 8 && i < t->ne[0]; ++i) std::fprintf(stderr, " %.6f", v[r * t->ne[0] + i]);
    std::fprintf(stderr, "\n");
  }
  return true;
}

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: llama_logits MODEL IDS N_GEN f16|f32 BATCH LOGITS_OUT\n");
    return 2;
  }
  std::vector<llama_token> ids;
  for (char* t = std::strtok(argv[2], ","); t; t = std::strtok(nullptr, ",")) ids.push_back(std::atoi(t));
  const int n_gen = std::atoi(argv[3]);
  const bool f32 = std::strcmp(argv[4], "f32") == 0;
  const int batch = std::atoi(argv[5]);
  llama_backend_init();
  // The prebuilt (node-llama-cpp) libraries load their CPU backend at run time: this folder holds
  // the one CPU level to use (deepseek4_logits.py picks an AVX2 one, as the conformance tests do).
  if (const char* dir = std::getenv("LLAMA_BACKEND_DIR")) ggml_backend_load_all_from_path(dir);
  llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return 1;
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 2048;
  cp.n_batch = 2048;
  cp.n_ubatch = 512;
  cp.n_threads = cp.n_threads_batch = 2;
  cp.type_k = cp.type_v = f32 ? GGML_TYPE_F32 : GGML_TYPE_F16;
  cp.flash_attn_type = f32 ? LLAMA_FLASH_ATTN_TYPE_DISABLED : LLAMA_FLASH_ATTN_TYPE_AUTO;
  if (std::getenv("LLAMA_DUMP")) {
    cp.cb_eval = dump_tensor;
    cp.cb_eval_user_data = nullptr;
  }
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return 1;
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  FILE* out = std::fopen(argv[6], "wb");
  const int step = batch > 0 ? batch : static_cast<int>(ids.size());
  for (size_t at = 0; at < ids.size(); at += step) {
    const int n = std::min<int>(step, static_cast<int>(ids.size() - at));
    llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; ++i) {
      b.token[i] = ids[at + i];
      b.pos[i] = static_cast<llama_pos>(at + i);
      b.n_seq_id[i] = 1;
      b.seq_id[i][0] = 0;
      b.logits[i] = 1;
    }
    b.n_tokens = n;
    if (llama_decode(ctx, b) != 0) return 1;
    for (int i = 0; i < n; ++i) std::fwrite(llama_get_logits_ith(ctx, i), 4, n_vocab, out);
    llama_batch_free(b);
  }
  std::fclose(out);
  llama_pos pos = static_cast<llama_pos>(ids.size());
  const float* last = llama_get_logits_ith(ctx, -1);
  std::printf("[");
  for (int g = 0; g < n_gen; ++g) {
    int best = 0;
    for (int v = 1; v < n_vocab; ++v) if (last[v] > last[best]) best = v;
    std::printf(g ? ",%d" : "%d", best);
    llama_token t = best;
    llama_batch b = llama_batch_get_one(&t, 1);
    (void)pos;
    if (llama_decode(ctx, b) != 0) return 1;
    ++pos;
    last = llama_get_logits_ith(ctx, -1);
  }
  std::printf("]\n");
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
