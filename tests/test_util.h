// Helpers shared by the C++ tests: temporary paths and cached synthetic models.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "synth/synth.h"
#include "test_temp.h"

namespace bmoe {

// A synthetic model written once per test process (preset with optional overrides).
inline std::string test_model_path(const std::string& preset, int layers = 0, const std::vector<std::string>& types = {},
                                   int shards = 1) {
  static std::map<std::string, std::string> cache;
  std::string key = preset + "/" + std::to_string(layers) + "/" + std::to_string(shards);
  for (const auto& t : types) key += "/" + t;
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  SynthSpec spec = synth_preset(preset);
  if (layers > 0) spec.n_layer = layers;
  for (const auto& t : types) apply_type_override(spec, t);
  spec.shards = shards;
  const std::string path = temp_path("model-" + std::to_string(cache.size()) + ".gguf");
  const auto written = write_synth_model(spec, path);
  cache[key] = written.front();
  return written.front();
}

inline std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

}  // namespace bmoe
