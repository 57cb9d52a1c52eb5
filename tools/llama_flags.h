// llama.cpp's command-line spellings, for users who bring their commands along. CLI11 reads a
// single-dash word as bundled short flags ("-fa" became "-f a": a file named "a" replaced the
// prompt), so before parsing each llama.cpp flag is translated to bmoe's (-cnv -> -i, -sys ->
// --system, -ctk/-ctv f16|f32 -> --kv-type), accepted as a no-op with a note where bmoe has
// nothing to switch (-fa, -ngl, --color, -no-cnv), or refused with what bmoe does instead.
// Any other single-dash word of several letters in option position is refused too.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

namespace bmoe {

struct TranslatedArgs {
  std::vector<std::string> args;   // without the program name, in order
  std::vector<std::string> notes;  // one line each, for stderr
  std::string error;               // non-empty: refuse the command line with this message
};

// `app` holds the tool's options (to tell option values from option names).
TranslatedArgs translate_llama_flags(const CLI::App& app, int argc, const char* const* argv);

// Translates, prints the notes, and parses with CLI11. Returns the exit status when the tool
// should stop now (2 after printing one `error:` line; 0 after --help or --version), else
// nullopt.
std::optional<int> parse_command_line(CLI::App& app, int argc, const char* const* argv);

}  // namespace bmoe
