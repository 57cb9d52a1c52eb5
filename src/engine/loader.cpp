#include "engine/loader.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/progress.h"
#include "core/timer.h"
#include "engine/gguf_vocabulary.h"
#include "model/arch.h"
#include "moe/resident_experts.h"
#include "quant/quant.h"
#include "telemetry/system.h"

namespace bmoe {

LoadedModel::~LoadedModel() {
  transformer.reset();
  experts.reset();
}

namespace {

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// Trailing 1s are not stored in GGUF shapes; compare with them stripped.
bool same_shape(std::vector<int64_t> a, std::vector<int64_t> b) {
  while (a.size() > 1 && a.back() == 1) a.pop_back();
  while (b.size() > 1 && b.back() == 1) b.pop_back();
  return a == b;
}

class GgufArchLoader : public ArchLoader {
 public:
  GgufArchLoader(LoadedModel& model, const LoadOptions& options, const std::string& arch)
      : m_(model), gguf_(*model.gguf), options_(options), arch_(arch) {}

  std::string key(const std::string& k) const { return k.starts_with('.') ? arch_ + k : k; }

  int64_t get_int(const std::string& k) override { return gguf_.get_int(key(k)); }
  int64_t get_int_or(const std::string& k, int64_t fallback) override { return gguf_.get_int_or(key(k), fallback); }
  double get_float(const std::string& k) override { return gguf_.get_float(key(k)); }
  double get_float_or(const std::string& k, double fallback) override { return gguf_.get_float_or(key(k), fallback); }
  std::string get_string_or(const std::string& k, const std::string& fallback) override {
    return gguf_.get_string_or(key(k), fallback);
  }
  std::vector<int64_t> get_per_layer_int(const std::string& k, int n_layer, std::optional<int64_t> fallback) override {
    return gguf_.get_per_layer_int(key(k), n_layer, fallback);
  }
  std::vector<int64_t> get_int_array(const std::string& k) override { return gguf_.get_int_array(key(k)); }
  std::vector<double> get_float_array(const std::string& k) override { return gguf_.get_float_array(key(k)); }
  bool has_key(const std::string& k) override { return gguf_.find(key(k)) != nullptr; }
  bool has_tensor(const std::string& name) override { return gguf_.find_tensor(name) != nullptr; }
  int64_t tensor_dim(const std::string& name, int dim) override {
    const TensorInfo& t = gguf_.tensor(name);
    return dim < static_cast<int>(t.dims.size()) ? t.dims[static_cast<size_t>(dim)] : 1;
  }

  Weight matrix(const std::string& name, std::vector<int64_t> dims) override {
    const TensorInfo& t = checked(name, dims);
    if (!kernels_for_isa(t.type, Isa::Scalar)) {
      fail("{}: tensor '{}' has type {}, which bmoe cannot compute with", gguf_.primary().path, name, type_name(t.type));
    }
    Weight w;
    w.type = t.type;
    w.cols = t.dims[0];
    w.rows = t.rows();
    w.row_stride = row_bytes(t.type, w.cols);
    w.data = dense_data(t);
    return w;
  }

  Vector vector(const std::string& name, std::vector<int64_t> dims) override {
    const TensorInfo& t = checked(name, dims);
    Vector v(static_cast<size_t>(t.elements()));
    if (t.type == TensorType::I32) {  // an index table (deepseek4's hash routing): exact as floats below 2^24
      const uint8_t* src = dense_data(t);
      for (size_t i = 0; i < v.size(); ++i) {
        int32_t x;
        std::memcpy(&x, src + i * 4, 4);
        v[i] = static_cast<float>(x);
      }
      return v;
    }
    if (!kernels_for_isa(t.type, Isa::Scalar)) fail("{}: tensor '{}' has unsupported type {}", gguf_.primary().path, name, type_name(t.type));
    const uint8_t* src = dense_data(t);
    dequantize_row(t.type, src, v.data(), t.elements());
    return v;
  }

  bool wants_nextn() override { return options_.nextn; }

