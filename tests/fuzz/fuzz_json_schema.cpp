// libFuzzer target: the JSON Schema converter (chat/json_schema.h). Any JSON input must convert
// or be refused with bmoe::Error; a converted grammar that Grammar::parse refuses is a bug in the
// converter (abort), as is any crash, hang or sanitizer report.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/grammar.h"
#include "chat/json_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto schema = nlohmann::ordered_json::parse(data, data + size, nullptr, false);
  if (schema.is_discarded()) return 0;
  std::string gbnf;
  try {
    gbnf = bmoe::json_schema_to_gbnf(schema);
  } catch (const bmoe::Error&) {
    return 0;
  }
  try {
    const auto grammar = bmoe::Grammar::parse(gbnf);
    // The grammar must also start: the initial parse stacks are built here.
    bmoe::GrammarMatcher matcher(grammar);
    (void)matcher.accepts("{\"a\": [1, \"x\"]}");
  } catch (const bmoe::Error& e) {
    std::fprintf(stderr, "converted grammar refused: %s\n%s\n", e.what(), gbnf.c_str());
    std::abort();
  }
  return 0;
}
