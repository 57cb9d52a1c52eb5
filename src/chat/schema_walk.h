// One walk over a JSON Schema for every value syntax bmoe's grammars write: JSON (response_format,
// tool arguments written as JSON; chat/json_schema.cpp) and Gemma 4's tool-call values
// (chat/tool_calls.cpp). The walk reads a schema node the same way for both: boolean schemas,
// the keywords a syntax refuses, $ref (one rule per target, recursion allowed once a value has
// opened in between), allOf (merged into one schema), anyOf / oneOf (alternatives), enum / const
// (the allowed values, filtered by type) and the types a node allows ("type", else the keywords
// present). A syntax (the subclass) writes each kind of value: an object, an array, a string, a
// number, the fixed values of an enum, any value; and says where an error is.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace bmoe {

class SchemaWalk {
 public:
  using json = nlohmann::ordered_json;

  // Keywords that constrain a value (the others are annotations or unknown extensions), and
  // those among them that no syntax enforces.
  static bool is_validating_keyword(const std::string& k);
  static bool is_unsupported_keyword(const std::string& k);

  virtual ~SchemaWalk() = default;
  SchemaWalk(const SchemaWalk&) = delete;
  SchemaWalk& operator=(const SchemaWalk&) = delete;

 protected:
  // `document`: what "#..." $refs point into.
  explicit SchemaWalk(const json& document) : document_(document) {}

  // The grammar for the values of `s` (a rule body, or an expression, as the syntax writes them);
  // `name` names the rules made for it.
  std::string walk(const json& s, const std::string& name);
  // The types `s` allows; empty for any value. Without "type", the keywords present choose
  // (stricter than the schema, which would let other types through); nullable adds "null".
  std::vector<std::string> type_list(const json& s);

  // ---- what a syntax writes
  [[noreturn]] virtual void refuse(const std::string& what) const = 0;  // an error here (path())
  virtual void check_keywords(const json& s) = 0;  // refuses what the syntax cannot enforce
  virtual std::string any_value() = 0;
  virtual std::string typed(const std::string& type, const json& s, const std::string& name) = 0;
  virtual std::string values(const json& allowed, const std::string& name) = 0;  // enum / const
  // Alternatives (types of one node, anyOf branches) as one grammar; each from branch().
  virtual std::string either(const std::vector<std::string>& alternatives) = 0;
  virtual std::string branch(const json& s, const std::string& name) { return walk(s, name); }
  virtual std::string typed_branch(const std::string& type, const json& s, const std::string& name) {
    return typed(type, s, name);
  }
  // A $ref's rule: named before its body is walked (a recursive $ref uses the name), defined after.
  virtual std::string new_ref_rule(const std::string& ref) = 0;
  virtual void define_ref_rule(const std::string& rule, std::string body) = 0;

  // Where the walk is, one part per step ("properties/city", "anyOf/0", "items", a $ref's target).
  struct PathGuard {
    SchemaWalk& w;
    PathGuard(SchemaWalk& walk, std::string part) : w(walk) { w.path_.push_back(std::move(part)); }
    ~PathGuard() { w.path_.pop_back(); }
  };
  // A syntax writes a value's opening text ('{', '[') while one lives: a $ref reached again after
  // that is recursion, not a loop.
  struct Opened {
    SchemaWalk& w;
    explicit Opened(SchemaWalk& walk) : w(walk) { ++w.opened_; }
    ~Opened() { --w.opened_; }
  };
  const std::vector<std::string>& path() const { return path_; }

 private:
  std::string walk_node(const json& s, const std::string& name);
  std::string ref(const json& s);
  std::string any_of(const json& s, const std::string& name);
  std::string enumeration(const json& s, const std::string& name);
  const json& resolve(const std::string& ref);
  json merge_all_of(const json& s);
  json flatten(const json& s, int hops);
  void merge_into(json& merged, const json& branch);
  json intersect_types(const json& a, const json& b);

  const json& document_;
  int depth_ = 0;
  int opened_ = 0;
  std::map<std::string, std::string> ref_rules_;             // $ref target -> its rule
  std::vector<std::pair<std::string, int>> open_refs_;       // $refs being walked, opened_ at entry
  std::vector<std::string> path_;
  int64_t merge_work_ = 0;
};

}  // namespace bmoe
