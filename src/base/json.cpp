// Minimal JSON parser/writer (see json.h for the contract).
// A recursive-descent parser over the raw bytes; positions are byte offsets until an error is
// reported, then turned into line/column (columns count code points, 1-based) so the happy path
// pays nothing for error reporting.
#include "src/base/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "src/base/errors.h"

namespace gpt2::json {

// ---------------------------------------------------------------- Value

Value Value::boolean(bool b) {
  Value v;
  v.type_ = Type::kBool;
  v.bool_ = b;
  return v;
}

Value Value::number(double d) {
  Value v;
  v.type_ = Type::kNumber;
  v.number_ = d;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.type_ = Type::kNumber;
  v.is_integer_ = true;
  v.integer_ = i;
  v.number_ = static_cast<double>(i);
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.type_ = Type::kString;
  v.string_ = std::move(s);
  return v;
}

Value Value::array(Array a) {
  Value v;
  v.type_ = Type::kArray;
  v.array_ = std::make_shared<Array>(std::move(a));
  return v;
}

Value Value::object(Object o) {
  Value v;
  v.type_ = Type::kObject;
  v.object_ = std::make_shared<Object>(std::move(o));
  return v;
}

namespace {

const char* type_name(Value::Type t) {
  switch (t) {
    case Value::Type::kNull: return "null";
    case Value::Type::kBool: return "a boolean";
    case Value::Type::kNumber: return "a number";
    case Value::Type::kString: return "a string";
    case Value::Type::kArray: return "an array";
    case Value::Type::kObject: return "an object";
  }
  return "?";
}

[[noreturn]] void type_error(std::string_view what, const char* expected, Value::Type got) {
  throw UserError(std::string(what) + ": expected " + expected + ", got " + type_name(got));
}

}  // namespace

bool Value::as_bool(std::string_view what) const {
  if (type_ != Type::kBool) type_error(what, "a boolean", type_);
  return bool_;
}

double Value::as_double(std::string_view what) const {
  if (type_ != Type::kNumber) type_error(what, "a number", type_);
  return is_integer_ ? static_cast<double>(integer_) : number_;
}

int64_t Value::as_int(std::string_view what) const {
  if (type_ != Type::kNumber) type_error(what, "an integer", type_);
  if (is_integer_) return integer_;
  // Accept doubles that hold an exact integer in range (e.g. 1e3); reject 1.5 and 1e300.
  // 2^63 is exactly representable, so `< 2^63` is the precise upper bound.
  constexpr double kTwo63 = 9223372036854775808.0;
  if (std::isfinite(number_) && std::trunc(number_) == number_ && number_ >= -kTwo63 &&
      number_ < kTwo63) {
    return static_cast<int64_t>(number_);
  }
  throw UserError(std::string(what) + ": expected an integer, got " + dump(*this));
}

const std::string& Value::as_string(std::string_view what) const {
  if (type_ != Type::kString) type_error(what, "a string", type_);
  return string_;
}

const Value::Array& Value::as_array(std::string_view what) const {
  if (type_ != Type::kArray) type_error(what, "an array", type_);
  return *array_;
}

const Value::Object& Value::as_object(std::string_view what) const {
  if (type_ != Type::kObject) type_error(what, "an object", type_);
  return *object_;
}

const Value* Value::find(std::string_view key) const {
  if (type_ != Type::kObject) return nullptr;
  // Duplicate keys: the last one wins, as in Python's json module. Linear: objects here are small
  // or iterated as a whole (encoder.json), never looked up key by key.
  for (auto it = object_->rbegin(); it != object_->rend(); ++it) {
    if (it->first == key) return &it->second;
  }
  return nullptr;
}

const Value& Value::at(std::string_view key, std::string_view what) const {
  const Value* v = find(key);
  if (v == nullptr) {
    if (type_ != Type::kObject) type_error(what, "an object", type_);
    throw UserError("missing key '" + std::string(key) + "' in " + std::string(what));
  }
  return *v;
}

// ---------------------------------------------------------------- parser

namespace {

// Deep enough for any real document, shallow enough that recursion cannot overflow the stack.
constexpr int kMaxDepth = 512;

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is invalid (overlong forms,
// surrogates and code points above U+10FFFF are invalid, as in RFC 3629).
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    cp = b0 & 0x0F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    cp = b0 & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
      (cp >= 0xD800 && cp <= 0xDFFF)) {
    return 0;
  }
  return n;
}

class Parser {
 public:
  Parser(std::string_view text, std::string_view source) : text_(text), source_(source) {}

