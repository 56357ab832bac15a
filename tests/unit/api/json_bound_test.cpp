// Request bodies are parsed within memory proportional to their size
// (json_util::parse_bounded): dense arrays and deep nesting fail early and cleanly.
#include <gtest/gtest.h>

#include <string>

#include "common/json_util.h"

namespace tp::json_util {
namespace {

std::string zeros_array(size_t n) {
  std::string s = "[";
  for (size_t i = 0; i < n; ++i) s += i ? ",0" : "0";
  return s + "]";
}

TEST(JsonBound, BudgetGrowsWithTheTextAndIsCapped) {
  ParseLimits l;
  EXPECT_EQ(l.budget(0), l.slack_bytes);
  EXPECT_EQ(l.budget(1000), 1000 * l.bytes_per_input_byte + l.slack_bytes);
  EXPECT_EQ(l.budget(size_t{1} << 40), l.max_budget_bytes);
  EXPECT_EQ(l.budget(SIZE_MAX), l.max_budget_bytes);  // no overflow
}

TEST(JsonBound, OrdinaryBodiesParse) {
  std::string labels = R"({"image":"host","labels":{)";
  for (int i = 0; i < 2000; ++i)
    labels += (i ? "," : "") + std::string("\"k") + std::to_string(i) + "\":\"v\"";
  labels += "}}";
  auto o = parse_object(labels);
  ASSERT_TRUE(o) << o.error().message();
  EXPECT_EQ(o->at("labels").as_object().size(), 2000u);

  // A long string (base64 stdin) costs about its own size.
  std::string big = R"({"stdin":")" + std::string(3 << 20, 'A') + R"("})";
  auto b = parse_object(big);
  ASSERT_TRUE(b) << b.error().message();
  EXPECT_EQ(b->at("stdin").as_string().size(), size_t{3} << 20);
}

TEST(JsonBound, DenseArrayIsRefusedAsTooLarge) {
  // 2 bytes of text per element, 16+ bytes per parsed value: over the 8x budget.
  std::string body = R"({"labels":)" + zeros_array(200000) + "}";
  auto r = parse_object(body);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kPayloadTooLarge);
  EXPECT_NE(r.error().message().find("too many elements"), std::string::npos)
      << r.error().message();
}

TEST(JsonBound, SmallArraysFitTheSlack) {
  auto r = parse_bounded(zeros_array(100));
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->as_array().size(), 100u);
}

TEST(JsonBound, DeepNestingIsRefusedAsInvalid) {
  ParseLimits l;
  std::string deep(l.max_depth + 1, '[');
  deep += std::string(l.max_depth + 1, ']');
  auto r = parse_bounded(deep);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kInvalidArgument);
  EXPECT_NE(r.error().message().find("nested deeper"), std::string::npos) << r.error().message();

  std::string ok(l.max_depth, '[');
  ok += std::string(l.max_depth, ']');
  EXPECT_TRUE(parse_bounded(ok));

  // Deep nesting is cut long before it costs anything, however long the text.
  std::string huge(1 << 20, '[');
  EXPECT_EQ(parse_bounded(huge).error().code, Code::kInvalidArgument);
}

TEST(JsonBound, TheResultOutlivesTheBudget) {
  // The value is handed back on the default heap: it can be kept, copied and grown.
  auto o = parse_object(R"({"a":[1,2,3],"s":"a string longer than the small buffer"})");
  ASSERT_TRUE(o);
  boost::json::object copy = *o;
  copy["more"] = boost::json::array(10000, 0);
  EXPECT_EQ(copy.at("a").as_array().size(), 3u);
  EXPECT_EQ(o->storage().get(), boost::json::storage_ptr().get());
}

TEST(JsonBound, CustomLimitsApply) {
  ParseLimits tight;
  tight.slack_bytes = 0;
  tight.bytes_per_input_byte = 1;
  EXPECT_EQ(parse_bounded("[1,2,3,4,5,6,7,8]", tight).error().code, Code::kPayloadTooLarge);
  ParseLimits shallow;
  shallow.max_depth = 2;
  EXPECT_TRUE(parse_bounded("[[1]]", shallow));
  EXPECT_EQ(parse_bounded("[[[1]]]", shallow).error().code, Code::kInvalidArgument);
}

TEST(JsonBound, MalformedTextIsStillInvalid) {
  EXPECT_EQ(parse_bounded("{\"a\":").error().code, Code::kInvalidArgument);
  EXPECT_EQ(parse_bounded("[1,]").error().code, Code::kInvalidArgument);
  EXPECT_EQ(parse_object("[]").error().code, Code::kInvalidArgument);
}

}  // namespace
}  // namespace tp::json_util
