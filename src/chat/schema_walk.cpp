// The one JSON Schema walk (see schema_walk.h): what a node asks for, in one order for every
// syntax; the syntax writes it.
#include "chat/schema_walk.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

namespace bmoe {

namespace {

constexpr int kMaxDepth = 64;            // nested schemas (and $ref hops while merging allOf)
constexpr size_t kMaxBranches = 256;     // anyOf / oneOf branches
constexpr int64_t kMergeBudget = 10000;  // schemas visited while merging allOf

using json = SchemaWalk::json;

bool has_type(const json& v, const std::vector<std::string>& types) {
  for (const auto& t : types) {
    if ((t == "null" && v.is_null()) || (t == "boolean" && v.is_boolean()) || (t == "string" && v.is_string()) ||
        (t == "array" && v.is_array()) || (t == "object" && v.is_object()) || (t == "number" && v.is_number()) ||
        (t == "integer" && (v.is_number_integer() || (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()))))) {
      return true;
    }
  }
  return false;
}

std::string dump(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

bool SchemaWalk::is_unsupported_keyword(const std::string& k) {
  static const std::set<std::string> unsupported = {
      "patternProperties", "minProperties", "maxProperties", "dependencies",
      "dependentRequired", "dependentSchemas", "if", "then", "else", "not", "contains", "minContains", "maxContains",
      "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef", "$dynamicAnchor",
      "$recursiveAnchor"};
  return unsupported.count(k) > 0;
}

bool SchemaWalk::is_validating_keyword(const std::string& k) {
  static const std::set<std::string> known = {"type", "nullable", "properties", "required", "additionalProperties",
                                              "items", "prefixItems", "minItems", "maxItems", "uniqueItems", "enum",
                                              "const", "anyOf", "oneOf", "allOf", "$ref", "minLength", "maxLength",
                                              "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                              "multipleOf", "pattern", "propertyNames"};
  return known.count(k) > 0 || is_unsupported_keyword(k);
}

std::string SchemaWalk::walk(const json& s, const std::string& name) {
  if (++depth_ > kMaxDepth) refuse(fmt::format("nested deeper than {} levels", kMaxDepth));
  std::string out = walk_node(s, name);
  --depth_;
  return out;
}

std::string SchemaWalk::walk_node(const json& s, const std::string& name) {
  if (s.is_boolean()) {
    if (!s.get<bool>()) refuse("the schema false matches nothing");
    return any_value();
  }
  if (!s.is_object()) refuse(fmt::format("a schema must be an object or a boolean, not {}", s.type_name()));
  check_keywords(s);
  if (s.contains("$ref")) return ref(s);
  if (s.contains("allOf")) return walk(merge_all_of(s), name);
  if (s.contains("anyOf") || s.contains("oneOf")) return any_of(s, name);
  if (s.contains("enum") || s.contains("const")) return enumeration(s, name);
  const auto types = type_list(s);
  if (types.empty()) return any_value();
  if (types.size() == 1) return typed(types[0], s, name);
  std::vector<std::string> alts;
  for (const auto& t : types) alts.push_back(typed_branch(t, s, name + "-" + t));
  return either(alts);
}

std::vector<std::string> SchemaWalk::type_list(const json& s) {
  static const std::set<std::string> known = {"object", "array", "string", "number", "integer", "boolean", "null"};
  std::vector<std::string> types;
  if (s.contains("type")) {
    const json& t = s["type"];
    const json list = t.is_array() ? t : json::array({t});
    if (list.empty()) refuse("'type' is an empty list");
    for (const auto& e : list) {
      if (!e.is_string() || !known.count(e.get<std::string>())) refuse(fmt::format("unknown type {}", dump(e)));
      if (std::find(types.begin(), types.end(), e.get<std::string>()) == types.end()) types.push_back(e.get<std::string>());
    }
  } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
    types = {"object"};
  } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) {
    types = {"array"};
  } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("format") || s.contains("pattern")) {
    types = {"string"};
  } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum") ||
             s.contains("multipleOf")) {
    types = {"number"};
  }
  if (s.value("nullable", false) == true && !types.empty() && std::find(types.begin(), types.end(), "null") == types.end()) {
    types.push_back("null");
  }
  return types;
}

// enum / const: the listed values (const narrows enum) of the allowed types, nothing else beside.
std::string SchemaWalk::enumeration(const json& s, const std::string& name) {
  for (const auto& [k, v] : s.items()) {
    if (is_validating_keyword(k) && k != "enum" && k != "const" && k != "type" && k != "nullable") {
      refuse(fmt::format("'{}' next to enum/const is not supported", k));
    }
  }
  json values = json::array();
  if (s.contains("const")) values.push_back(s["const"]);
  if (s.contains("enum")) {
    if (!s["enum"].is_array()) refuse("'enum' must be a list");
    json allowed = json::array();
    for (const auto& v : s["enum"]) {
      if (!s.contains("const") || v == s["const"]) allowed.push_back(v);
    }
    values = allowed;
  }
  const auto types = s.contains("type") ? type_list(s) : std::vector<std::string>{};
  json kept = json::array();
  for (const auto& v : values) {
    if (types.empty() || has_type(v, types)) kept.push_back(v);
  }
  if (kept.empty()) refuse("enum/const allows no value");
  return this->values(kept, name);
}

