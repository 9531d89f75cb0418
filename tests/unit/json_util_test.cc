// ParseJson (runtime/common/json_util.h) builds its DOM from SAX events: it must equal nlohmann's own json::parse on
// every document (the second implementation here), refuse what json::parse refuses, and find a key given twice in
// any object, at any depth, while the same key in sibling objects is fine.
#include "runtime/common/json_util.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace eldr {
namespace {

TEST(ParseJson, EqualsNlohmannParseOnEveryDocument) {
  const std::vector<std::string> documents = {
      "null",
      "true",
      "-3",
      "18446744073709551615",
      "1.5e-3",
      R"("text \u00e9")",
      "[]",
      "{}",
      R"({"a": [1, 2, {"b": [[], {}, [3, {"c": null}]]}], "d": {"e": {"f": [true, false]}}})",
      R"([{"k": 1}, {"k": 2}, [{"k": [{"k": 3}]}]])",
      "\xEF\xBB\xBF{\"bom\": 1}",  // a UTF-8 byte order mark, skipped by both
      R"({"token_scores": {"0": {"0": 0.5, "1": 0.25}, "1": {"0": 1, "1": 0}}})",
  };
  for (const std::string& text : documents) {
    auto parsed = ParseJson(text);
    ASSERT_TRUE(parsed.ok()) << text << ": " << parsed.status().message();
    EXPECT_EQ(parsed.value(), nlohmann::json::parse(text)) << text;
    EXPECT_EQ(parsed.value().dump(), nlohmann::json::parse(text).dump()) << text;  // the same types too
  }
}

TEST(ParseJson, RefusesWhatNlohmannRefuses) {
  for (const std::string text : {"", " ", "{", "[1,]", "{\"a\" 1}", "1 2", "{} x", "// c\n1", "[1e400]", "\"\xff\""}) {
    auto parsed = ParseJson(text);
    EXPECT_FALSE(parsed.ok()) << text;
    EXPECT_FALSE(nlohmann::json::accept(text)) << text;
    if (!parsed.ok()) {
      EXPECT_EQ(parsed.status().message().rfind("not valid JSON (", 0), 0u) << parsed.status().message();
      // The library's internal exception name is not shown ("[json.exception.parse_error.101] parse error ...").
      EXPECT_EQ(parsed.status().message().find("json.exception"), std::string::npos) << parsed.status().message();
    }
  }
}

TEST(JsonErrorText, DropsTheLibrarysExceptionNameOnly) {
  try {
    (void)nlohmann::json::object().at("kind");
    ADD_FAILURE() << "at() of a missing key did not throw";
  } catch (const nlohmann::json::exception& e) {
    EXPECT_EQ(JsonErrorText(e), "key 'kind' not found") << e.what();
  }
  EXPECT_EQ(JsonErrorText(std::runtime_error("[json.exception. is not a prefix")), "[json.exception. is not a prefix");
  EXPECT_EQ(JsonErrorText(std::runtime_error("seconds must be > 0")), "seconds must be > 0");
}

TEST(ParseJson, FindsAKeyGivenTwiceAtAnyDepth) {
  const std::vector<std::pair<std::string, std::string>> twice = {
      {R"({"a": 1, "a": 2})", "a"},
      {R"({"x": {"b": 1, "c": 2, "b": 3}})", "b"},
      {R"([{"k": 1}, {"k": 2, "z": {"q": 0, "q": 1}}])", "q"},
      {R"({"outer": {"in": 1}, "outer": 2})", "outer"},
  };
  for (const auto& [text, key] : twice) {
    auto parsed = ParseJson(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().message(), "duplicate key \"" + key + "\" in a JSON object");
  }
  // The same key in sibling and nested objects is not a duplicate.
  EXPECT_TRUE(ParseJson(R"({"a": {"a": {"a": 1}}, "b": {"a": 2}, "c": [{"a": 3}, {"a": 4}]})").ok());
}

}  // namespace
}  // namespace eldr
