#include "api/idempotency.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <random>
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
    log.reset();
    cache.reset();
    std::filesystem::remove_all(dir_);
    if (!crashed_.empty()) std::filesystem::remove_all(crashed_);
  }
  // A new cache on the same data dir: what a daemon restart sees.
  void reopen(size_t max_in_flight = 100000) {
    log.reset();
    cache.reset();
    cache = std::make_unique<IdempotencyCache>(max_in_flight);
    node::StepLog::Options o;
    o.data_dir = dir_;
    o.inline_max = 16;
    o.retention = std::chrono::hours(1);
    o.clock = [this] { return now_us.load(); };
    auto l = node::StepLog::open(o);
    ASSERT_TRUE(l);
    log = std::move(*l);
    // As the daemon does at start (after recover()): calls it died answering get a 503.
    interrupted = log->answer_interrupted();
    cache->set_log(log);
  }
  // What a kill -9 of the daemon leaves (the data dir as the page cache holds it now);
  // restart() then opens it.
  void crash() {
    char tmpl[] = "/tmp/tp-idem-crash-XXXXXX";
    crashed_ = mkdtemp(tmpl);
    std::filesystem::copy(dir_, crashed_,
                          std::filesystem::copy_options::recursive |
                              std::filesystem::copy_options::overwrite_existing);
  }
  void restart() {
    log.reset();
    cache.reset();
    std::filesystem::remove_all(dir_);
    dir_ = crashed_;
    reopen();
  }
  std::string crashed_;
  size_t interrupted = 0;
  std::string dir_;
  std::unique_ptr<IdempotencyCache> cache;
  std::shared_ptr<node::StepLog> log;
  // The log's clock: a fake, moved by the tests (never a sleep).
  std::atomic<int64_t> now_us{std::chrono::duration_cast<std::chrono::microseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count()};
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
  // Replays say so, and how long the server took to answer from the record.
  EXPECT_EQ(second->headers.rfind("Idempotent-Replayed: true\nServer-Timing: replay;dur=", 0), 0u)
      << second->headers;
  EXPECT_EQ(first->headers, "");
  EXPECT_EQ(cache->in_flight(), 0u);
}

// A connection that runs posted work only when the test says so.
struct QueuedConnection : FakeResponder {
  std::mutex qmu;
  std::vector<std::function<void()>> queued;
  void run_on_connection(std::function<void()> fn) override {
    std::lock_guard lk(qmu);
    queued.push_back(std::move(fn));
  }
  void run_queued() {
    std::vector<std::function<void()>> q;
    {
      std::lock_guard lk(qmu);
      q.swap(queued);
    }
    for (auto& f : q) f();
  }
};

TEST_F(Idempotency, TheRecordIsWrittenOnTheConnectionsThreadBeforeTheAnswer) {
  auto conn = std::make_shared<QueuedConnection>();
  auto rec = cache->begin(post("/v1/x"), "k", conn);
  ASSERT_NE(rec, nullptr);
  rec->send(201, "application/json", "{\"id\":1}");  // on the thread that produced it
  {
    std::lock_guard lk(conn->mu);
    EXPECT_EQ(conn->sends, 0);  // neither recorded nor answered yet
  }
  ASSERT_EQ(conn->queued.size(), 1u);
  EXPECT_EQ(cache->in_flight(), 1u);
  rec.reset();  // the handler is done with it; what was posted does not need it
  conn->run_queued();
  EXPECT_EQ(conn->wait(), 201);
  EXPECT_EQ(cache->in_flight(), 0u);
  auto again = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->begin(post("/v1/x"), "k", again), nullptr);
  EXPECT_EQ(again->wait(), 201);
  EXPECT_EQ(again->body, "{\"id\":1}");
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

TEST_F(Idempotency, AStreamedAnswerIsReplayedWholeAShortOneInlineALongOneFromASideFile) {
  auto side_files = [&] {
    size_t n = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_))
      if (e.path().extension() == ".body") n++;
    return n;
  };
  std::map<std::string, std::string> sent;
  for (size_t size : {size_t{10}, size_t{10000}}) {
    const std::string key = "s" + std::to_string(size);
    auto first = std::make_shared<FakeResponder>();
    auto rec = cache->begin(post("/v1/x", key), key, first);
    ASSERT_NE(rec, nullptr);
    rec->start_stream(200, "application/octet-stream");
    for (size_t i = 0; i < size; i += 1000) {
      std::string part(std::min<size_t>(1000, size - i), static_cast<char>('a' + i / 1000));
      sent[key] += part;
      rec->write_chunk(part);
    }
    rec->end_stream();
    first->wait();
    rec.reset();
    EXPECT_EQ(first->body, sent[key]);
    // 10 bytes fit the record (the fixture's inline_max is 16): no side file made;
    // 10,000 outgrow what a stream keeps in memory and go to one as they stream.
    EXPECT_EQ(side_files(), size < 16 ? 0u : 1u) << size;
  }
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) reopen();  // and after a restart
    for (const auto& [key, body] : sent) {
      auto retry = std::make_shared<FakeResponder>();
      EXPECT_EQ(cache->begin(post("/v1/x", key), key, retry), nullptr);
      EXPECT_EQ(retry->wait(), 200);
      EXPECT_EQ(retry->body, body) << key << " pass " << pass;
    }
  }
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

