#include "nn/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <unordered_set>

namespace loom::json {

const char* type_name(Value::Type type) {
  switch (type) {
    case Value::Type::Null: return "null";
    case Value::Type::Bool: return "bool";
    case Value::Type::Int: return "integer";
    case Value::Type::Float: return "number";
    case Value::Type::String: return "string";
    case Value::Type::Array: return "array";
    case Value::Type::Object: return "object";
  }
  return "?";
}

namespace {

template <typename T>
const T& get(const std::variant<std::monostate, bool, int64_t, double, std::string, Value::Array, Value::Object>& d,
             Value::Type want) {
  const T* p = std::get_if<T>(&d);
  LOOM_CHECK(p, "json: expected ", type_name(want), ", got ", type_name(static_cast<Value::Type>(d.index())));
  return *p;
}

}  // namespace

bool Value::as_bool() const { return get<bool>(data_, Type::Bool); }
int64_t Value::as_int() const { return get<int64_t>(data_, Type::Int); }
double Value::as_double() const {
  if (is_int()) return static_cast<double>(as_int());
  return get<double>(data_, Type::Float);
}
const std::string& Value::as_string() const { return get<std::string>(data_, Type::String); }
const Value::Array& Value::as_array() const { return get<Array>(data_, Type::Array); }
const Value::Object& Value::as_object() const { return get<Object>(data_, Type::Object); }
Value::Array& Value::as_array() { return const_cast<Array&>(static_cast<const Value&>(*this).as_array()); }
Value::Object& Value::as_object() { return const_cast<Object&>(static_cast<const Value&>(*this).as_object()); }

const Value* Value::find(std::string_view key) const {
  for (const auto& [k, v] : as_object())
    if (k == key) return &v;
  return nullptr;
}

const Value& Value::operator[](std::string_view key) const {
  const Value* v = find(key);
  LOOM_CHECK(v, "json: object has no key \"", key, "\"");
  return *v;
}

const Value& Value::operator[](size_t index) const {
  const Array& a = as_array();
  LOOM_CHECK(index < a.size(), "json: index ", index, " is out of range for an array of ", a.size());
  return a[index];
}

void Value::set(std::string key, Value value) {
  if (is_null()) data_ = Object{};
  as_object().emplace_back(std::move(key), std::move(value));
}

// ---- parsing ------------------------------------------------------------------------------

namespace {

constexpr int kMaxDepth = 64;

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Value parse_document() {
    Value v = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) fail("expected the end of the document");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') ++line, column = 1;
      else ++column;
    }
    std::string got = pos_ >= text_.size() ? "the end of the text" : describe(text_[pos_]);
    throw ParseError(detail::str("JSON parse error at byte ", pos_, " (line ", line, ", column ", column, "): ", what,
                                 ", got ", got));
  }

  static std::string describe(char c) {
    auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) return detail::str("'", c, "'");
    char buf[8];
    std::snprintf(buf, sizeof buf, "0x%02x", u);
    return detail::str("byte ", buf);
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r'))
      ++pos_;
  }

  bool consume(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (!consume(c)) fail(detail::str("expected '", c, "'"));
  }

  Value parse_value(int depth) {
    if (depth > kMaxDepth) fail(detail::str("nesting deeper than ", kMaxDepth, " levels"));
    skip_space();
    if (pos_ >= text_.size()) fail("expected a value");
    char c = text_[pos_];
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') return Value(parse_string());
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
    if (text_.substr(pos_, 4) == "true") return pos_ += 4, Value(true);
    if (text_.substr(pos_, 5) == "false") return pos_ += 5, Value(false);
    if (text_.substr(pos_, 4) == "null") return pos_ += 4, Value();
    fail("expected a value (object, array, string, number, true, false or null)");
  }

  Value parse_object(int depth) {
    expect('{');
    Value::Object members;
    if (consume('}')) return Value(std::move(members));
    std::unordered_set<std::string> seen;  // a linear scan per key made a 2M-key header take an hour
    do {
      skip_space();
      if (pos_ >= text_.size() || text_[pos_] != '"') fail("expected a string key");
      size_t key_pos = pos_;
      std::string key = parse_string();
      if (!seen.insert(key).second) {
        pos_ = key_pos;
        fail(detail::str("duplicate key \"", key, "\""));
      }
      expect(':');
      members.emplace_back(std::move(key), parse_value(depth + 1));
    } while (consume(','));
    expect('}');
    return Value(std::move(members));
  }

  Value parse_array(int depth) {
    expect('[');
    Value::Array items;
    if (consume(']')) return Value(std::move(items));
    do items.push_back(parse_value(depth + 1));
    while (consume(','));
    expect(']');
    return Value(std::move(items));
  }

  unsigned hex4() {
    if (pos_ + 4 > text_.size()) fail("expected 4 hex digits after \\u");
    unsigned code = 0;
    for (int i = 0; i < 4; ++i) {
      char h = text_[pos_];
      code <<= 4;
      if (h >= '0' && h <= '9') code |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f') code |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') code |= static_cast<unsigned>(h - 'A' + 10);
      else fail("expected a hex digit in a \\u escape");
      ++pos_;
    }
    return code;
  }

  static void append_utf8(std::string& out, unsigned code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  std::string parse_string() {
    ++pos_;  // the opening quote
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("unterminated string");
      char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("expected a control character in a string to be escaped");
      ++pos_;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail("unterminated escape");
      char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned code = hex4();
          // A surrogate pair encodes one code point above U+FFFF.
          if (code >= 0xD800 && code < 0xDC00 && text_.substr(pos_, 2) == "\\u") {
            pos_ += 2;
            unsigned low = hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail("expected a low surrogate after a high surrogate");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, code);
          break;
        }
        default: --pos_; fail("expected a valid escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
      }
    }
  }

  Value parse_number() {
    const size_t start = pos_;
    if (text_[pos_] == '-') ++pos_;
    auto digits = [&] {
      size_t first = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ - first;
    };
    if (digits() == 0) fail("expected a digit");
    bool integral = true;
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_, integral = false;
      if (digits() == 0) fail("expected a digit after the decimal point");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_, integral = false;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (digits() == 0) fail("expected a digit in the exponent");
    }
    std::string_view token = text_.substr(start, pos_ - start);
    if (integral) {
      int64_t value = 0;
      auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
      if (ec != std::errc() || end != token.data() + token.size()) {
        pos_ = start;
        fail(detail::str("integer ", token, " does not fit in 64 bits"));
      }
      return Value(value);
    }
    // A finite double or an error: strtod turns 1e400 into inf, which dump() cannot write
    // back and no JSON producer meant (found by tests/fuzz/fuzz_json). Underflow to 0
    // or a subnormal is kept, as Python's json does.
    const double value = std::strtod(std::string(token).c_str(), nullptr);
    if (!std::isfinite(value)) {
      pos_ = start;
      fail(detail::str("number ", token.substr(0, 40), token.size() > 40 ? "..." : "", " is beyond the range of a "
                       "double (about 1.8e308)"));
    }
    return Value(value);
  }

  std::string_view text_;
  size_t pos_ = 0;
};

