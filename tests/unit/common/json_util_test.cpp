#include "common/json_util.h"

#include <gtest/gtest.h>

namespace tp::json_util {
namespace {

TEST(JsonUtil, ParseObjectRejectsMalformedAndNonObjects) {
  EXPECT_EQ(parse_object("{").error().code, Code::kInvalidArgument);
  EXPECT_EQ(parse_object("[1]").error().code, Code::kInvalidArgument);
  EXPECT_EQ(parse_object("").error().code, Code::kInvalidArgument);
  EXPECT_TRUE(parse_object("{\"a\":1}").has_value());
}

TEST(JsonUtil, IntegersAreRangeCheckedAndNamed) {
  auto o = *parse_object(R"({"m": 8, "s": "x", "f": 1.5, "big": 99999999999999999999})");
  EXPECT_EQ(*get_int(o, "missing", 7, 0, 10), 7);
  auto low = get_int(o, "m", 0, 16, 100);
  ASSERT_FALSE(low);
  EXPECT_NE(low.error().context.find("'m'"), std::string::npos);
  EXPECT_FALSE(get_int(o, "s", 0, 0, 10));
  EXPECT_FALSE(get_int(o, "f", 0, 0, 10));
  EXPECT_FALSE(get_int(o, "big", 0, 0, 1000));
}

TEST(JsonUtil, UnknownKeysAreRefused) {
  auto o = *parse_object(R"({"image": "host", "memroy_mb": 5})");
  auto r = only_keys(o, {"image", "memory_mb"});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().context.find("memroy_mb"), std::string::npos);
}

TEST(JsonUtil, CommandIsArgvOrShellString) {
  auto o = *parse_object(R"({"a": ["ls", "-l"], "s": "echo hi", "e": [], "n": [1], "z": ""})");
  EXPECT_EQ(*get_command(o, "a"), (std::vector<std::string>{"ls", "-l"}));
  EXPECT_EQ(*get_command(o, "s"), (std::vector<std::string>{"/bin/sh", "-c", "echo hi"}));
  EXPECT_FALSE(get_command(o, "e"));
  EXPECT_FALSE(get_command(o, "n"));
  EXPECT_FALSE(get_command(o, "z"));
  EXPECT_FALSE(get_command(o, "missing"));
}

TEST(JsonUtil, Base64RoundTripsEveryByte) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  for (size_t n : {0, 1, 2, 3, 256}) {
    auto back = base64_decode(base64_encode(all.substr(0, n)));
    ASSERT_TRUE(back) << n;
    EXPECT_EQ(*back, all.substr(0, n));
  }
  EXPECT_FALSE(base64_decode("!!!!"));
  EXPECT_FALSE(base64_decode("QUJD=QUJD"));
}

}  // namespace
}  // namespace tp::json_util
