// Exec streams (api/exec_stream.h) and ExecControl against a responder whose
// socket the test drains by hand: output is granted back only once its event
// was written, so a client that stops reading stops the command's output at
// the agent's window; an agent that ignores windows is cut off; failures
// before the first event keep their status.
#include "api/exec_stream.h"

#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <random>

#include "slow_responder.h"

namespace tp::api {
namespace {

using testing::exited;
using testing::FakeExec;
using testing::SlowResponder;

std::vector<boost::json::object> events(const std::string& body) {
  std::vector<boost::json::object> out;
  size_t i = 0;
  while (i < body.size()) {
    size_t j = body.find('\n', i);
    out.push_back(boost::json::parse(body.substr(i, j - i)).as_object());
    i = j + 1;
  }
  return out;
}

// A stream attached to exec 9 of a fake agent, with its responder and callbacks.
struct Attached {
  FakeExec e{9};
  std::shared_ptr<SlowResponder> res = std::make_shared<SlowResponder>();
  std::shared_ptr<ExecStream> s = std::make_shared<ExecStream>(res, e.fns());
  node::ExecCallbacks cb = s->callbacks();
  Attached() { s->attach(9); }
};

TEST(ExecControl, HoldsCreditsAndAKillUntilAttached) {
  FakeExec e{9};
  ExecControl c(e.fns());
  c.credit(10);
  c.credit(5);
  EXPECT_EQ(e.credited, 0u);
  c.attach(9);
  EXPECT_EQ(e.credited, 15u);
  c.credit(1);
  EXPECT_EQ(e.credited, 16u);
  FakeExec k{9};
  ExecControl c2(k.fns());
  c2.credit(10);
  c2.kill();
  c2.attach(9);
  EXPECT_EQ(k.kills, 1);
  EXPECT_EQ(k.credited, 0u) << "a kill wanted before attach wins over credits";
}

TEST(ExecStream, TheEpilogueIsTheLastEventAfterTheExitOrTheError) {
  for (bool failed : {false, true}) {
    Attached a;
    auto& [e, res, s, cb] = a;
    cb.on_started(2);
    s->set_epilogue(boost::json::object{{"type", "removed"}});
    if (failed)
      cb.on_done(std::unexpected(Error{Code::kUnavailable, 0, "agent gone"}));
    else
      cb.on_done(exited(0));
    cb.on_output(1, "late");  // after the end: dropped
    res->drain_all();
    EXPECT_TRUE(res->ended);
    auto ev = events(res->body);
    ASSERT_EQ(ev.size(), 3u) << res->body;
    EXPECT_EQ(ev[1].at("type"), failed ? "error" : "exit");
    EXPECT_EQ(ev[2].at("type"), "removed");
  }
}

TEST(ExecStream, EventsInOrderAndOutputCreditedOnlyOnceWritten) {
  Attached a;
  auto& [e, res, s, cb] = a;
  cb.on_started(42);
  cb.on_output(1, "hello");
  cb.on_output(2, "oops");
  EXPECT_TRUE(res->streaming);
  EXPECT_EQ(res->content_type, "application/x-ndjson");
  EXPECT_EQ(e.credited, 0u) << "nothing written yet";
  res->drain_one();  // started: no output bytes
  EXPECT_EQ(e.credited, 0u);
  res->drain_one();
  EXPECT_EQ(e.credited, 5u);
  res->drain_one();
  EXPECT_EQ(e.credited, 9u);
  cb.on_done(exited(3));
  res->drain_all();
  EXPECT_TRUE(res->ended);
  auto ev = events(res->body);
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0].at("type"), "started");
  EXPECT_EQ(ev[0].at("pid"), 42);
  EXPECT_EQ(ev[1].at("type"), "stdout");
  EXPECT_EQ(ev[1].at("data"), "aGVsbG8=");
  EXPECT_EQ(ev[2].at("type"), "stderr");
  EXPECT_EQ(ev[3].at("type"), "exit");
  EXPECT_EQ(ev[3].at("exit_code"), 3);
  EXPECT_EQ(e.kills, 0);
}

