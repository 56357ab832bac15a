#include "api/idempotency.h"

#include <gtest/gtest.h>

namespace tp::api {
namespace {

// Records what a handler answered.
struct FakeResponder : Responder {
  int status = 0;
  std::string body;
  int sends = 0;
  void send(int s, std::string, std::string b) override {
    status = s;
    body = std::move(b);
    sends++;
  }
  void start_stream(int s, std::string) override { status = s; }
  void write_chunk(std::string d) override { body += d; }
  void end_stream() override { sends++; }
  void set_on_abort(std::function<void()>) override {}
  void add_header(std::string n, std::string v) override { headers += n + ": " + v + "\n"; }
  std::string headers;
};

Request post(const std::string& path) {
  Request r;
  r.method = "POST";
  r.path = path;
  return r;
}

TEST(Idempotency, RepeatGetsTheRecordedAnswerWithoutRunningAgain) {
  IdempotencyCache cache;
  auto first = std::make_shared<FakeResponder>();
  auto rec = cache.begin(post("/v1/x"), "k", first);
  ASSERT_NE(rec, nullptr);  // first time: the handler runs
  rec->send(201, "application/json", "{\"id\":1}");
  EXPECT_EQ(first->status, 201);

  auto second = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache.begin(post("/v1/x"), "k", second), nullptr);  // handler must not run
  EXPECT_EQ(second->status, 201);
  EXPECT_EQ(second->body, "{\"id\":1}");
  EXPECT_EQ(second->headers, "Idempotent-Replayed: true\n");
  EXPECT_EQ(first->headers, "");
}

TEST(Idempotency, FullCacheForgetsTheOldestAnsweredKeys) {
  IdempotencyCache cache(2);
  cache.begin(post("/v1/x"), "a", std::make_shared<FakeResponder>())->send(200, "t", "a");
  cache.begin(post("/v1/x"), "b", std::make_shared<FakeResponder>())->send(200, "t", "b");
  // A third key evicts "a", the oldest answer; "b" is still replayed.
  auto c = cache.begin(post("/v1/x"), "c", std::make_shared<FakeResponder>());
  ASSERT_NE(c, nullptr);
  c->send(200, "t", "c");
  auto rb = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache.begin(post("/v1/x"), "b", rb), nullptr);
  EXPECT_EQ(rb->body, "b");
  EXPECT_LE(cache.size(), 2u);
}

TEST(Idempotency, RefusesNewKeysOnlyWhenAllKeptAreInFlight) {
  IdempotencyCache cache(1);
  auto inflight = cache.begin(post("/v1/x"), "a", std::make_shared<FakeResponder>());
  ASSERT_NE(inflight, nullptr);
  auto r = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache.begin(post("/v1/x"), "b", r), nullptr);
  EXPECT_EQ(r->status, 429);
  inflight->send(200, "t", "");
}

TEST(Idempotency, WaitersAreVisibleForTheRetryGrace) {
  IdempotencyCache cache;
  auto rec = cache.begin(post("/v1/x"), "k", std::make_shared<FakeResponder>());
  EXPECT_FALSE(cache.has_waiters("k"));
  EXPECT_EQ(cache.begin(post("/v1/x"), "k", std::make_shared<FakeResponder>()), nullptr);
  EXPECT_TRUE(cache.has_waiters("k"));
  rec->send(200, "t", "");
  EXPECT_FALSE(cache.has_waiters("k"));
}

TEST(Idempotency, RepeatWhileInFlightWaitsForTheFirstAnswer) {
  IdempotencyCache cache;
  auto rec = cache.begin(post("/v1/x"), "k", std::make_shared<FakeResponder>());
  ASSERT_NE(rec, nullptr);
  auto waiting = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache.begin(post("/v1/x"), "k", waiting), nullptr);
  EXPECT_EQ(waiting->sends, 0);
  rec->start_stream(200, "application/x-ndjson");
  rec->write_chunk("a\n");
  rec->write_chunk("b\n");
  rec->end_stream();
  EXPECT_EQ(waiting->status, 200);
  EXPECT_EQ(waiting->body, "a\nb\n");
}

TEST(Idempotency, KeyReusedOnAnotherPathIsAConflict) {
  IdempotencyCache cache;
  cache.begin(post("/v1/x"), "k", std::make_shared<FakeResponder>())->send(200, "t", "");
  auto other = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache.begin(post("/v1/y"), "k", other), nullptr);
  EXPECT_EQ(other->status, 409);
}

TEST(Idempotency, ServerErrorsAreNotRecordedSoARetryRuns) {
  IdempotencyCache cache;
  cache.begin(post("/v1/x"), "k", std::make_shared<FakeResponder>())->send(503, "t", "busy");
  EXPECT_NE(cache.begin(post("/v1/x"), "k", std::make_shared<FakeResponder>()), nullptr);
}

TEST(Idempotency, BadKeysAreRefused) {
  IdempotencyCache cache;
  auto r = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache.begin(post("/v1/x"), std::string(201, 'a'), r), nullptr);
  EXPECT_EQ(r->status, 400);
}

}  // namespace
}  // namespace tp::api