  Value parse_document() {
    // A UTF-8 byte order mark is allowed (RFC 8259 section 8.1 lets parsers ignore it).
    if (text_.substr(0, 3) == "\xEF\xBB\xBF") pos_ = 3;
    skip_ws();
    Value v = parse_value(0);
    skip_ws();
    if (pos_ != text_.size()) fail(pos_, "unexpected " + describe(pos_) + " after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& what) const {
    // Turn the byte offset into line/column only now, on the error path.
    size_t line = 1;
    size_t line_start = 0;
    at = std::min(at, text_.size());
    for (size_t i = 0; i < at; ++i) {
      if (text_[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    }
    size_t column = 1;
    for (size_t i = line_start; i < at; ++i) {
      if ((static_cast<unsigned char>(text_[i]) & 0xC0) != 0x80) ++column;
    }
    throw UserError(std::string(source_) + ": line " + std::to_string(line) + ", column " +
                    std::to_string(column) + ": " + what);
  }

  // A readable name for the byte at `at` for messages: 'x', or a hex byte for non-printables.
  std::string describe(size_t at) const {
    if (at >= text_.size()) return "end of input";
    const auto c = static_cast<unsigned char>(text_[at]);
    if (c >= 0x20 && c < 0x7F) return std::string("character '") + static_cast<char>(c) + "'";
    char buf[32];
    std::snprintf(buf, sizeof buf, "byte 0x%02X", c);
    return buf;
  }

  void skip_ws() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  void expect_literal(std::string_view word) {
    if (text_.compare(pos_, word.size(), word) != 0) {
      // Point at the first byte that differs.
      size_t i = 0;
      while (i < word.size() && pos_ + i < text_.size() && text_[pos_ + i] == word[i]) ++i;
      fail(pos_ + i, "invalid literal, expected '" + std::string(word) + "'");
    }
    pos_ += word.size();
  }

  Value parse_value(int depth) {
    if (pos_ >= text_.size()) fail(pos_, "unexpected end of input, expected a value");
    switch (text_[pos_]) {
      case '{': return parse_object(depth + 1);
      case '[': return parse_array(depth + 1);
      case '"': return Value::string(parse_string());
      case 't': expect_literal("true"); return Value::boolean(true);
      case 'f': expect_literal("false"); return Value::boolean(false);
      case 'n': expect_literal("null"); return Value::null();
      default:
        if (text_[pos_] == '-' || (text_[pos_] >= '0' && text_[pos_] <= '9')) return parse_number();
        fail(pos_, "unexpected " + describe(pos_) + ", expected a value");
    }
  }

  Value parse_object(int depth) {
    if (depth > kMaxDepth) fail(pos_, "nesting deeper than " + std::to_string(kMaxDepth));
    ++pos_;  // '{'
    Value::Object members;
    skip_ws();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      return Value::object(std::move(members));
    }
    while (true) {
      skip_ws();
      if (pos_ >= text_.size() || text_[pos_] != '"') {
        fail(pos_, "unexpected " + describe(pos_) + ", expected a string key");
      }
      std::string key = parse_string();
      skip_ws();
      if (pos_ >= text_.size() || text_[pos_] != ':') {
        fail(pos_, "unexpected " + describe(pos_) + ", expected ':' after an object key");
      }
      ++pos_;
      skip_ws();
      Value v = parse_value(depth);
      members.emplace_back(std::move(key), std::move(v));
      skip_ws();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == '}') {
        ++pos_;
        return Value::object(std::move(members));
      }
      fail(pos_, "unexpected " + describe(pos_) + ", expected ',' or '}' in an object");
    }
  }

  Value parse_array(int depth) {
    if (depth > kMaxDepth) fail(pos_, "nesting deeper than " + std::to_string(kMaxDepth));
    ++pos_;  // '['
    Value::Array items;
    skip_ws();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      return Value::array(std::move(items));
    }
    while (true) {
      skip_ws();
      items.push_back(parse_value(depth));
      skip_ws();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == ']') {
        ++pos_;
        return Value::array(std::move(items));
      }
      fail(pos_, "unexpected " + describe(pos_) + ", expected ',' or ']' in an array");
    }
  }

