#include "api/idempotency.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <thread>

namespace tp::api {
namespace {

// Records what a handler answered.
// Records what a handler answered; answers arrive on the step log's writer thread.
struct FakeResponder : Responder {
  std::mutex mu;
  std::condition_variable cv;
  int status = 0;
  std::string body;
  int sends = 0;
  void send(int s, std::string, std::string b) override {
    std::lock_guard lk(mu);
    status = s;
    body = std::move(b);
    sends++;
    cv.notify_all();
  }
  void start_stream(int s, std::string) override { status = s; }
  void write_chunk(std::string d) override {
    std::lock_guard lk(mu);
    body += d;
  }
  void end_stream() override {
    std::lock_guard lk(mu);
    sends++;
    cv.notify_all();
  }
  void abort_stream() override {
    std::lock_guard lk(mu);
    aborted = true;
    sends++;
    cv.notify_all();
  }
  bool aborted = false;
  void set_on_abort(std::function<void()>) override {}
  void add_header(std::string n, std::string v) override { headers += n + ": " + v + "\n"; }
  // Waits for the answer (it is sent once recorded).
  int wait() {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return sends > 0; });
    return status;
  }
  std::string headers;
};

Request post(const std::string& path, std::string body = "") {
  Request r;
  r.method = "POST";
  r.path = path;
  r.target = path;
  r.body = std::move(body);
  return r;
}

class Idempotency : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tp-idem-XXXXXX";
    dir_ = mkdtemp(tmpl);
    reopen();
  }
  void TearDown() override {
    cache.reset();
    std::filesystem::remove_all(dir_);
  }
  // A new cache on the same data dir: what a daemon restart sees.
  void reopen(size_t max_in_flight = 100000) {
    cache.reset();
    cache = std::make_unique<IdempotencyCache>(max_in_flight);
    node::StepLog::Options o;
    o.data_dir = dir_;
    o.inline_max = 16;
    auto l = node::StepLog::open(o);
    ASSERT_TRUE(l);
    cache->set_log(std::move(*l));
  }
  std::string dir_;
  std::unique_ptr<IdempotencyCache> cache;
};

TEST_F(Idempotency, RepeatGetsTheRecordedAnswerWithoutRunningAgain) {
  auto first = std::make_shared<FakeResponder>();
  auto rec = cache->begin(post("/v1/x"), "k", first);
  ASSERT_NE(rec, nullptr);  // first time: the handler runs
  rec->send(201, "application/json", "{\"id\":1}");
  EXPECT_EQ(first->wait(), 201);  // sent once recorded

  auto second = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->begin(post("/v1/x"), "k", second), nullptr);  // handler must not run
  EXPECT_EQ(second->wait(), 201);
  EXPECT_EQ(second->body, "{\"id\":1}");
  EXPECT_EQ(second->headers, "Idempotent-Replayed: true\n");
  EXPECT_EQ(first->headers, "");
  EXPECT_EQ(cache->in_flight(), 0u);
}

TEST_F(Idempotency, KeysSurviveARestart) {
  auto rec = cache->begin(post("/v1/x", "body"), "k", std::make_shared<FakeResponder>());
  ASSERT_NE(rec, nullptr);
  // Bigger than inline_max (16): the answer goes to a side file.
  rec->send(200, "text/plain", std::string(100, 'z'));
  rec.reset();
  reopen();
  auto again = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->begin(post("/v1/x", "body"), "k", again), nullptr);
  EXPECT_EQ(again->wait(), 200);
  EXPECT_EQ(again->body, std::string(100, 'z'));
}

TEST_F(Idempotency, ServerErrorsAreRecordedSoARetryDoesNotRunAgain) {
  auto rec = cache->begin(post("/v1/x"), "k", std::make_shared<FakeResponder>());
  ASSERT_NE(rec, nullptr);
  rec->send(503, "t", "busy");
  rec.reset();
  auto retry = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->begin(post("/v1/x"), "k", retry), nullptr);
  EXPECT_EQ(retry->wait(), 503);
  EXPECT_EQ(retry->body, "busy");
}

// A download-like stream (flow-controlled chunks) that fails after its head is
// aborted for the client; a repeat must not get it as a complete answer.
TEST_F(Idempotency, AnAbortedStreamIsRecordedAsIncomplete) {
  auto first = std::make_shared<FakeResponder>();
  auto rec = cache->begin(post("/v1/x"), "k", first);
  ASSERT_NE(rec, nullptr);
  rec->start_stream(200, "application/octet-stream");
  bool written = false;
  rec->write_chunk("part", [&](bool ok) { written = ok; });
  EXPECT_TRUE(written);
  rec->abort_stream();
  first->wait();
  EXPECT_TRUE(first->aborted);
  rec.reset();
  auto retry = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->begin(post("/v1/x"), "k", retry), nullptr);
  EXPECT_EQ(retry->wait(), 503);
  EXPECT_NE(retry->body.find("did not complete"), std::string::npos) << retry->body;
}