TEST(ExecStream, ASlowClientHoldsAtMostOneWindow) {
  // The agent sends no more than the window minus what is not credited back:
  // modelled here as the fake command producing only while it has credit.
  FakeExec e{9};
  auto res = std::make_shared<SlowResponder>();
  res->keep_body = false;
  auto s = std::make_shared<ExecStream>(res, e.fns());
  auto cb = s->callbacks();
  s->attach(9);
  std::mt19937 rng(7);
  const std::string piece(4096, 'x');
  uint64_t sent = 0;
  for (int step = 0; step < 20000; ++step) {
    bool produce = rng() % 3 != 0;
    if (produce && sent + piece.size() <= ExecStream::kWindow + e.credited) {
      cb.on_output(1, piece);
      sent += piece.size();
    } else if (rng() % 4 == 0) {
      res->drain_one();
    }
  }
  res->drain_all();
  EXPECT_GT(sent, 16 * ExecStream::kWindow) << "output went on as the client read";
  EXPECT_EQ(e.credited, sent);
  // Base64 and JSON: ~1.37x the raw bytes of one window, never more.
  EXPECT_LE(res->max_queued_bytes, ExecStream::kWindow * 3 / 2);
  EXPECT_EQ(s->unwritten(), 0u);
}

TEST(ExecStream, AnAgentThatIgnoresTheWindowIsCutOffAndKilled) {
  Attached a;
  auto& [e, res, s, cb] = a;
  const std::string piece(64 << 10, 'x');
  for (int i = 0; i < 200; ++i) cb.on_output(1, piece);  // 12.5 MiB, never read
  EXPECT_TRUE(res->aborted);
  EXPECT_EQ(e.kills, 1);
  EXPECT_LE(res->queued_bytes, ExecStream::kMaxUnwritten);
  cb.on_done(exited(0));  // after the cut: nothing more is written
  EXPECT_FALSE(res->ended);
}

TEST(ExecStream, FailureBeforeTheFirstEventKeepsItsStatus) {
  FakeExec e{9};
  auto res = std::make_shared<SlowResponder>();
  auto s = std::make_shared<ExecStream>(res, e.fns());
  auto cb = s->callbacks();
  cb.on_done(std::unexpected(Error{Code::kNotFound, 0, "no such sandbox"}));
  EXPECT_FALSE(res->streaming);
  EXPECT_EQ(res->error_status(), 404);
  EXPECT_NE(res->body.find("no such sandbox"), std::string::npos);
}

TEST(ExecStream, FailureAfterTheFirstEventIsAnErrorEvent) {
  Attached a;
  auto& [e, res, s, cb] = a;
  cb.on_started(1);
  cb.on_done(std::unexpected(Error{Code::kUnavailable, 0, "agent lost"}));
  res->drain_all();
  auto ev = events(res->body);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[1].at("type"), "error");
  EXPECT_EQ(ev[1].at("code"), "unavailable");
  EXPECT_TRUE(res->ended);
}

// A client that went away neither stalls the command nor loses its end: the
// window comes back for events that were not written, and later events and the
// exit still reach the responder (with an Idempotency-Key, a recorder that
// keeps them for the retry).
TEST(ExecStream, AGoneClientNeitherStallsTheCommandNorLosesItsEnd) {
  Attached a;
  auto& [e, res, s, cb] = a;
  cb.on_output(1, "a");
  cb.on_output(1, "bb");
  res->drain_one(false);
  res->drain_one(false);
  EXPECT_EQ(e.credited, 3u);
  cb.on_output(1, "c");
  cb.on_done(exited(0));
  ASSERT_EQ(res->queue.size(), 2u) << "the output and the exit still go to the responder";
  EXPECT_NE(res->queue.back().data.find("\"exit\""), std::string::npos);
  EXPECT_TRUE(res->ended);
  EXPECT_EQ(e.kills, 0);
}

}  // namespace
}  // namespace tp::api