  // Four hex digits after "\u" at pos_; returns the code unit.
  uint32_t parse_hex4() {
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      if (pos_ >= text_.size()) fail(pos_, "unexpected end of input in a \\u escape");
      const char c = text_[pos_];
      uint32_t d;
      if (c >= '0' && c <= '9') d = c - '0';
      else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      else fail(pos_, "invalid hex digit in a \\u escape: " + describe(pos_));
      v = (v << 4) | d;
      ++pos_;
    }
    return v;
  }

  std::string parse_string() {
    const size_t open = pos_;
    ++pos_;  // '"'
    std::string out;
    while (true) {
      // Copy the run of plain bytes in one go (the common case: long keys without escapes).
      const size_t run_start = pos_;
      while (pos_ < text_.size()) {
        const auto c = static_cast<unsigned char>(text_[pos_]);
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
        ++pos_;
      }
      out.append(text_.data() + run_start, pos_ - run_start);
      if (pos_ >= text_.size()) fail(open, "unterminated string");
      const auto c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) fail(pos_, "unescaped control character (" + describe(pos_) + ") in a string");
      if (c >= 0x80) {
        const size_t n = utf8_sequence_length(text_, pos_);
        if (n == 0) fail(pos_, "invalid UTF-8 (" + describe(pos_) + ") in a string");
        out.append(text_.data() + pos_, n);
        pos_ += n;
        continue;
      }
      // Backslash escape.
      const size_t esc = pos_;
      ++pos_;
      if (pos_ >= text_.size()) fail(open, "unterminated string");
      const char e = text_[pos_++];
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
          uint32_t cp = parse_hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail(esc, "unpaired low surrogate in a \\u escape");
          }
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            // A high surrogate must be followed by an escaped low surrogate; together they are
            // one code point above U+FFFF.
            if (text_.compare(pos_, 2, "\\u") != 0) {
              fail(esc, "high surrogate in a \\u escape not followed by a low surrogate");
            }
            const size_t esc2 = pos_;
            pos_ += 2;
            const uint32_t lo = parse_hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) {
              fail(esc2, "high surrogate in a \\u escape not followed by a low surrogate");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          fail(esc, std::string("invalid escape '\\") +
                        (e >= 0x20 && e < 0x7F ? std::string(1, e) : std::string("?")) + "'");
      }
    }
  }

  Value parse_number() {
    const size_t start = pos_;
    auto digit = [&](size_t i) { return i < text_.size() && text_[i] >= '0' && text_[i] <= '9'; };
    if (text_[pos_] == '-') ++pos_;
    if (!digit(pos_)) fail(pos_, "invalid number: expected a digit");
    if (text_[pos_] == '0') {
      ++pos_;
      if (digit(pos_)) fail(pos_, "invalid number: leading zero");
    } else {
      while (digit(pos_)) ++pos_;
    }
    bool integral = true;
    if (pos_ < text_.size() && text_[pos_] == '.') {
      integral = false;
      ++pos_;
      if (!digit(pos_)) fail(pos_, "invalid number: expected a digit after '.'");
      while (digit(pos_)) ++pos_;
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      integral = false;
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (!digit(pos_)) fail(pos_, "invalid number: expected a digit in the exponent");
      while (digit(pos_)) ++pos_;
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    if (integral) {
      int64_t i = 0;
      auto [p, ec] = std::from_chars(first, last, i);
      if (ec == std::errc() && p == last) return Value::integer(i);
      // Out of int64 range: keep it as a double (like JavaScript would), not as an error.
    }
    double d = 0;
    auto [p, ec] = std::from_chars(first, last, d);
    if (ec == std::errc::result_out_of_range) {
      // from_chars reports underflow and overflow alike; strtod tells them apart (the grammar
      // above already fixed the syntax, and '.' is the decimal point in the C locale we run in).
      d = std::strtod(std::string(first, last).c_str(), nullptr);
      if (std::isinf(d)) fail(start, "number out of range");
      return Value::number(d);
    }
    if (ec != std::errc() || p != last) fail(start, "invalid number");
    return Value::number(d);
  }

  std::string_view text_;
  std::string_view source_;
  size_t pos_ = 0;
};

void dump_to(std::string& out, const Value& v) {
  switch (v.type()) {
    case Value::Type::kNull: out += "null"; return;
    case Value::Type::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Type::kNumber: {
      if (v.is_integer()) {
        out += std::to_string(v.as_int());
        return;
      }
      const double d = v.as_double();
      if (!std::isfinite(d)) {
        out += "null";  // JSON has no NaN/Inf; null is what JavaScript writes too.
        return;
      }
      char buf[64];
      auto [p, ec] = std::to_chars(buf, buf + sizeof buf, d);  // shortest round-trip form
      std::string_view s(buf, p - buf);
      out += s;
      // Keep doubles recognisable as non-integers on re-read ("1.0" rather than "1").
      if (s.find_first_of(".eEn") == std::string_view::npos) out += ".0";
      return;
    }
    case Value::Type::kString: out += quote(v.as_string()); return;
    case Value::Type::kArray: {
      out += '[';
      bool first = true;
      for (const Value& item : v.as_array()) {
        if (!first) out += ',';
        first = false;
        dump_to(out, item);
      }
      out += ']';
      return;
    }
    case Value::Type::kObject: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : v.as_object()) {
        if (!first) out += ',';
        first = false;
        out += quote(key);
        out += ':';
        dump_to(out, item);
      }
      out += '}';
      return;
    }
  }
}

}  // namespace

Value parse(std::string_view text, std::string_view source) {
  return Parser(text, source).parse_document();
}

std::string quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7F) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;  // UTF-8 passes through unchanged
        }
    }
  }
  out += '"';
  return out;
}

std::string dump(const Value& v) {
  std::string out;
  dump_to(out, v);
  return out;
}

}  // namespace gpt2::json