  int expert_matrix(int layer, const std::string& name, std::vector<int64_t> dims) override {
    const TensorInfo& t = checked(name, dims);
    if (!kernels_for_isa(t.type, Isa::Scalar)) fail("{}: tensor '{}' has unsupported type {}", gguf_.primary().path, name, type_name(t.type));
    auto& layers = m_.expert_layout.layers;
    if (layers.size() <= static_cast<size_t>(layer)) layers.resize(static_cast<size_t>(layer) + 1);
    ExpertLayerLayout& l = layers[static_cast<size_t>(layer)];
    const int64_t n_expert = t.dims.size() > 2 ? t.dims[2] : 1;
    if (l.n_expert != 0 && l.n_expert != n_expert) fail("{}: '{}' has {} experts, other tensors of layer {} have {}", gguf_.primary().path, name, n_expert, layer, l.n_expert);
    l.n_expert = static_cast<int>(n_expert);
    ExpertMatrixLayout mat;
    mat.file = t.shard;
    mat.offset = t.file_offset;
    mat.expert_stride = t.nbytes / static_cast<uint64_t>(n_expert);
    mat.bytes = mat.expert_stride;
    mat.type = t.type;
    mat.cols = t.dims[0];
    mat.rows = t.dims[1];
    l.matrices.push_back(mat);
    return static_cast<int>(l.matrices.size()) - 1;
  }

 private:
  const TensorInfo& checked(const std::string& name, const std::vector<int64_t>& dims) {
    const TensorInfo* t = gguf_.find_tensor(name);
    if (t == nullptr) fail("{}: missing tensor '{}' (required by {})", gguf_.primary().path, name, arch_);
    if (!same_shape(t->dims, dims)) {
      fail("{}: tensor '{}' has shape {}, expected {}", gguf_.primary().path, name, dims_text(t->dims), dims_text(dims));
    }
    return *t;
  }

  // Where a dense tensor lives: the whole-file map (resident mode), its own map, or a copy in
  // anonymous memory read through O_DIRECT (so the kernel cannot evict it under pressure).
  const uint8_t* dense_data(const TensorInfo& t) {
    m_.dense_bytes += t.nbytes;
    if (!m_.maps.empty()) return m_.maps[static_cast<size_t>(t.shard)].data() + t.file_offset;
    const std::string& path = gguf_.shards()[static_cast<size_t>(t.shard)].path;
    if (options_.dense == DenseWeights::Mmap) {
      m_.range_maps.emplace_back(path, t.file_offset, t.nbytes);
      return m_.range_maps.back().data();
    }
    auto& file = dense_files_[static_cast<size_t>(t.shard)];
    if (!file) file = std::make_unique<DirectFile>(path, options_.odirect);
    m_.anon_blocks.push_back(allocate_aligned(t.nbytes));
    m_.anon_bytes += t.nbytes;
    file->read_span(t.file_offset, t.nbytes, m_.anon_blocks.back().get());
    return m_.anon_blocks.back().get();
  }