void dump_string(const std::string& s, std::string& out) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void dump_into(const Value& v, std::string& out) {
  switch (v.type()) {
    case Value::Type::Null: out += "null"; return;
    case Value::Type::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Type::Int: out += std::to_string(v.as_int()); return;
    case Value::Type::Float: {
      double d = v.as_double();
      LOOM_CHECK(std::isfinite(d), "json::dump: JSON cannot represent ", d);
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", d);
      out += buf;
      // A float stays a float: 3.0 is written "3.0", not "3", which parse() reads back as
      // the integer 3 (and -0.0 as the integer 0; found by tests/fuzz/fuzz_json).
      if (std::string_view(buf).find_first_of(".e") == std::string_view::npos) out += ".0";
      return;
    }
    case Value::Type::String: dump_string(v.as_string(), out); return;
    case Value::Type::Array: {
      out += '[';
      const auto& items = v.as_array();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ',';
        dump_into(items[i], out);
      }
      out += ']';
      return;
    }
    case Value::Type::Object: {
      out += '{';
      bool first = true;
      for (const auto& [k, member] : v.as_object()) {
        if (!first) out += ',';
        first = false;
        dump_string(k, out);
        out += ':';
        dump_into(member, out);
      }
      out += '}';
      return;
    }
  }
}

}  // namespace

Value parse(std::string_view text) { return Parser(text).parse_document(); }

std::string dump(const Value& value) {
  std::string out;
  dump_into(value, out);
  return out;
}

}  // namespace loom::json