constexpr const char* kSb = "n0-0123456789ab";
const std::string kExec = std::string("/v1/sandboxes/") + kSb + "/exec";

// A step whose side effect is visible: it appends a line to a "file" each time it runs.
struct Step {
  std::mutex mu;
  std::string file;
  int runs = 0;
  // Sends the step with `key` through the cache; runs it when the cache says so.
  std::shared_ptr<FakeResponder> send(IdempotencyCache& cache, const std::string& key,
                                      std::function<void()> before_answer = nullptr) {
    auto res = std::make_shared<FakeResponder>();
    auto rec = cache.begin(post(kExec, R"({"cmd":"echo line >> /f"})"), key, res);
    if (rec) {
      int n;
      {
        std::lock_guard lk(mu);
        file += "line\n";
        n = ++runs;
      }
      if (before_answer) before_answer();
      rec->send(200, "application/json", "{\"exit_code\":0,\"lines\":" + std::to_string(n) + "}");
    }
    res->wait();
    return res;
  }
};

TEST_F(Idempotency, AStepSentTwiceRunsOnceSequentiallyConcurrentlyAndTenMinutesLater) {
  Step step;
  // Sequentially.
  auto a = step.send(*cache, "traj/1");
  auto b = step.send(*cache, "traj/1");
  EXPECT_EQ(step.runs, 1);
  EXPECT_EQ(b->body, a->body);
  EXPECT_NE(b->headers.find("Idempotent-Replayed: true"), std::string::npos);
  // Concurrently, in random interleavings: the first runs, the others wait for its answer.
  std::mt19937 rng(12345);
  for (int round = 0; round < 50; ++round) {
    std::string key = "traj/c" + std::to_string(round);
    int before = step.runs;
    std::vector<std::shared_ptr<FakeResponder>> answers(4);
    std::vector<std::thread> ts;
    std::vector<int> delays(4);
    for (auto& d : delays) d = static_cast<int>(rng() % 300);
    int answer_delay = static_cast<int>(rng() % 300);
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&, t] {
        std::this_thread::sleep_for(std::chrono::microseconds(delays[t]));
        answers[t] = step.send(*cache, key, [&] {
          std::this_thread::sleep_for(std::chrono::microseconds(answer_delay));
        });
      });
    for (auto& t : ts) t.join();
    EXPECT_EQ(step.runs, before + 1) << key;
    for (auto& r : answers) {
      EXPECT_EQ(r->status, 200);
      EXPECT_EQ(r->body, answers[0]->body);
    }
  }
  // Ten minutes later (the log's clock; nothing sleeps), and after a restart too.
  now_us += 10 * 60 * 1'000'000ll;
  log->sweep();
  auto c = step.send(*cache, "traj/1");
  EXPECT_EQ(c->body, a->body);
  reopen();
  auto d = step.send(*cache, "traj/1");
  EXPECT_EQ(d->body, a->body);
  EXPECT_EQ(step.runs, 51);
  EXPECT_EQ(std::count(step.file.begin(), step.file.end(), '\n'), 51);
}

TEST_F(Idempotency, NodeWideKeysAreForgottenAfterTheRetentionOnly) {
  int runs = 0;
  auto create = [&] {
    auto res = std::make_shared<FakeResponder>();
    if (auto rec = cache->begin(post("/v1/sandboxes", "{}"), "create-1", res)) {
      ++runs;
      rec->send(201, "application/json", "{}");
    }
    res->wait();
  };
  create();
  now_us += 59 * 60 * 1'000'000ll;  // within the hour
  log->sweep();
  create();
  EXPECT_EQ(runs, 1);
  now_us += 2 * 60 * 1'000'000ll;  // past it
  log->sweep();
  create();
  EXPECT_EQ(runs, 2);
}

