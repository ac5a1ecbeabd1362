#pragma once
// Minimal JSON: a parser with positions in its errors, and a string quoter for writers.
// Contract: parse() accepts RFC 8259 JSON (objects, arrays, strings with \u escapes and surrogate
// pairs, numbers, true/false/null) and throws gpt2::UserError("<source>: line L, column C: <what>")
// on anything else. Object members keep file order. Numbers keep an exact int64 when integral.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpt2::json {

class Value {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  using Array = std::vector<Value>;
  using Object = std::vector<std::pair<std::string, Value>>;  // file order

  Value() = default;
  static Value null() { return Value(); }
  static Value boolean(bool b);
  static Value number(double d);
  static Value integer(int64_t i);
  static Value string(std::string s);
  static Value array(Array a);
  static Value object(Object o);

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_integer() const { return type_ == Type::kNumber && is_integer_; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // Typed access; throws gpt2::UserError naming `what` when the type differs.
  bool as_bool(std::string_view what = "value") const;
  double as_double(std::string_view what = "value") const;
  int64_t as_int(std::string_view what = "value") const;  // integral numbers only
  const std::string& as_string(std::string_view what = "value") const;
  const Array& as_array(std::string_view what = "value") const;
  const Object& as_object(std::string_view what = "value") const;

  // Object lookup: nullptr when absent (or when not an object).
  const Value* find(std::string_view key) const;
  // Object lookup that throws gpt2::UserError("missing key '<key>' in <what>") when absent.
  const Value& at(std::string_view key, std::string_view what = "object") const;

 private:
  Type type_ = Type::kNull;
  bool bool_ = false;
  bool is_integer_ = false;
  double number_ = 0;
  int64_t integer_ = 0;
  std::string string_;
  std::shared_ptr<Array> array_;
  std::shared_ptr<Object> object_;
};

// Parses one JSON document (surrounding whitespace allowed). `source` names the file/line in errors.
Value parse(std::string_view text, std::string_view source);

// Serialises a string as a JSON string literal (quotes included), escaping control characters.
std::string quote(std::string_view s);
// Serialises any value compactly.
std::string dump(const Value& v);

}  // namespace gpt2::json
