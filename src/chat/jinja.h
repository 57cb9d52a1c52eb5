// A Jinja subset for chat templates: the statements, expressions, filters, tests and methods
// that models' own templates (Qwen3, Qwen3.5, gpt-oss, Gemma, Llama 3, DeepSeek, LFM2) use.
// Rendering follows Hugging Face's jinja (the reference for apply_chat_template in JavaScript)
// where Python's Jinja and it differ: trim_blocks and lstrip_blocks on, one trailing newline of
// the template dropped, `{{ none }}` prints nothing, booleans print as true/false, tojson
// separates with ", " and ": " in insertion order.
//
// Contract: parse() and render() throw JinjaError (one line, with the template line where it
// applies) on any bad template or failed render; nothing a template says can crash the process
// or run without bound (nesting, loop steps and output size are capped).
#pragma once

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace bmoe::jinja {

class JinjaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Value;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;  // insertion order, as tojson keeps it
struct Arguments;
using Function = std::function<Value(Arguments&)>;

// A template value. Arrays, objects and functions are shared (a namespace() or a list changed
// inside a loop is changed for everyone holding it), as in Jinja.
class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, Array, Object, Function };

  Value() = default;
  static Value none() { Value v; v.kind_ = Kind::None; return v; }
  Value(bool b) : kind_(Kind::Bool), int_(b) {}
  Value(int i) : kind_(Kind::Int), int_(i) {}
  Value(int64_t i) : kind_(Kind::Int), int_(i) {}
  Value(double d) : kind_(Kind::Float), float_(d) {}
  Value(std::string s) : kind_(Kind::String), string_(std::make_shared<std::string>(std::move(s))) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(Array a) : kind_(Kind::Array), array_(std::make_shared<Array>(std::move(a))) {}
  Value(Object o) : kind_(Kind::Object), object_(std::make_shared<Object>(std::move(o))) {}
  Value(Function f) : kind_(Kind::Function), function_(std::make_shared<Function>(std::move(f))) {}
  static Value from_json(const nlohmann::json& j);
  static Value from_json(const nlohmann::ordered_json& j);  // keeps the keys' order (tojson shows it)

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_array() const { return kind_ == Kind::Array; }
  bool is_object() const { return kind_ == Kind::Object; }
  bool is_function() const { return kind_ == Kind::Function; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return kind_ == Kind::Float ? static_cast<int64_t>(float_) : int_; }
  double as_double() const { return kind_ == Kind::Float ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const { return *string_; }
  Array& as_array() const { return *array_; }
  Object& as_object() const { return *object_; }
  const Function& as_function() const { return *function_; }

  // Object member, or undefined.
  Value get(std::string_view key) const;
  void set(const std::string& key, Value v) const;  // objects only

  bool truthy() const;
  std::string to_string() const;  // what {{ v }} prints
  std::string to_json(int indent = -1) const;
  bool equals(const Value& other) const;
  const char* kind_name() const;

 private:
  Kind kind_ = Kind::Undefined;
  int64_t int_ = 0;
  double float_ = 0.0;
  std::shared_ptr<std::string> string_;
  std::shared_ptr<Array> array_;
  std::shared_ptr<Object> object_;
  std::shared_ptr<Function> function_;
};

struct Arguments {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at `index`, else the keyword `name`, else `fallback`.
  Value at(size_t index, std::string_view name, Value fallback = Value()) const;
  // A keyword-only argument (map's attribute=, default=).
  Value named(std::string_view name, Value fallback = Value()) const;
};

struct Node;

class Template {
 public:
  explicit Template(std::string_view source);  // parses; throws JinjaError
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with `context` (an object) as the global variables.
  std::string render(const Value& context) const;

 private:
  std::unique_ptr<Node> root_;
};

}  // namespace bmoe::jinja
