// Tests for src/base/json.h: nlohmann-json behind messages that name the source, the position and
// the key; exact integers; the depth limit.
#include "src/base/json.h"

#include <gtest/gtest.h>

#include <string>

#include "src/base/errors.h"

namespace gpt2::json {
namespace {

// The message of the UserError that parsing `text` throws ("" when it parses).
std::string parse_error(std::string_view text) {
  try {
    parse(text, "doc.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// The message of the UserError that `fn` throws ("" when it does not).
template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(Json, ParsesScalars) {
  EXPECT_TRUE(parse("null", "t").is_null());
  EXPECT_TRUE(as_bool(parse(" true ", "t"), "b"));
  EXPECT_FALSE(as_bool(parse("\tfalse\n", "t"), "b"));
  EXPECT_EQ(as_string(parse("\"hi\"", "t"), "s"), "hi");
  EXPECT_DOUBLE_EQ(as_double(parse("-1.5e2", "t"), "d"), -150.0);
  EXPECT_DOUBLE_EQ(as_double(parse("7", "t"), "d"), 7.0);
}

TEST(Json, IntegersAreExactInInt64) {
  EXPECT_EQ(as_int(parse("9223372036854775807", "t"), "i"), INT64_MAX);
  EXPECT_EQ(as_int(parse("-9223372036854775808", "t"), "i"), INT64_MIN);
  EXPECT_EQ(as_int(parse("9007199254740993", "t"), "i"), 9007199254740993LL);  // 2^53 + 1: not a double
  EXPECT_EQ(error_of([] { as_int(parse("9223372036854775808", "t"), "step"); }),
            "step: expected an integer, got 9223372036854775808");
  // Integral doubles are accepted, fractional and out-of-range ones are not.
  EXPECT_EQ(as_int(parse("1e3", "t"), "i"), 1000);
  EXPECT_EQ(error_of([] { as_int(parse("1.5", "t"), "lr"); }), "lr: expected an integer, got 1.5");
  EXPECT_THROW(as_int(parse("1e300", "t"), "i"), UserError);
}

TEST(Json, LookupNamesTheMissingKey) {
  const Value v = parse(R"({"b": 1, "a": [1, 2, {"c": null}], "z": {}, "e": []})", "t");
  EXPECT_EQ(as_object(v, "v").size(), 4u);
  EXPECT_EQ(as_int(at(v, "b", "v"), "b"), 1);
  EXPECT_EQ(as_array(at(v, "a", "v"), "a").size(), 3u);
  EXPECT_TRUE(at(as_array(at(v, "a", "v"), "a")[2], "c", "a[2]").is_null());
  EXPECT_EQ(find(v, "missing"), nullptr);
  EXPECT_EQ(find(parse("[1]", "t"), "b"), nullptr);  // not an object
  EXPECT_TRUE(as_object(at(v, "z", "v"), "z").empty());
  EXPECT_EQ(error_of([&] { at(v, "nope", "config"); }), "missing key 'nope' in config");
  EXPECT_EQ(error_of([] { at(parse("[1]", "t"), "nope", "config"); }), "config: expected an object, got an array");
}

TEST(Json, TypeErrorsNameWhat) {
  const Value v = parse("[1]", "t");
  EXPECT_EQ(error_of([&] { as_string(v, "train.lr"); }), "train.lr: expected a string, got an array");
  EXPECT_EQ(error_of([&] { as_object(v, "header"); }), "header: expected an object, got an array");
  EXPECT_EQ(error_of([&] { as_bool(v[0], "flag"); }), "flag: expected a boolean, got a number");
  EXPECT_EQ(error_of([] { as_array(parse("null", "t"), "shape"); }), "shape: expected an array, got null");
}

TEST(Json, StringEscapes) {
  EXPECT_EQ(as_string(parse(R"("a\"b\\c\/d\b\f\n\r\t")", "t"), "s"), "a\"b\\c/d\b\f\n\r\t");
  EXPECT_EQ(as_string(parse(R"("\u0041\u00e9\u65e5")", "t"), "s"), "A\xC3\xA9\xE6\x97\xA5");
  EXPECT_EQ(as_string(parse(R"("\u0000")", "t"), "s"), std::string(1, '\0'));
  // Surrogate pair -> one 4-byte UTF-8 code point (U+1F680 rocket).
  EXPECT_EQ(as_string(parse(R"("\ud83d\ude80")", "t"), "s"), "\xF0\x9F\x9A\x80");
  // Raw UTF-8 passes through.
  EXPECT_EQ(as_string(parse("\"caf\xC3\xA9 \xF0\x9F\x94\xA5\"", "t"), "s"), "caf\xC3\xA9 \xF0\x9F\x94\xA5");
}

TEST(Json, ErrorsNameSourceLineAndColumn) {
  // Columns count bytes from 1 at the byte where the parser stopped.
  EXPECT_EQ(parse_error("{\"a\": 1,\n  \"b\" 2}"),
            "doc.json: line 2, column 7: syntax error while parsing object separator - unexpected number literal; "
            "expected ':'");
  EXPECT_EQ(parse_error(""),
            "doc.json: line 1, column 1: syntax error while parsing value - unexpected end of input; expected '[', "
            "'{', or a literal");
  EXPECT_EQ(parse_error("[1, 2"),
            "doc.json: line 1, column 6: syntax error while parsing array - unexpected end of input; expected ']'");
  EXPECT_EQ(parse_error("\n\n   tru"),
            "doc.json: line 3, column 7: syntax error while parsing value - invalid literal; last read: "
            "'<U+000A><U+000A>   tru'");
  EXPECT_EQ(parse_error("1e999"), "doc.json: number overflow parsing '1e999'");
}

TEST(Json, RejectsInvalidDocuments) {
  for (const char* bad : {"01",          "1.",          ".5",           "-",
                          "1e",          "+1",          "NaN",          "[1 2]",
                          "{\"a\":1,}",  "{a:1}",       "'x'",          "\"tab\there\"",
                          "\"\\u12\"",   "\"\\u12G4\"", "\"\\ud800\"",  "\"\\ud800\\u0041\"",
                          "\"\\udc00\"", "\"\xFF\"",    "\"\xC0\xAF\"", "\"\xED\xA0\x80\"",
                          "[",           "{",           "nul",          "truex",
                          "{} x",        "\"abc"}) {
    const std::string msg = parse_error(bad);
    EXPECT_EQ(msg.rfind("doc.json: line ", 0), 0u) << "for " << bad << ": " << msg;
  }
  // Nesting is refused before parsing, where it starts to be too deep.
  EXPECT_EQ(parse_error(std::string(600, '[')), "doc.json: line 1, column 513: nesting deeper than 512");
  EXPECT_EQ(parse_error(std::string(512, '[') + std::string(512, ']')), "");
  EXPECT_EQ(parse_error("\"[[[" + std::string(600, '[') + "\""), "");  // brackets inside a string do not count
}

TEST(Json, DuplicateKeysLastWinsOrRejected) {
  EXPECT_EQ(as_int(at(parse(R"({"a": 1, "a": 2})", "t"), "a", "t"), "a"), 2);
  EXPECT_EQ(
      error_of([] { parse(R"({"w": {"a": 1, "b": 2}, "v": {"a": 3, "a": 4}})", "h.json", DuplicateKeys::kReject); }),
      "h.json: duplicate key 'a'");
  // The same key in different objects is no repeat.
  EXPECT_EQ(as_object(parse(R"({"w": {"a": 1}, "v": {"a": 3}, "a": 0})", "t", DuplicateKeys::kReject), "t").size(), 3u);
}

TEST(Json, QuoteAndDumpRoundTrip) {
  EXPECT_EQ(quote("a\"b\\\n\x01 \xC3\xA9"), "\"a\\\"b\\\\\\n\\u0001 \xC3\xA9\"");
  EXPECT_EQ(quote("bad \xFF byte"), "\"bad \xEF\xBF\xBD byte\"");  // U+FFFD, no exception
  const Value v = {{"s", "x\ty"}, {"i", -9007199254740993LL}, {"d", 0.1}, {"w", 2.0}, {"a", {true, nullptr}}};
  const std::string text = dump(v);
  EXPECT_EQ(text, R"({"a":[true,null],"d":0.1,"i":-9007199254740993,"s":"x\ty","w":2.0})");  // keys sorted
  const Value back = parse(text, "dump");
  EXPECT_EQ(as_int(at(back, "i", "back"), "i"), -9007199254740993LL);
  EXPECT_DOUBLE_EQ(as_double(at(back, "d", "back"), "d"), 0.1);
  EXPECT_EQ(dump(back), text);
}

}  // namespace
}  // namespace gpt2::json
