// CountingResponder (api/counting_responder.h): counts statuses, reports the request's
// end, and forwards the rest, run_on_connection included.
#include "api/counting_responder.h"

#include <gtest/gtest.h>

#include <vector>

namespace tp::api {
namespace {

// A connection that keeps what reaches it, and queues what is to run on it.
struct Connection : Responder {
  std::vector<std::string> calls;
  std::vector<std::function<void()>> queued;
  void send(int s, std::string, std::string b) override {
    calls.push_back("send " + std::to_string(s) + " " + b);
  }
  void start_stream(int s, std::string) override { calls.push_back("start " + std::to_string(s)); }
  void write_chunk(std::string d) override { calls.push_back("chunk " + d); }
  void end_stream() override { calls.push_back("end"); }
  void abort_stream() override { calls.push_back("abort"); }
  void set_on_abort(std::function<void()>) override { calls.push_back("on_abort"); }
  void add_header(std::string n, std::string v) override { calls.push_back(n + ": " + v); }
  void run_on_connection(std::function<void()> fn) override { queued.push_back(std::move(fn)); }
};

TEST(CountingResponder, RunsWhatIsForTheConnectionOnTheConnection) {
  auto conn = std::make_shared<Connection>();
  Metrics m;
  CountingResponder r(conn, m);
  bool ran = false;
  r.run_on_connection([&] { ran = true; });
  EXPECT_FALSE(ran);  // not on the calling thread (the step log would sync there)
  ASSERT_EQ(conn->queued.size(), 1u);
  conn->queued[0]();
  EXPECT_TRUE(ran);
}

TEST(CountingResponder, CountsStatusesForwardsAnswersAndReportsTheEnd) {
  auto conn = std::make_shared<Connection>();
  Metrics m;
  int ended = 0;
  {
    auto r = std::make_shared<CountingResponder>(conn, m, [&] { ended++; });
    r->add_header("X-A", "1");
    r->send(404, "application/json", "{}");
    r->start_stream(200, "text/plain");
    r->write_chunk("a");
    bool written = false;
    r->write_chunk("b", [&](bool w) { written = w; });
    r->end_stream();
    r->abort_stream();
    r->set_on_abort([] {});
    EXPECT_TRUE(written);
    EXPECT_EQ(ended, 0);
  }
  EXPECT_EQ(ended, 1);
  EXPECT_EQ(conn->calls, (std::vector<std::string>{"X-A: 1", "send 404 {}", "start 200", "chunk a",
                                                   "chunk b", "end", "abort", "on_abort"}));
  const std::string text = m.render();
  EXPECT_NE(text.find("tidepool_http_requests_total{code=\"404\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("tidepool_http_requests_total{code=\"200\"} 1"), std::string::npos) << text;
}

}  // namespace
}  // namespace tp::api