std::string SchemaWalk::any_of(const json& s, const std::string& name) {
  if (s.contains("anyOf") && s.contains("oneOf")) refuse("both 'anyOf' and 'oneOf'");
  const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
  for (const auto& [k, v] : s.items()) {
    if (is_validating_keyword(k) && k != key) refuse(fmt::format("'{}' next to '{}' is not supported", k, key));
  }
  const json& branches = s[key];
  if (!branches.is_array() || branches.empty()) refuse(fmt::format("'{}' must be a non-empty list", key));
  if (branches.size() > kMaxBranches) refuse(fmt::format("more than {} branches in '{}'", kMaxBranches, key));
  std::vector<std::string> alts;
  for (size_t i = 0; i < branches.size(); ++i) {
    PathGuard g(*this, std::string(key) + "/" + std::to_string(i));
    alts.push_back(branch(branches[i], name + "-" + std::to_string(i)));
  }
  return either(alts);
}

// $ref: one rule per target, made on first use; a reference back to a target still being walked
// is fine once some value has opened in between, else it is a loop (left recursion).
std::string SchemaWalk::ref(const json& s) {
  for (const auto& [k, v] : s.items()) {
    if (k != "$ref" && is_validating_keyword(k)) refuse(fmt::format("'$ref' next to '{}' is not supported", k));
  }
  const json& r = s["$ref"];
  if (!r.is_string()) refuse("'$ref' must be a string");
  const std::string target_ref = r.get<std::string>();
  for (const auto& [open_ref, opened] : open_refs_) {
    if (open_ref == target_ref && opened == opened_) {
      refuse(fmt::format("$ref '{}' refers to itself with no JSON text in between", target_ref));
    }
  }
  if (const auto it = ref_rules_.find(target_ref); it != ref_rules_.end()) return it->second;
  const json& target = resolve(target_ref);
  const std::string rule = new_ref_rule(target_ref);
  ref_rules_[target_ref] = rule;
  open_refs_.emplace_back(target_ref, opened_);
  PathGuard g(*this, target_ref);
  std::string body = walk(target, rule);
  open_refs_.pop_back();
  define_ref_rule(rule, std::move(body));
  return rule;
}

const json& SchemaWalk::resolve(const std::string& r) {
  if (r.empty() || r[0] != '#') refuse(fmt::format("$ref '{}' is not supported (only references inside the schema, #/...)", r));
  const json* target = nullptr;
  try {
    target = &document_.at(json::json_pointer(r.substr(1)));
  } catch (const nlohmann::json::exception&) {
    // named below
  }
  if (!target) refuse(fmt::format("$ref '{}' does not name a part of the schema", r));
  return *target;
}

// allOf: one schema with the branches' properties and required lists combined, the types
// intersected, and every other keyword required to agree.
json SchemaWalk::merge_all_of(const json& s) {
  json merged = s;
  merged.erase("allOf");
  const json& branches = s["allOf"];
  if (!branches.is_array() || branches.empty()) refuse("'allOf' must be a non-empty list");
  for (const auto& b : branches) merge_into(merged, flatten(b, 0));
  return merged;
}

// A branch with its $ref followed and its own allOf merged.
json SchemaWalk::flatten(const json& s, int hops) {
  if (++merge_work_ > kMergeBudget || hops > kMaxDepth) refuse("'allOf' expands too much (through $ref)");
  if (s.is_boolean()) {
    if (!s.get<bool>()) refuse("the schema false matches nothing");
    return json::object();
  }
  if (!s.is_object()) refuse(fmt::format("a schema must be an object or a boolean, not {}", s.type_name()));
  json out = s;
  if (s.contains("$ref")) {
    for (const auto& [k, v] : s.items()) {
      if (k != "$ref" && is_validating_keyword(k)) refuse(fmt::format("'$ref' next to '{}' is not supported", k));
    }
    if (!s["$ref"].is_string()) refuse("'$ref' must be a string");
    out = flatten(resolve(s["$ref"].get<std::string>()), hops + 1);
  }
  if (out.contains("allOf")) {
    json merged = out;
    merged.erase("allOf");
    if (!out["allOf"].is_array() || out["allOf"].empty()) refuse("'allOf' must be a non-empty list");
    for (const auto& b : out["allOf"]) merge_into(merged, flatten(b, hops + 1));
    out = std::move(merged);
  }
  return out;
}

void SchemaWalk::merge_into(json& merged, const json& b) {
  for (const auto& [k, v] : b.items()) {
    if (!is_validating_keyword(k)) continue;
    if (!merged.contains(k)) {
      merged[k] = v;
    } else if (k == "properties") {
      if (!v.is_object() || !merged[k].is_object()) refuse("'properties' must be an object");
      for (const auto& [pk, pv] : v.items()) {
        json& mine = merged[k][pk];
        mine = mine.is_null() || mine == pv ? pv : json{{"allOf", json::array({mine, pv})}};
      }
    } else if (k == "required") {
      if (!v.is_array() || !merged[k].is_array()) refuse("'required' must be a list");
      for (const auto& r : v) {
        if (std::find(merged[k].begin(), merged[k].end(), r) == merged[k].end()) merged[k].push_back(r);
      }
    } else if (k == "type") {
      merged[k] = intersect_types(merged[k], v);
    } else if (merged[k] != v) {
      refuse(fmt::format("'allOf' branches disagree on '{}'", k));
    }
  }
}

json SchemaWalk::intersect_types(const json& a, const json& b) {
  const json la = a.is_array() ? a : json::array({a});
  const json lb = b.is_array() ? b : json::array({b});
  json out = json::array();
  auto has = [](const json& l, const char* t) { return std::find(l.begin(), l.end(), json(t)) != l.end(); };
  for (const auto& t : la) {
    if (has(lb, t.is_string() ? t.get<std::string>().c_str() : "")) {
      out.push_back(t);
    } else if ((t == "integer" && has(lb, "number")) || (t == "number" && has(lb, "integer"))) {
      out.push_back("integer");
    }
  }
  if (out.empty()) refuse("'allOf' branches allow no common type");
  return out;
}

}  // namespace bmoe
