// bmoe-template: render a chat template (Jinja) the way bmoe-cli and bmoe-server do.
//   bmoe-template -t FILE --json CONTEXTS.json   one rendering per context in a JSON list
//   bmoe-template -m MODEL --json CONTEXTS.json  the template the GGUF carries
// Each context is the template's variables (messages, add_generation_prompt, bos_token, tools,
// ...). Prints a JSON list: the rendered text, or {"error": "..."} where rendering failed.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "chat/jinja.h"
#include "core/error.h"
#include "core/version.h"
#include "gguf/gguf.h"
#include "io/mapped_file.h"

using namespace bmoe;

int main(int argc, char** argv) {
  CLI::App app{"bmoe-template: render a chat template with bmoe's Jinja engine"};
  app.set_version_flag("--version", bmoe::version_text());
  std::string template_file, model_path, json_file;
  app.add_option("-t,--template", template_file, "Jinja template file");
  app.add_option("-m,--model", model_path, "GGUF model whose tokenizer.chat_template to render");
  app.add_option("--json", json_file, "JSON file with a list of contexts")->required();
  try {
    app.parse(argc, argv);
    if (template_file.empty() == model_path.empty()) throw CLI::ValidationError("give one of -t FILE or -m MODEL");
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  try {
    std::string source;
    if (!template_file.empty()) {
      source = read_whole_file(template_file, "template");
    } else {
      source = GgufModel::open(model_path)->get_string_or("tokenizer.chat_template", "");
      if (source.empty()) fail("{} carries no tokenizer.chat_template", model_path);
    }
    const jinja::Template tmpl(source);
    nlohmann::ordered_json contexts;
    try {
      contexts = nlohmann::ordered_json::parse(read_whole_file(json_file, "contexts file"));
    } catch (const nlohmann::ordered_json::exception& e) {
      fail("{}: not valid JSON ({})", json_file, e.what());
    }
    if (!contexts.is_array()) fail("{}: expected a JSON list of contexts", json_file);
    nlohmann::json out = nlohmann::json::array();
    for (const auto& ctx : contexts) {
      try {
        out.push_back(tmpl.render(jinja::Value::from_json(ctx)));
      } catch (const jinja::JinjaError& e) {
        out.push_back({{"error", e.what()}});
      }
    }
    fmt::print("{}\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
