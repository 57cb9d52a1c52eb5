// GGML tensor element types: the ids GGUF files use, and each type's block geometry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace bmoe {

enum class TensorType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

struct TypeInfo {
  std::string_view name;
  uint32_t block_size;   // elements per block
  uint32_t block_bytes;  // bytes per block
  bool computable;       // bmoe has dequantize + dot kernels for it
};

// Geometry of a type id read from a file; nullopt for ids GGUF does not define.
std::optional<TypeInfo> type_info(uint32_t id);
const TypeInfo& type_info(TensorType type);

inline std::string_view type_name(TensorType t) { return type_info(t).name; }

// Parses "q4_k", "Q4_K", "f16", ... Returns nullopt if unknown.
std::optional<TensorType> parse_type_name(std::string_view name);

// Bytes of a row of n elements (n must be a multiple of the block size).
inline size_t row_bytes(TensorType t, int64_t n) {
  const TypeInfo& info = type_info(t);
  return static_cast<size_t>(n / info.block_size) * info.block_bytes;
}

}  // namespace bmoe
