#include "api/step_summary.h"

#include <gtest/gtest.h>

#include "common/json_util.h"

namespace tp::api {
namespace {

TEST(StepSummary, AnExecAnswerInAFewFields) {
  std::string out(100000, 'x');  // a big output is counted, never copied
  std::string body = R"({"exit_code":2,"signal":0,"duration":0.25,"timed_out":false,"stdout":")" +
                     json_util::base64_encode(out) + R"(","stderr":")" +
                     json_util::base64_encode("e") + R"("})";
  EXPECT_EQ(
      summarize_json(body),
      R"({"exit_code":2,"signal":0,"duration":2.5E-1,"timed_out":false,"stdout_bytes":100000,"stderr_bytes":1})");
}

TEST(StepSummary, NestedObjectsOneLevelDownArraysLeftOutLongStringsCut) {
  std::string body =
      R"({"pid":3,"cmd":["a","b"],"state":"exited","result":{"exit_code":0,"deep":{"x":1}},)"
      R"("message":")" +
      std::string(400, 'm') + R"("})";
  auto s = summarize_json(body);
  EXPECT_NE(s.find(R"("pid":3)"), std::string::npos) << s;
  EXPECT_NE(s.find(R"("result":{"exit_code":0})"), std::string::npos) << s;
  EXPECT_EQ(s.find("cmd"), std::string::npos) << s;
  EXPECT_EQ(s.find("deep"), std::string::npos) << s;
  EXPECT_NE(s.find(std::string(300, 'm') + "..."), std::string::npos);
  EXPECT_EQ(summarize_json("not json"), "");
  EXPECT_EQ(summarize_json("[1,2]"), "");
  EXPECT_EQ(summarize_json(R"({"code":"conflict","message":"sandbox x is stopped"})"),
            R"({"code":"conflict","message":"sandbox x is stopped"})");
}

TEST(StepSummary, AnExecStreamCountsItsOutputAndKeepsItsExit) {
  StreamSummary s;
  s.feed(R"({"type":"started","pid":4})"
         "\n");
  s.feed(R"({"type":"stdout","data":")" + json_util::base64_encode("hello") +
         R"("})"
         "\n" +
         R"({"type":"stderr","data":")" + json_util::base64_encode("ab") +
         R"("})"
         "\n");
  s.feed(R"({"type":"exit","exit_code":0,"signal":0,"timed_out":false})"
         "\n");
  EXPECT_EQ(
      s.json(),
      R"({"type":"exit","exit_code":0,"signal":0,"timed_out":false,"stdout_bytes":5,"stderr_bytes":2})");
}

}  // namespace
}  // namespace tp::api
