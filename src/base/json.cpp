// nlohmann-json with messages that name the source and the key (see json.h).
#include "src/base/json.h"

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "src/base/errors.h"

namespace gpt2::json {
namespace {

// Deeper documents are refused before parsing: nlohmann-json has no depth limit, and dump() and
// the value's copy recurse, so a hostile file could overflow the stack.
constexpr int kMaxDepth = 512;

const char* type_name(const Value& v) {
  switch (v.type()) {
    case Value::value_t::null:
      return "null";
    case Value::value_t::boolean:
      return "a boolean";
    case Value::value_t::number_integer:
    case Value::value_t::number_unsigned:
    case Value::value_t::number_float:
      return "a number";
    case Value::value_t::string:
      return "a string";
    case Value::value_t::array:
      return "an array";
    case Value::value_t::object:
      return "an object";
    default:
      return "a binary value";
  }
}

[[noreturn]] void type_error(std::string_view what, const char* expected, const Value& got) {
  throw UserError(std::string(what) + ": expected " + expected + ", got " + type_name(got));
}

// nlohmann's message without its "[json.exception.parse_error.101] parse error at line L,
// column C: " prefix: what the parser found wrong.
std::string reason(const std::string& message) {
  const size_t column = message.find("column ");
  size_t start = column == std::string::npos ? std::string::npos : message.find(": ", column);
  if (start == std::string::npos) {
    start = message.find("] ");  // errors without a position: "[json.exception.out_of_range.406] ..."
    return start == std::string::npos ? message : message.substr(start + 2);
  }
  return message.substr(start + 2);
}

// "<source>: line L, column C: " for the byte at `at` (columns count bytes, from 1).
std::string position(std::string_view text, size_t at, std::string_view source) {
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < at && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return std::string(source) + ": line " + std::to_string(line) + ", column " + std::to_string(at - line_start + 1) +
         ": ";
}

void check_depth(std::string_view text, std::string_view source) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth)
        throw UserError(position(text, i, source) + "nesting deeper than " + std::to_string(kMaxDepth));
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

}  // namespace

Value parse(std::string_view text, std::string_view source, DuplicateKeys duplicates) {
  check_depth(text, source);
  try {
    if (duplicates == DuplicateKeys::kLastWins) return Value::parse(text.begin(), text.end());
    std::vector<std::set<std::string>> keys;  // of each object being parsed, innermost last
    return Value::parse(text.begin(), text.end(), [&](int, Value::parse_event_t event, Value& parsed) {
      if (event == Value::parse_event_t::object_start) keys.emplace_back();
      if (event == Value::parse_event_t::object_end) keys.pop_back();
      if (event == Value::parse_event_t::key && !keys.back().insert(parsed.get<std::string>()).second) {
        throw UserError(std::string(source) + ": duplicate key '" + parsed.get<std::string>() + "'");
      }
      return true;
    });
  } catch (const Value::parse_error& e) {
    // e.byte: 1-based index of the byte the parser stopped at.
    throw UserError(position(text, e.byte == 0 ? 0 : e.byte - 1, source) + reason(e.what()));
  } catch (const Value::exception& e) {
    throw UserError(std::string(source) + ": " + reason(e.what()));
  }
}

bool as_bool(const Value& v, std::string_view what) {
  if (!v.is_boolean()) type_error(what, "a boolean", v);
  return v.get<bool>();
}

double as_double(const Value& v, std::string_view what) {
  if (!v.is_number()) type_error(what, "a number", v);
  return v.get<double>();
}

int64_t as_int(const Value& v, std::string_view what) {
  if (!v.is_number()) type_error(what, "an integer", v);
  if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<int64_t>();
  if (v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)) return v.get<int64_t>();
  // 2^63 is exactly representable, so `< 2^63` is the precise upper bound.
  constexpr double kTwo63 = 9223372036854775808.0;
  const double d = v.get<double>();
  if (v.is_number_float() && std::isfinite(d) && std::trunc(d) == d && d >= -kTwo63 && d < kTwo63) {
    return static_cast<int64_t>(d);
  }
  throw UserError(std::string(what) + ": expected an integer, got " + dump(v));
}

const std::string& as_string(const Value& v, std::string_view what) {
  if (!v.is_string()) type_error(what, "a string", v);
  return v.get_ref<const std::string&>();
}

const Value::array_t& as_array(const Value& v, std::string_view what) {
  if (!v.is_array()) type_error(what, "an array", v);
  return v.get_ref<const Value::array_t&>();
}

const Value::object_t& as_object(const Value& v, std::string_view what) {
  if (!v.is_object()) type_error(what, "an object", v);
  return v.get_ref<const Value::object_t&>();
}

const Value* find(const Value& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

const Value& at(const Value& object, std::string_view key, std::string_view what) {
  const Value* v = find(object, key);
  if (v == nullptr) {
    if (!object.is_object()) type_error(what, "an object", object);
    throw UserError("missing key '" + std::string(key) + "' in " + std::string(what));
  }
  return *v;
}

std::string dump(const Value& v) { return v.dump(-1, ' ', false, Value::error_handler_t::replace); }

std::string quote(std::string_view s) { return dump(Value(std::string(s))); }

}  // namespace gpt2::json
