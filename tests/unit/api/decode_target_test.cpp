// decode_target: how the server (and the HTTP fuzz harness) turns a request target into
// a decoded path and query parameters.
#include <gtest/gtest.h>

#include "api/http_server.h"

namespace tp::api {
namespace {

Request decoded(std::string target) {
  Request r;
  r.target = std::move(target);
  decode_target(r);
  return r;
}

TEST(DecodeTargetTest, PathAndRepeatedQueryParameters) {
  auto r = decoded("/v1/sand%62oxes?label=job%3Da&label=role+b&state=running&flag&=dropped&&x=");
  EXPECT_EQ(r.path, "/v1/sandboxes");
  auto [b, e] = r.query.equal_range("label");
  std::vector<std::string> labels;
  for (auto it = b; it != e; ++it) labels.push_back(it->second);
  EXPECT_EQ(labels, (std::vector<std::string>{"job=a", "role b"}));
  ASSERT_NE(r.q("state"), nullptr);
  EXPECT_EQ(*r.q("state"), "running");
  ASSERT_NE(r.q("flag"), nullptr);
  EXPECT_EQ(*r.q("flag"), "");
  EXPECT_EQ(*r.q("x"), "");
  EXPECT_EQ(r.query.count(""), 0u);  // an empty key is dropped
  EXPECT_EQ(r.query.size(), 5u);
}

TEST(DecodeTargetTest, PlusIsASpaceOnlyInTheQuery) {
  auto r = decoded("/files/a+b?path=/tmp/a+b");
  EXPECT_EQ(r.path, "/files/a+b");
  EXPECT_EQ(*r.q("path"), "/tmp/a b");
}

TEST(DecodeTargetTest, NoQueryAndReuseClearsTheOldOne) {
  Request r;
  r.target = "/a?b=c";
  decode_target(r);
  r.target = "/health";
  decode_target(r);
  EXPECT_EQ(r.path, "/health");
  EXPECT_TRUE(r.query.empty());
}

}  // namespace
}  // namespace tp::api
