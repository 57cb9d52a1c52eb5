// bmoe-tokenize: tokenize or detokenize with a GGUF model's vocabulary (no weights loaded).
//   bmoe-tokenize -m MODEL -p TEXT            ids of one text (special tokens parsed)
//   bmoe-tokenize -m MODEL --json TEXTS.json  ids of every text in a JSON list
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/version.h"
#include "engine/gguf_vocabulary.h"
#include "gguf/gguf.h"
#include "text/tokenizer.h"

using namespace bmoe;

int main(int argc, char** argv) {
  CLI::App app{"bmoe-tokenize: tokenize text with a GGUF model's vocabulary"};
  app.set_version_flag("--version", bmoe::version_text());
  std::string model_path, prompt, json_file;
  bool no_special = false;
  app.add_option("-m,--model", model_path, "GGUF model")->required();
  app.add_option("-p,--prompt", prompt, "text to tokenize");
  app.add_option("--json", json_file, "JSON file with a list of texts");
  app.add_flag("--no-parse-special", no_special, "treat control-token text as plain text");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  try {
    const auto gguf = GgufModel::open(model_path);
    const Tokenizer tokenizer(read_vocabulary(*gguf));
    std::vector<std::string> texts;
    if (!json_file.empty()) {
      std::ifstream in(json_file);
      if (!in) fail("cannot read {}", json_file);
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(in);
      } catch (const std::exception& e) {
        fail("{}: not valid JSON ({})", json_file, e.what());
      }
      if (!j.is_array()) fail("{}: expected a JSON list of strings", json_file);
      for (const auto& t : j) texts.push_back(t.get<std::string>());
    } else {
      texts.push_back(prompt);
    }
    nlohmann::json out = nlohmann::json::array();
    for (const auto& t : texts) out.push_back(tokenizer.encode(t, !no_special, tokenizer.vocab().add_bos));
    fmt::print("{}\n", json_file.empty() ? out[0].dump() : out.dump());
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
