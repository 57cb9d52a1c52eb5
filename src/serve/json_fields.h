// Reading the fields of a JSON request body, each failure a RequestError (400) naming the
// field: shared by the parsers of every API bmoe-server speaks.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "serve/request.h"
#include "text/utf8.h"

namespace bmoe::json_fields {

// Bodies keep their keys' order: a chat template's tojson shows the client's tools and
// messages as sent.
using json = nlohmann::ordered_json;

inline constexpr int kMaxJsonDepth = 128;

[[noreturn]] inline void bad_request(const std::string& message, const std::string& param = {}) {
  throw RequestError(400, "invalid_request_error", message, param);
}

inline json parse_body(const std::string& text) {
  // Checked up front: JSON text is UTF-8, and invalid bytes inside a string would otherwise
  // surface later as a library error.
  if (!utf8_valid(text)) bad_request("the request body is not valid UTF-8");
  // Nesting is bounded: the parser, copies and the template's values all recurse per level.
  const auto bounded = [](int depth, json::parse_event_t, json&) {
    if (depth > kMaxJsonDepth) bad_request(fmt::format("the request body nests deeper than {} levels", kMaxJsonDepth));
    return true;
  };
  try {
    json j = json::parse(text, bounded);
    if (!j.is_object()) bad_request("the request body must be a JSON object");
    return j;
  } catch (const json::exception& e) {  // syntax errors, and numbers that overflow (out_of_range)
    bad_request(fmt::format("the request body is not valid JSON: {}", e.what()));
  }
}

inline void reject_unknown_fields(const json& body, const std::set<std::string>& known) {
  for (const auto& [key, value] : body.items()) {
    if (!known.count(key)) bad_request(fmt::format("unrecognized request argument: '{}'", key), key);
  }
}

inline double number_field(const json& body, const char* key, double fallback, double lo, double hi) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  if (!body[key].is_number()) bad_request(fmt::format("'{}' must be a number", key), key);
  const double v = body[key].get<double>();
  if (!(v >= lo && v <= hi)) bad_request(fmt::format("'{}' must be between {} and {}, got {}", key, lo, hi, v), key);
  return v;
}

inline int64_t int_field(const json& body, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  if (!body[key].is_number_integer()) bad_request(fmt::format("'{}' must be an integer", key), key);
  if (body[key].is_number_unsigned() && body[key].get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    // Above int64's range (2^63 and up): read as int64 it would be reported negative.
    bad_request(fmt::format("'{}' must be between {} and {}, got {}", key, lo, hi, body[key].get<uint64_t>()), key);
  }
  const int64_t v = body[key].get<int64_t>();
  if (v < lo || v > hi) bad_request(fmt::format("'{}' must be between {} and {}, got {}", key, lo, hi, v), key);
  return v;
}

inline bool bool_field(const json& body, const char* key, bool fallback) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  if (!body[key].is_boolean()) bad_request(fmt::format("'{}' must be true or false", key), key);
  return body[key].get<bool>();
}

// An object's string member, or "" when it is absent or not a string (json::value would throw).
inline std::string string_member(const json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace bmoe::json_fields
