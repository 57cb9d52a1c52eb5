// The tokenizer's vocabulary read from a GGUF file's tokenizer.ggml.* keys.
//
// Reading lives here, above both gguf and text: the tokenizer (text) knows no file format and
// the format (gguf) knows no tokenizer.
#pragma once

#include "gguf/gguf.h"
#include "text/tokenizer.h"

namespace bmoe {

// The tokens, their types, merges, special ids, BOS setting and chat template of `model`.
// Fails (bmoe::Error naming the file) when the token types do not match the tokens or a special
// id lies outside the vocabulary.
Vocabulary read_vocabulary(const GgufModel& model);

}  // namespace bmoe
