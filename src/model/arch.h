// How an architecture describes itself: it reads hyperparameters and binds tensors through
// ArchLoader, which the engine implements on top of a GGUF file. Architecture code names
// tensors and checks shapes; it never sees files, offsets or mappings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/arch_table.h"
#include "model/config.h"
#include "model/transformer.h"

namespace bmoe {

class ArchLoader {
 public:
  virtual ~ArchLoader() = default;
  // Metadata, looked up as "<arch>.<key>" when `key` starts with '.', else verbatim.
  virtual int64_t get_int(const std::string& key) = 0;
  virtual int64_t get_int_or(const std::string& key, int64_t fallback) = 0;
  virtual double get_float(const std::string& key) = 0;
  virtual double get_float_or(const std::string& key, double fallback) = 0;
  virtual std::string get_string_or(const std::string& key, const std::string& fallback) = 0;
  virtual std::vector<int64_t> get_per_layer_int(const std::string& key, int n_layer,
                                                 std::optional<int64_t> fallback) = 0;
  virtual std::vector<int64_t> get_int_array(const std::string& key) = 0;
  virtual std::vector<double> get_float_array(const std::string& key) = 0;
  virtual bool has_key(const std::string& key) = 0;
  virtual bool has_tensor(const std::string& name) = 0;
  // Size of dimension `dim` of a tensor (throws when the tensor is missing).
  virtual int64_t tensor_dim(const std::string& name, int dim) = 0;

  // A dense matrix [dims[1] rows x dims[0] cols]; throws naming it when missing or mis-shaped.
  virtual Weight matrix(const std::string& name, std::vector<int64_t> dims) = 0;
  // A vector (or any small tensor) converted to f32; throws like matrix().
  virtual Vector vector(const std::string& name, std::vector<int64_t> dims) = 0;
  // A stacked expert tensor [dims[0] cols, dims[1] rows, dims[2] experts]; returns the index of
  // this matrix among the layer's expert matrices (its "role").
  virtual int expert_matrix(int layer, const std::string& name, std::vector<int64_t> dims) = 0;
  // Whether to bind the MTP (nextn) blocks too (the run drafts with them); they are checked
  // either way.
  virtual bool wants_nextn() { return false; }
};

// A family: its hyperparameter reader, its tensor table and, where it needs one, a last step
// that wires bound weights together.
struct Architecture {
  const char* name;
  const char* description;
  // Fills config from the metadata (and, where a family's files differ, from which tensors
  // exist); throws bmoe::Error on missing or invalid keys.
  void (*read_hparams)(ArchLoader& loader, ModelConfig& config);
  std::span<const TensorSpec> tensors;
  void (*finish)(const ModelConfig& config, ModelWeights& weights) = nullptr;
  // The built-in chat format this family's models speak (a name of chat/chat.h's formats, e.g.
  // "harmony"), or nullptr where the model's template shows it. Chat code never compares family
  // names: the family says it here.
  const char* chat_format = nullptr;
};

// The family's table as text, a line per row: name, symbolic shape, role, layers.
std::string describe_tensors(const Architecture& arch);

// read_hparams, bind_tensors, finish: throws bmoe::Error on missing keys or tensors.
void load_architecture(const Architecture& arch, ArchLoader& loader, ModelConfig& config, ModelWeights& weights);

// Every architecture compiled in, and lookup by GGUF general.architecture.
const std::vector<Architecture>& architectures();
const Architecture* find_architecture(const std::string& name);

// More layers than any model has: per-layer keys are read into arrays of this many entries.
constexpr int kMaxLayers = 4096;

// Reads the keys most MoE families share (block count, sizes, heads, rope, experts). A per-layer
// kv head count of 0 is an error unless the family reads it as "no attention in this layer".
void load_common_hparams(ArchLoader& loader, ModelConfig& c, bool zero_kv_heads_allowed = false);
// n_vocab from the embedding rows; n_ff_exp from the expert tensors when the key is absent.
void read_vocab_and_expert_width(ArchLoader& loader, ModelConfig& c);

}  // namespace bmoe
