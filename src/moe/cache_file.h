// The expert cache's hot set, saved at exit and read back at the next start (--cache-file), so
// a second session begins with the experts the first one kept instead of a cold cache.
//
// The file lists expert keys only, never weights: the experts are read again from the model
// file at start, so a stale or foreign list can cost time but never change what is computed.
// It carries a fingerprint of the model's expert layout (layer count, experts per layer and
// every expert tensor's offset, stride, size and type); a list saved for another layout is
// ignored with a warning.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "moe/cache_policy.h"
#include "expert_source/expert_source.h"

namespace bmoe {

uint64_t expert_layout_fingerprint(const ExpertLayout& layout);

// read_cache_file's reason for a file that exists but is not an expert-cache file at all.
inline constexpr const char* kNotACacheFile = "not a bmoe expert-cache file";

// Writes `keys` for `layout`, replacing `path` atomically.
void write_cache_file(const std::string& path, const ExpertLayout& layout, std::span<const ExpertKey> keys);

// Reads a saved hot set. Returns false with `why` set when the file is missing, unreadable,
// malformed or saved for another layout; keys naming experts the layout lacks are an error too.
bool read_cache_file(const std::string& path, const ExpertLayout& layout, std::vector<ExpertKey>& keys,
                     std::string& why);

}  // namespace bmoe