TEST_F(Idempotency, CallsWithoutAKeyAreRecordedOnLiveSandboxesOnly) {
  cache->record_unkeyed([](const std::string& id) { return id == kSb; });
  Request r = post(kExec, R"({"cmd":"echo hi"})");
  r.caller.transport = Caller::Transport::kUnix;
  r.caller.uid = 1000;
  r.caller.gid = 1000;
  auto res = std::make_shared<FakeResponder>();
  auto rec = cache->record(r, res);
  ASSERT_NE(rec, res);
  rec->send(200, "application/json", R"({"exit_code":3,"signal":0,"stdout":"aGkK","stderr":""})");
  EXPECT_EQ(res->wait(), 200);
  EXPECT_EQ(res->headers, "");
  // Another sandbox, and calls about no sandbox, are not recorded without a key.
  auto other = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->record(post("/v1/sandboxes/n0-aaaaaaaaaaaa/exec"), other), other);
  EXPECT_EQ(cache->record(post("/v1/sandboxes"), other), other);
  // A second identical call runs again (no key, no replay) and is recorded again.
  auto again = std::make_shared<FakeResponder>();
  auto rec2 = cache->record(r, again);
  ASSERT_NE(rec2, again);
  rec2->send(200, "application/json", "{}");
  again->wait();
  auto all = log->list(kSb, 0, 10, true);
  ASSERT_TRUE(all);
  ASSERT_EQ(all->size(), 2u);
  const auto& first = (*all)[0];
  EXPECT_EQ(first.key, "");
  EXPECT_EQ(first.request.method, "POST");
  EXPECT_EQ(first.request.target, kExec);
  auto body = log->request_body(kSb, first);  // above inline_max (16): in a side file
  ASSERT_TRUE(body && *body);
  EXPECT_EQ(**body, R"({"cmd":"echo hi"})");
  EXPECT_EQ(first.caller, R"({"transport":"unix","uid":1000,"gid":1000})");
  EXPECT_EQ(first.summary, R"({"exit_code":3,"signal":0,"stdout_bytes":3,"stderr_bytes":0})");
  EXPECT_EQ(first.status, 200);
  EXPECT_GE(first.finished_us, first.started_us);
  EXPECT_EQ(log->size(), 0u);  // nothing indexed
}

TEST_F(Idempotency, AResultIsFetchedByKeyAlsoWhileInFlightAndAfterARestart) {
  auto first = std::make_shared<FakeResponder>();
  auto rec = cache->begin(post(kExec, "{}"), "traj/7", first);
  ASSERT_NE(rec, nullptr);
  auto fetched = std::make_shared<FakeResponder>();
  cache->fetch("traj/7", kSb, fetched);  // in flight: waits
  EXPECT_EQ(fetched->sends, 0);
  auto elsewhere = std::make_shared<FakeResponder>();
  cache->fetch("traj/7", "n0-aaaaaaaaaaaa", elsewhere);  // another sandbox's log
  EXPECT_EQ(elsewhere->wait(), 404);
  rec->send(200, "application/json", R"({"exit_code":0,"stdout":"b3V0"})");
  EXPECT_EQ(fetched->wait(), 200);
  EXPECT_EQ(fetched->body, R"({"exit_code":0,"stdout":"b3V0"})");
  rec.reset();
  reopen();
  auto later = std::make_shared<FakeResponder>();
  cache->fetch("traj/7", kSb, later);
  EXPECT_EQ(later->wait(), 200);
  EXPECT_EQ(later->body, fetched->body);
  auto missing = std::make_shared<FakeResponder>();
  cache->fetch("traj/8", kSb, missing);
  EXPECT_EQ(missing->wait(), 404);
  EXPECT_NE(missing->body.find("traj/8"), std::string::npos);
}

TEST_F(Idempotency, KeyedCallsOnSandboxesTheNodeDoesNotKnowGoNodeWide) {
  cache->set_sandbox_known([](const std::string& id) { return id == kSb; });
  Step step;
  auto ghost = std::make_shared<FakeResponder>();
  auto rec = cache->begin(post("/v1/sandboxes/n0-aaaaaaaaaaaa/exec", "{}"), "g/1", ghost);
  ASSERT_NE(rec, nullptr);
  rec->send(404, "application/json", R"({"code":"not_found"})");
  ghost->wait();
  EXPECT_FALSE(log->info("n0-aaaaaaaaaaaa").exists);  // no log for a sandbox that never was
  EXPECT_EQ(log->find("g/1")->log, 0u);               // the node-wide one
  auto again = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->begin(post("/v1/sandboxes/n0-aaaaaaaaaaaa/exec", "{}"), "g/1", again), nullptr);
  EXPECT_EQ(again->wait(), 404);
  step.send(*cache, "k/1");  // a known sandbox: its own log
  EXPECT_EQ(log->info(kSb).records, 1u);
}

