// llama.cpp's command-line spellings, for users who bring their commands along. CLI11 reads a
// single-dash word as bundled short flags ("-fa" became "-f a": a file named "a" replaced the
// prompt), so before parsing each llama.cpp flag is translated to bmoe's (-cnv -> -i, -sys ->
// --system, -ctk/-ctv f16|f32 -> --kv-type), accepted as a no-op with a note where bmoe has
// nothing to switch (-fa, -ngl, --color, -no-cnv), or refused with what bmoe does instead.
// Any other single-dash word of several letters in option position is refused too.
#pragma once

#include <CLI/CLI.hpp>

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

// Parses translated arguments with CLI11 (which wants them reversed).
void parse_translated(CLI::App& app, const TranslatedArgs& translated);

}  // namespace bmoe
