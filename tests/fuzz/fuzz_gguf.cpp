// libFuzzer target: the GGUF reader and the model loader on arbitrary bytes. Every input must
// either load or fail with bmoe::Error (a one-line reason); anything else -- a crash, a
// sanitizer report, another exception, a hang -- is a bug.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "engine/loader.h"
#include "gguf/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/bmoe-fuzz-gguf-" + std::to_string(getpid()) + ".gguf";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    auto model = bmoe::GgufModel::open(path);
    for (const auto& t : model->tensors()) (void)t.elements();
    bmoe::LoadOptions options;
    options.verbose = false;
    (void)bmoe::load_model(path, options);
  } catch (const bmoe::Error&) {
    // rejected with a reason: fine
  }
  return 0;
}
