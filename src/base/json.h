#pragma once
// JSON through nlohmann-json (json::Value is nlohmann::json), plus what it lacks for messages that
// name the file and the key: parse() and the typed getters below.
// Contract: parse() accepts RFC 8259 JSON (UTF-8) and throws gpt2::UserError
// "<source>: line L, column C: <reason>" (columns count bytes) on anything else, numbers out of
// range included. Integers keep their exact int64/uint64 value. The getters throw gpt2::UserError
// "<what>: expected an integer, got a string" (or "missing key 'k' in <what>") instead of
// nlohmann's type errors. Objects are sorted by key (std::map); nothing here relies on file order.
// bench/json_bench.cpp measured why not ordered_json: it parses encoder.json some 60 times slower
// (bench/results/2026-12-02-json-cpu.log).
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace gpt2::json {

using Value = nlohmann::json;

// Parses one document (surrounding whitespace allowed). `source` names the file (or file:line).
// Duplicate keys in an object: the last one wins (as Python's json), or with kReject a
// gpt2::UserError "<source>: duplicate key 'k'" (formats where a repeat means a damaged file).
enum class DuplicateKeys { kLastWins, kReject };
Value parse(std::string_view text, std::string_view source, DuplicateKeys duplicates = DuplicateKeys::kLastWins);

// Typed access; gpt2::UserError naming `what` when the type differs. as_int also takes a double
// that holds an exact integer (1e3), never 1.5 or 1e300.
bool as_bool(const Value& v, std::string_view what);
double as_double(const Value& v, std::string_view what);
int64_t as_int(const Value& v, std::string_view what);
const std::string& as_string(const Value& v, std::string_view what);
const Value::array_t& as_array(const Value& v, std::string_view what);
const Value::object_t& as_object(const Value& v, std::string_view what);

// Object member: nullptr when absent or when `object` is not an object.
const Value* find(const Value& object, std::string_view key);
// Object member; gpt2::UserError "missing key '<key>' in <what>" when absent.
const Value& at(const Value& object, std::string_view key, std::string_view what);

// Serialises compactly; invalid UTF-8 in strings becomes U+FFFD instead of an exception.
std::string dump(const Value& v);
// A string as a JSON string literal (quotes included).
std::string quote(std::string_view s);

}  // namespace gpt2::json
