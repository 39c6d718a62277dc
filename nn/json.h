// json: a small, strict JSON reader and writer, enough for safetensors headers (objects,
// arrays, strings, integers, and for completeness floats, booleans and null).
//
//   json::Value v = json::parse(R"({"a": {"shape": [2, 3]}})");
//   int64_t rows = v["a"]["shape"][0].as_int();
//   std::string text = json::dump(v);              // {"a":{"shape":[2,3]}}
//
// Parsing never trusts its input: every error is a json::ParseError (a loom::Error)
// saying what was expected, what came, and where (byte offset, line and column);
// nesting is limited so a hostile file cannot overflow the stack; duplicate object keys
// are errors rather than silently overwriting (a safetensors header with two tensors of
// one name is ambiguous). Objects keep their keys in file order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/error.h"

namespace loom::json {

class ParseError : public Error {
 public:
  using Error::Error;
};

class Value {
 public:
  using Array = std::vector<Value>;
  using Object = std::vector<std::pair<std::string, Value>>;
  enum class Type { Null, Bool, Int, Float, String, Array, Object };

  Value() = default;  // null
  Value(std::nullptr_t) {}  // NOLINT
  Value(bool b) : data_(b) {}  // NOLINT
  Value(int64_t i) : data_(i) {}  // NOLINT
  Value(int i) : data_(static_cast<int64_t>(i)) {}  // NOLINT
  Value(double d) : data_(d) {}  // NOLINT
  Value(std::string s) : data_(std::move(s)) {}  // NOLINT
  Value(const char* s) : data_(std::string(s)) {}  // NOLINT
  Value(Array a) : data_(std::move(a)) {}  // NOLINT
  Value(Object o) : data_(std::move(o)) {}  // NOLINT

  Type type() const { return static_cast<Type>(data_.index()); }
  bool is_null() const { return type() == Type::Null; }
  bool is_int() const { return type() == Type::Int; }
  bool is_string() const { return type() == Type::String; }
  bool is_array() const { return type() == Type::Array; }
  bool is_object() const { return type() == Type::Object; }

  // Typed access; the wrong type is a loom::Error naming both types.
  bool as_bool() const;
  int64_t as_int() const;
  double as_double() const;  // ints convert
  const std::string& as_string() const;
  const Array& as_array() const;
  const Object& as_object() const;
  Array& as_array();
  Object& as_object();

  // Object member lookup: find returns null when absent; operator[] throws naming the key.
  const Value* find(std::string_view key) const;
  const Value& operator[](std::string_view key) const;
  const Value& operator[](size_t index) const;
  // Appends to an object (a null Value becomes an empty object first).
  void set(std::string key, Value value);

 private:
  std::variant<std::monostate, bool, int64_t, double, std::string, Array, Object> data_;
};

const char* type_name(Value::Type type);

// Parses exactly one JSON value, optionally surrounded by whitespace.
Value parse(std::string_view text);
// Compact JSON; strings are escaped so that any bytes round-trip through parse().
std::string dump(const Value& value);

}  // namespace loom::json
