// Tests for src/base/json.h: valid documents, escapes, exact integers, error positions.
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

TEST(Json, ParsesScalars) {
  EXPECT_TRUE(parse("null", "t").is_null());
  EXPECT_TRUE(parse(" true ", "t").as_bool());
  EXPECT_FALSE(parse("\tfalse\n", "t").as_bool());
  EXPECT_EQ(parse("\"hi\"", "t").as_string(), "hi");
  EXPECT_DOUBLE_EQ(parse("-1.5e2", "t").as_double(), -150.0);
  EXPECT_DOUBLE_EQ(parse("0.25", "t").as_double(), 0.25);
  EXPECT_FALSE(parse("0.25", "t").is_integer());
  EXPECT_TRUE(parse("-0", "t").is_integer());
}

TEST(Json, IntegersAreExactInInt64) {
  EXPECT_EQ(parse("9223372036854775807", "t").as_int(), INT64_MAX);
  EXPECT_EQ(parse("-9223372036854775808", "t").as_int(), INT64_MIN);
  EXPECT_EQ(parse("9007199254740993", "t").as_int(), 9007199254740993LL);  // 2^53 + 1
  // Beyond int64 the value is kept as a double, not an integer.
  Value big = parse("9223372036854775808", "t");
  EXPECT_TRUE(big.is_number());
  EXPECT_FALSE(big.is_integer());
  EXPECT_THROW(big.as_int(), UserError);
  // Integral doubles are accepted by as_int, fractional ones are not.
  EXPECT_EQ(parse("1e3", "t").as_int(), 1000);
  EXPECT_THROW(parse("1.5", "t").as_int("lr"), UserError);
}

TEST(Json, ObjectsKeepFileOrderAndLookup) {
  Value v = parse(R"({"b": 1, "a": [1, 2, {"c": null}], "z": {}, "e": []})", "t");
  const auto& obj = v.as_object();
  ASSERT_EQ(obj.size(), 4u);
  EXPECT_EQ(obj[0].first, "b");
  EXPECT_EQ(obj[1].first, "a");
  EXPECT_EQ(obj[2].first, "z");
  EXPECT_EQ(v.at("b").as_int(), 1);
  EXPECT_EQ(v.at("a").as_array().size(), 3u);
  EXPECT_TRUE(v.at("a").as_array()[2].at("c").is_null());
  EXPECT_EQ(v.find("missing"), nullptr);
  EXPECT_TRUE(v.at("z").as_object().empty());
  EXPECT_TRUE(v.at("e").as_array().empty());
  try {
    v.at("nope", "config");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "missing key 'nope' in config");
  }
}

TEST(Json, TypeErrorsNameWhat) {
  Value v = parse("[1]", "t");
  try {
    v.as_string("train.lr");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("train.lr"), std::string::npos);
  }
  EXPECT_THROW(v.as_object(), UserError);
  EXPECT_THROW(v.as_bool(), UserError);
}

TEST(Json, StringEscapes) {
  EXPECT_EQ(parse(R"("a\"b\\c\/d\b\f\n\r\t")", "t").as_string(), "a\"b\\c/d\b\f\n\r\t");
  EXPECT_EQ(parse(R"("\u0041\u00e9\u65e5")", "t").as_string(), "A\xC3\xA9\xE6\x97\xA5");
  EXPECT_EQ(parse(R"("\u0000")", "t").as_string(), std::string(1, '\0'));
  // Surrogate pair -> one 4-byte UTF-8 code point (U+1F680 rocket).
  EXPECT_EQ(parse(R"("\ud83d\ude80")", "t").as_string(), "\xF0\x9F\x9A\x80");
  EXPECT_EQ(parse(R"("\uD834\uDD1E")", "t").as_string(), "\xF0\x9D\x84\x9E");
  // Raw UTF-8 passes through.
  EXPECT_EQ(parse("\"caf\xC3\xA9 \xF0\x9F\x94\xA5\"", "t").as_string(), "caf\xC3\xA9 \xF0\x9F\x94\xA5");
}

TEST(Json, ErrorPositions) {
  EXPECT_EQ(parse_error("{\"a\": 1,\n  \"b\" 2}"),
            "doc.json: line 2, column 7: unexpected character '2', expected ':' after an object key");
  EXPECT_EQ(parse_error(""), "doc.json: line 1, column 1: unexpected end of input, expected a value");
  EXPECT_EQ(parse_error("[1, 2"), "doc.json: line 1, column 6: unexpected end of input, expected ',' or ']' in an array");
  EXPECT_EQ(parse_error("[1,]"), "doc.json: line 1, column 4: unexpected character ']', expected a value");
  EXPECT_EQ(parse_error("{} x"), "doc.json: line 1, column 4: unexpected character 'x' after the JSON value");
  EXPECT_EQ(parse_error("\"abc"), "doc.json: line 1, column 1: unterminated string");
  EXPECT_EQ(parse_error("[\"a\\qb\"]"), "doc.json: line 1, column 4: invalid escape '\\q'");
  // Columns count code points: "é" is one column.
  EXPECT_EQ(parse_error("\"\xC3\xA9\" ?"), "doc.json: line 1, column 5: unexpected character '?' after the JSON value");
  EXPECT_EQ(parse_error("\n\n   tru"), "doc.json: line 3, column 7: invalid literal, expected 'true'");
}

TEST(Json, RejectsInvalidDocuments) {
  for (const char* bad : {"01", "1.", ".5", "-", "1e", "+1", "NaN", "[1 2]", "{\"a\":1,}", "{a:1}",
                          "'x'", "\"tab\there\"", "\"\\u12\"", "\"\\u12G4\"", "\"\\ud800\"",
                          "\"\\ud800\\u0041\"", "\"\\udc00\"", "\"\xFF\"", "\"\xC0\xAF\"",
                          "\"\xED\xA0\x80\"", "1e999", "[", "{", "nul", "truex"}) {
    std::string msg = parse_error(bad);
    EXPECT_NE(msg, "") << "accepted: " << bad;
    EXPECT_EQ(msg.rfind("doc.json: line ", 0), 0u) << msg;
  }
  EXPECT_NE(parse_error("\"\\ud800\"").find("surrogate"), std::string::npos);
  EXPECT_NE(parse_error(std::string(600, '[')).find("nesting"), std::string::npos);
}

TEST(Json, QuoteAndDumpRoundTrip) {
  EXPECT_EQ(quote("a\"b\\\n\x01 \xC3\xA9"), "\"a\\\"b\\\\\\n\\u0001 \xC3\xA9\"");
  Value v = Value::object({{"s", Value::string("x\ty")},
                           {"i", Value::integer(-9007199254740993LL)},
                           {"d", Value::number(0.1)},
                           {"w", Value::number(2.0)},
                           {"a", Value::array({Value::boolean(true), Value::null()})}});
  std::string text = dump(v);
  EXPECT_EQ(text, R"({"s":"x\ty","i":-9007199254740993,"d":0.1,"w":2.0,"a":[true,null]})");
  Value back = parse(text, "dump");
  EXPECT_EQ(back.at("i").as_int(), -9007199254740993LL);
  EXPECT_DOUBLE_EQ(back.at("d").as_double(), 0.1);
  EXPECT_FALSE(back.at("w").is_integer());
  EXPECT_EQ(dump(back), text);
}

}  // namespace
}  // namespace gpt2::json