TEST_F(Idempotency, AnAnswerThatNeverCameIsRecordedAs503) {
  auto first = std::make_shared<FakeResponder>();
  cache->begin(post("/v1/x"), "k", first).reset();  // the handler dropped it
  auto retry = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->begin(post("/v1/x"), "k", retry), nullptr);
  EXPECT_EQ(retry->wait(), 503);
  EXPECT_NE(retry->body.find("did not complete"), std::string::npos);
}

TEST_F(Idempotency, RefusesNewKeysWhenTooManyAreInFlight) {
  reopen(1);
  auto inflight = cache->begin(post("/v1/x"), "a", std::make_shared<FakeResponder>());
  ASSERT_NE(inflight, nullptr);
  auto r = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->begin(post("/v1/x"), "b", r), nullptr);
  EXPECT_EQ(r->wait(), 429);
  inflight->send(200, "t", "");
}

TEST_F(Idempotency, WaitersAreVisibleForTheRetryGrace) {
  auto rec = cache->begin(post("/v1/x"), "k", std::make_shared<FakeResponder>());
  EXPECT_FALSE(cache->has_waiters("k"));
  auto waiting = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->begin(post("/v1/x"), "k", waiting), nullptr);
  EXPECT_TRUE(cache->has_waiters("k"));
  rec->send(200, "t", "");
  waiting->wait();
  EXPECT_FALSE(cache->has_waiters("k"));
}

TEST_F(Idempotency, RepeatWhileInFlightWaitsForTheFirstAnswer) {
  auto first = std::make_shared<FakeResponder>();
  auto rec = cache->begin(post("/v1/x"), "k", first);
  ASSERT_NE(rec, nullptr);
  auto waiting = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->begin(post("/v1/x"), "k", waiting), nullptr);
  EXPECT_EQ(waiting->sends, 0);
  rec->start_stream(200, "application/x-ndjson");
  rec->write_chunk("a\n");
  rec->write_chunk("b\n");
  const std::string exit_line = R"({"type":"exit","exit_code":0})"
                                "\n";
  rec->write_chunk(exit_line);
  // Output goes on at once; the terminal event waits until the answer is recorded.
  {
    std::lock_guard lk(first->mu);
    EXPECT_EQ(first->body, "a\nb\n");
    EXPECT_EQ(first->sends, 0);
  }
  rec->end_stream();
  EXPECT_EQ(first->wait(), 200);
  EXPECT_EQ(first->body, "a\nb\n" + exit_line);
  EXPECT_EQ(waiting->wait(), 200);
  EXPECT_EQ(waiting->body, "a\nb\n" + exit_line);
  // Streamed answers are replayed whole, also from disk.
  auto later = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->begin(post("/v1/x"), "k", later), nullptr);
  later->wait();
  EXPECT_EQ(later->body, "a\nb\n" + exit_line);
}

TEST_F(Idempotency, KeyReusedForAnotherRequestIsAConflictNamingBoth) {
  auto rec = cache->begin(post("/v1/x", "one"), "k", std::make_shared<FakeResponder>());
  // While in flight ...
  auto early = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->begin(post("/v1/y"), "k", early), nullptr);
  EXPECT_EQ(early->wait(), 409);
  rec->send(200, "t", "");
  rec.reset();
  // ... and once recorded: another path, another body.
  auto other = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->begin(post("/v1/y"), "k", other), nullptr);
  EXPECT_EQ(other->wait(), 409);
  EXPECT_NE(other->body.find("POST /v1/x"), std::string::npos) << other->body;
  EXPECT_NE(other->body.find("POST /v1/y"), std::string::npos) << other->body;
  auto body = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->begin(post("/v1/x", "two"), "k", body), nullptr);
  EXPECT_EQ(body->wait(), 409);
  EXPECT_NE(body->body.find("3 bytes"), std::string::npos) << body->body;
}

TEST_F(Idempotency, BadKeysAreRefused) {
  auto r = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->begin(post("/v1/x"), std::string(201, 'a'), r), nullptr);
  EXPECT_EQ(r->status, 400);
}

}  // namespace
}  // namespace tp::api