  LoadedModel& m_;
  const GgufModel& gguf_;
  const LoadOptions& options_;
  std::string arch_;
  std::vector<std::unique_ptr<DirectFile>> dense_files_{gguf_.shards().size()};
};

}  // namespace

// A resident model that fits in the memory available (cgroup limit included) is read in and
// mapped while it loads: otherwise the first prompt takes a page fault per few pages of weights
// (18 % of a 128-token prompt on the 12-layer Qwen3-30B cut). One that does not fit is left to
// fault in on demand, as an mmap run larger than RAM must.
static void populate_if_it_fits(const std::vector<MappedFile>& maps) {
  uint64_t bytes = 0;
  for (const MappedFile& m : maps) bytes += m.size();
  const std::optional<uint64_t> available = read_memory().available();
  if (!available || bytes > *available / 10 * 8) return;
  for (const MappedFile& m : maps) m.populate();
}

static const Architecture* architecture_of(const std::string& path, const std::string& name) {
  const Architecture* arch = find_architecture(name);
  if (arch == nullptr) {
    std::string known;
    for (const Architecture& a : architectures()) known += (known.empty() ? "" : ", ") + std::string(a.name);
    fail("{}: unsupported architecture '{}' (supported: {})", path, name, known);
  }
  return arch;
}

ModelPreview preview_model(const std::string& path) {
  LoadedModel model;  // holds only the header: read_hparams asks for keys and tensor shapes
  model.gguf = GgufModel::open(path);
  model.arch = model.gguf->get_string("general.architecture");
  const Architecture* arch = architecture_of(path, model.arch);
  ModelPreview preview;
  GgufArchLoader loader(model, LoadOptions{}, model.arch);
  arch->read_hparams(loader, preview.config);
  for (const GgufShard& s : model.gguf->shards()) preview.file_bytes += s.file_size;
  return preview;
}

std::unique_ptr<LoadedModel> load_model(const std::string& path, const LoadOptions& options) {
  auto model = std::make_unique<LoadedModel>();
  model->gguf = GgufModel::open(path);
  const GgufModel& gguf = *model->gguf;
  model->arch = gguf.get_string("general.architecture");
  const Architecture* arch = architecture_of(path, model->arch);
  for (const GgufShard& s : gguf.shards()) model->expert_layout.files.push_back(s.path);

  if (!options.stream_experts) {
    for (const GgufShard& s : gguf.shards()) model->maps.emplace_back(s.path);
    populate_if_it_fits(model->maps);
  }

  ModelConfig config;
  ModelWeights weights;
  GgufArchLoader loader(*model, options, model->arch);
  Stopwatch dense_timer;
  load_architecture(*arch, loader, config, weights);
  model->dense_load_seconds = dense_timer.seconds();
  config.arch = model->arch;
  config.name = gguf.get_string_or("general.name", "");
  if (options.n_expert_used > 0) {
    if (options.n_expert_used > config.n_expert) {
      fail("--n-expert-used {} exceeds the model's {} experts", options.n_expert_used, config.n_expert);
    }
    config.n_expert_used = options.n_expert_used;
  }

  model->tokenizer = std::make_unique<Tokenizer>(read_vocabulary(gguf));
  if (model->tokenizer->vocab_size() < config.n_vocab) {
    fail("{}: vocabulary has {} tokens but the embeddings have {} rows", path, model->tokenizer->vocab_size(), config.n_vocab);
  }

  if (!options.stream_experts) {
    std::vector<const MappedFile*> maps;
    for (const MappedFile& m : model->maps) maps.push_back(&m);
    model->experts = std::make_unique<ResidentExperts>(model->expert_layout, maps);
  }
  model->transformer = std::make_unique<Transformer>(std::move(config), std::move(weights), model->experts.get());
  return model;
}

namespace {

// The most a staged expert takes: each matrix window is rounded out to the direct-I/O
// alignment on both ends.
uint64_t largest_staged_expert(const ExpertLayout& layout) {
  uint64_t largest = 0;
  for (const ExpertLayerLayout& l : layout.layers) {
    largest = std::max<uint64_t>(largest, l.expert_bytes() + l.matrices.size() * 2 * kDirectAlignment);
  }
  return largest;
}

}  // namespace

uint64_t prefetch_staging_bytes(const ExpertLayout& layout, int per_layer, int window) {
  if (window <= 0) return 0;
  return static_cast<uint64_t>(window + 1) * static_cast<uint64_t>(per_layer) * largest_staged_expert(layout);
}

uint64_t early_read_staging_bytes(const ExpertLayout& layout, const ModelConfig& cfg, int rows) {
  const int hashed = std::min(cfg.moe.n_hash_layers, cfg.n_layer);
  if (hashed <= 0) return 0;
  const int per_layer = std::min(cfg.n_expert, cfg.n_expert_used * std::max(1, rows));
  return static_cast<uint64_t>(hashed) * static_cast<uint64_t>(per_layer) * largest_staged_expert(layout);
}

uint64_t expert_buffer_bytes(const ExpertLayout& layout, int experts) {
  return static_cast<uint64_t>(std::max(0, experts)) * largest_staged_expert(layout);
}

void attach_streaming(LoadedModel& model, const StreamingOptions& options) {
  // An MTP head's block is one more streamed layer (n_layer) of the same layout: its experts go
  // through the same cache as the trunk's, one lookup per expert per head pass.
  auto store = std::make_unique<StreamingExperts>(model.expert_layout, options);
  model.streamer_ = store.get();
  model.experts = std::move(store);
  model.transformer->set_experts(model.experts.get());
}

}  // namespace bmoe
