// Loads a GGUF model into a runnable Transformer: picks the architecture, binds dense weights
// (mapped, or read into anonymous memory when streaming) and builds the expert source.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/mapped_file.h"
#include "gguf/gguf.h"
#include "model/transformer.h"
#include "io/direct_io.h"
#include "expert_source/expert_source.h"
#include "moe/streaming_experts.h"
#include "text/tokenizer.h"

namespace bmoe {

enum class DenseWeights { Anon, Mmap };

struct LoadOptions {
  bool stream_experts = false;        // --moe-stream
  DenseWeights dense = DenseWeights::Anon;
  bool odirect = true;
  int n_expert_used = 0;              // override top-k (0: the model's)
  bool nextn = false;                 // bind the MTP (nextn) blocks too (--mtp drafts with them)
  bool verbose = true;                // progress on stderr
};

// Owns everything a loaded model needs; dense weights and experts point into its storage.
struct LoadedModel {
  std::unique_ptr<GgufModel> gguf;
  std::vector<MappedFile> maps;          // whole-file maps (resident mode)
  std::vector<MappedFile> range_maps;    // per-tensor maps (stream + dense mmap)
  std::vector<AlignedBuffer> anon_blocks;  // anonymous dense storage (stream + dense anon)
  uint64_t anon_bytes = 0;
  double dense_load_seconds = 0;
  uint64_t dense_bytes = 0;
  ExpertLayout expert_layout;
  std::unique_ptr<ExpertSource> experts;
  std::unique_ptr<Transformer> transformer;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string arch;

  ~LoadedModel();
  bool streaming() const { return maps.empty(); }
  // The streaming store attach_streaming made (it owns nothing: `experts` does), or nullptr
  // when experts are resident. A typed handle, so no caller needs to ask `experts` its class.
  StreamingExperts* streamer() { return streamer_; }

 private:
  friend void attach_streaming(LoadedModel& model, const StreamingOptions& options);
  StreamingExperts* streamer_ = nullptr;
};

std::unique_ptr<LoadedModel> load_model(const std::string& path, const LoadOptions& options);

// What a model asks of memory, from its header alone (no weight is read): its hyperparameters
// (the KV cache's size follows from them) and the bytes of its files, all shards. Throws the
// errors load_model would on a file that is not a model bmoe runs.
struct ModelPreview {
  ModelConfig config;
  uint64_t file_bytes = 0;
};
ModelPreview preview_model(const std::string& path);

// Staging room for read-ahead experts (--prefetch / --route-ahead `window`): (window + 1) x
// `per_layer` of the largest expert (per_layer: what may be read ahead for one layer, e.g. the
// routers' top-k guess), one window in flight while the layer being computed still holds the
// previous prediction's reads. 0 when window is 0.
uint64_t prefetch_staging_bytes(const ExpertLayout& layout, int per_layer, int window);
// Staging room for the early reads of the hash-routed layers (their experts, known from the
// token ids, are read at the start of each pass): per such layer, the experts one step of `rows`
// tokens routes (top-k x rows, at most the layer's experts) of the largest expert; a prompt
// chunk's experts beyond that are read when their layer runs. 0 for a model without them.
uint64_t early_read_staging_bytes(const ExpertLayout& layout, const ModelConfig& cfg, int rows);
// Room for `experts` expert buffers of the largest expert (the buffers a wide step's visit
// keeps beyond the cache, see visit_experts in engine/run.h).
uint64_t expert_buffer_bytes(const ExpertLayout& layout, int experts);

// Streaming: creates the expert store (after loading, once the cache budget is decided).
void attach_streaming(LoadedModel& model, const StreamingOptions& options);

}  // namespace bmoe
