// Regression (found by fuzz/http_fuzz): an error answer echoing a request path with
// invalid UTF-8 ("GET /\xff...") was not valid JSON, so clients could not parse it.
// Every JSON answer now goes through json_util::serialize_utf8.
#include <gtest/gtest.h>

#include <boost/json.hpp>

#include "api/http_server.h"
#include "common/json_util.h"

namespace tp {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(ToValidUtf8, KeepsValidAndReplacesInvalidBytes) {
  using json_util::to_valid_utf8;
  EXPECT_EQ(to_valid_utf8("plain /path"), "plain /path");
  std::string multi = "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80";  // é € 😀
  EXPECT_EQ(to_valid_utf8(multi), multi);
  EXPECT_EQ(to_valid_utf8("a\xFF"
                          "b"),
            "a" + kFffd + "b");
  EXPECT_EQ(to_valid_utf8("\xC0\xAF"), kFffd + kFffd);                          // overlong '/'
  EXPECT_EQ(to_valid_utf8("\xED\xA0\x80"), kFffd + kFffd + kFffd);              // surrogate
  EXPECT_EQ(to_valid_utf8("\xE2\x82"), kFffd + kFffd);                          // truncated
  EXPECT_EQ(to_valid_utf8("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // > U+10FFFF
  EXPECT_EQ(to_valid_utf8(std::string("\0x", 2)), std::string("\0x", 2));
}

TEST(SerializeUtf8, AnswerAlwaysParses) {
  boost::json::object o;
  o["message"] = "no route GET /\xFF\xFE";
  o["list"] = boost::json::array{"ok", "bad\x80"};
  o["na\xFFme"] = 1;
  std::string text = json_util::serialize_utf8(o);
  boost::system::error_code ec;
  auto v = boost::json::parse(text, ec);
  ASSERT_FALSE(ec) << text;
  EXPECT_EQ(v.at("message").as_string(), "no route GET /" + kFffd + kFffd);
  EXPECT_EQ(v.at("list").as_array()[1].as_string(), "bad" + kFffd);
  EXPECT_TRUE(v.as_object().contains("na" + kFffd + "me"));
  // Valid input is serialized exactly as boost::json does.
  boost::json::object ok{{"a", "\xC3\xA9"}};
  EXPECT_EQ(json_util::serialize_utf8(ok), boost::json::serialize(ok));
}

class Capture : public api::Responder {
 public:
  void send(int s, std::string ct, std::string b) override {
    status = s;
    content_type = std::move(ct);
    body = std::move(b);
  }
  void start_stream(int, std::string) override {}
  void write_chunk(std::string) override {}
  void end_stream() override {}
  void abort_stream() override {}
  void set_on_abort(std::function<void()>) override {}
  void add_header(std::string, std::string) override {}
  int status = 0;
  std::string content_type, body;
};

TEST(ResponderSendError, InvalidUtf8InMessageStillGivesJson) {
  Capture c;
  c.send_error(Error{Code::kNotFound, 0,
                     "no route GET /\xFF\xFF"
                     "health"});
  EXPECT_EQ(c.status, 404);
  EXPECT_EQ(c.content_type, "application/json");
  boost::system::error_code ec;
  auto v = boost::json::parse(c.body, ec);
  ASSERT_FALSE(ec) << c.body;
  EXPECT_EQ(v.at("code").as_string(), "not_found");
  EXPECT_EQ(v.at("message").as_string(), "no route GET /" + kFffd + kFffd + "health");
}

}  // namespace
}  // namespace tp
