#include "moe/cache_file.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace bmoe {
namespace {

constexpr const char* kMagic = "bmoe-expert-cache 1";

// FNV-1a over 64-bit words.
struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void add(uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xFF;
      h *= 1099511628211ull;
    }
  }
};

bool key_in_layout(ExpertKey k, const ExpertLayout& layout) {
  const int layer = key_layer(k), expert = key_expert(k);
  if (layer < 0 || static_cast<size_t>(layer) >= layout.layers.size()) return false;
  const ExpertLayerLayout& l = layout.layers[static_cast<size_t>(layer)];
  return !l.matrices.empty() && expert < l.n_expert;
}

}  // namespace

uint64_t expert_layout_fingerprint(const ExpertLayout& layout) {
  Fnv f;
  f.add(layout.layers.size());
  for (const ExpertLayerLayout& l : layout.layers) {
    f.add(static_cast<uint64_t>(l.n_expert));
    f.add(l.matrices.size());
    for (const ExpertMatrixLayout& m : l.matrices) {
      f.add(static_cast<uint64_t>(m.file));
      f.add(m.offset);
      f.add(m.expert_stride);
      f.add(m.bytes);
      f.add(static_cast<uint64_t>(m.type));
    }
  }
  return f.h;
}

void write_cache_file(const std::string& path, const ExpertLayout& layout, std::span<const ExpertKey> keys) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) fail("--cache-file: cannot write {}", tmp);
    out << kMagic << "\n" << "layout " << std::hex << expert_layout_fingerprint(layout) << std::dec << "\n";
    for (ExpertKey k : keys) out << key_layer(k) << ' ' << key_expert(k) << "\n";
    if (!out.flush()) fail("--cache-file: cannot write {}", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("--cache-file: cannot replace {}", path);
}

bool read_cache_file(const std::string& path, const ExpertLayout& layout, std::vector<ExpertKey>& keys,
                     std::string& why) {
  keys.clear();
  std::ifstream in(path);
  if (!in) {
    why = "no saved cache yet";
    return false;
  }
  std::string line;
  if (!std::getline(in, line) || line != kMagic) {
    why = kNotACacheFile;
    return false;
  }
  std::string word;
  uint64_t fingerprint = 0;
  if (!std::getline(in, line) || !(std::istringstream(line) >> word >> std::hex >> fingerprint) || word != "layout") {
    why = "malformed header";
    return false;
  }
  if (fingerprint != expert_layout_fingerprint(layout)) {
    why = "saved for a model with another expert layout";
    return false;
  }
  int lineno = 2;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    std::istringstream fields(line);
    int layer = -1, expert = -1;
    std::string rest;
    if (!(fields >> layer >> expert) || (fields >> rest) || layer < 0 || expert < 0 || layer > 0xFFFF ||
        expert > 0xFFFF || !key_in_layout(make_expert_key(layer, expert), layout)) {
      why = "line " + std::to_string(lineno) + " does not name an expert of this model";
      keys.clear();
      return false;
    }
    keys.push_back(make_expert_key(layer, expert));
  }
  return true;
}

}  // namespace bmoe