TEST_F(Idempotency, AnAnsweredKeyIsOneRecordAcrossARestart) {
  auto first = std::make_shared<FakeResponder>();
  auto rec = cache->begin(post("/v1/sandboxes", "{}"), "c/1", first);
  ASSERT_NE(rec, nullptr);
  rec->send(201, "application/json", R"({"id":"n0-0123456789ab"})");
  EXPECT_EQ(first->wait(), 201);
  rec.reset();
  reopen();
  EXPECT_EQ(interrupted, 0u);
  auto again = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->begin(post("/v1/sandboxes", "{}"), "c/1", again), nullptr);
  EXPECT_EQ(again->wait(), 201);
  EXPECT_EQ(again->body, R"({"id":"n0-0123456789ab"})");
  auto all = log->list("", 0, 100, false);
  ASSERT_TRUE(all);
  ASSERT_EQ(all->size(), 1u);  // the intent is no entry
  EXPECT_EQ((*all)[0].key, "c/1");
}

// A keyed call (a batch create) whose daemon is killed while its handler runs: the
// restarted daemon answers its retry 503 from the record, and never runs it again.
TEST_F(Idempotency, ACallCutByACrashIsAnswered503ToItsRetryAndNeverRunsAgain) {
  const std::string body = R"({"count":48,"stream":true})";
  auto first = std::make_shared<FakeResponder>();
  auto rec = cache->begin(post("/v1/sandboxes/batch", body), "batch/1", first);
  ASSERT_NE(rec, nullptr);
  rec->start_stream(200, "application/x-ndjson");
  rec->write_chunk(R"({"index":0,"sandbox":{"id":"n0-0123456789ab"}})"
                   "\n");
  crash();  // the daemon dies here, mid-answer
  rec->end_stream();
  first->wait();
  rec.reset();
  restart();
  EXPECT_EQ(interrupted, 1u);
  int runs = 0;
  for (int i = 0; i < 2; ++i) {
    auto retry = std::make_shared<FakeResponder>();
    auto r = cache->begin(post("/v1/sandboxes/batch", body), "batch/1", retry);
    if (r) {
      ++runs;
      r->send(200, "application/json", "{}");
    }
    EXPECT_EQ(retry->wait(), 503);
    EXPECT_NE(retry->body.find("the daemon restarted while this call was being answered"),
              std::string::npos)
        << retry->body;
    EXPECT_NE(retry->headers.find("Idempotent-Replayed: true"), std::string::npos);
  }
  EXPECT_EQ(runs, 0);
  // The same key with another request is refused, naming the first one.
  auto other = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->begin(post("/v1/sandboxes/batch", R"({"count":1})"), "batch/1", other), nullptr);
  EXPECT_EQ(other->wait(), 409);
  EXPECT_NE(other->body.find("POST /v1/sandboxes/batch (body sha256:"), std::string::npos)
      << other->body;
  EXPECT_NE(other->body.find(std::to_string(body.size()) + " bytes"), std::string::npos)
      << other->body;
  // And after the next restart the same (one record, read back).
  reopen();
  EXPECT_EQ(interrupted, 0u);
  auto later = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->begin(post("/v1/sandboxes/batch", body), "batch/1", later), nullptr);
  EXPECT_EQ(later->wait(), 503);
  EXPECT_EQ(log->list("", 0, 100, false)->size(), 1u);
}

// A keyed call on a sandbox: its intent and its 503 go to the sandbox's log, where its
// result is fetched by key.
TEST_F(Idempotency, ACutCallOnASandboxIsAnswered503InItsLog) {
  auto first = std::make_shared<FakeResponder>();
  auto rec = cache->begin(post(kExec, "{}"), "traj/1", first);
  ASSERT_NE(rec, nullptr);
  crash();
  rec->send(200, "application/json", R"({"exit_code":0})");
  first->wait();
  rec.reset();
  restart();
  EXPECT_EQ(interrupted, 1u);
  auto fetched = std::make_shared<FakeResponder>();
  cache->fetch("traj/1", kSb, fetched);
  EXPECT_EQ(fetched->wait(), 503);
  auto all = log->list(kSb, 0, 100, false);
  ASSERT_TRUE(all);
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].seq, 1u);
  EXPECT_EQ((*all)[0].status, 503);
}

TEST_F(Idempotency, BadKeysAreRefused) {
  auto r = std::make_shared<FakeResponder>();
  EXPECT_EQ(cache->begin(post("/v1/x"), std::string(201, 'a'), r), nullptr);
  EXPECT_EQ(r->status, 400);
}

}  // namespace
}  // namespace tp::api
