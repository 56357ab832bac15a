#include "function/function_service.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <random>

#include "fake_worker.h"

namespace tp::function {
namespace {

using testing::FakeWorker;
using testing::payload_head;
using testing::step_exited;

struct Fixture {
  explicit Fixture(size_t workers = 1, size_t slots = 2, size_t per_client = 16) {
    auto l = LanguageSet::load("");
    EXPECT_TRUE(l);
    langs = *l;
    opts.workers = workers;
    opts.slots = slots;
    opts.queue.per_client_in_flight = per_client;
    opts.retry_backoff = std::chrono::milliseconds(0);
    opts.run_blocking = [](std::function<void()> f) { f(); };
    svc = std::make_unique<FunctionService>(
        langs,
        [this](const std::string&) -> Result<std::shared_ptr<Worker>> {
          std::lock_guard l(mu);
          if (fail_next > 0) {
            --fail_next;
            return fail(Code::kUnavailable, "cannot start a worker");
          }
          auto w = std::make_shared<FakeWorker>("w" + std::to_string(made.size()));
          made.push_back(w);
          return std::shared_ptr<Worker>(w);
        },
        opts);
  }
  std::shared_ptr<FakeWorker> worker(size_t i) {
    std::lock_guard l(mu);
    return made.at(i);
  }
  size_t workers_made() {
    std::lock_guard l(mu);
    return made.size();
  }

  std::shared_ptr<const LanguageSet> langs;
  ServiceOptions opts;
  std::mutex mu;
  std::vector<std::shared_ptr<FakeWorker>> made;
  int fail_next = 0;
  std::unique_ptr<FunctionService> svc;
};

RunRequest req(std::string lang, std::string source, std::string in = "") {
  RunRequest r;
  r.language = std::move(lang);
  r.source = std::move(source);
  r.stdin_data = std::move(in);
  return r;
}

// Declared before the Fixture in each test: the service's shutdown answers the runs still
// queued, into this collector.
struct Collect {
  std::vector<Result<RunResult>> got;
  FunctionService::RunDone fn() {
    return [this](Result<RunResult> r) { got.push_back(std::move(r)); };
  }
};

TEST(FunctionService, PythonRunGoesToAWorkerAndComesBack) {
  Collect c;
  Fixture f;
  ASSERT_TRUE(f.svc->run("alice", req("python3", "print(1)", "in"), c.fn()));
  auto w = f.worker(0);
  ASSERT_EQ(w->pending(), 1u);
  auto call = w->take();
  EXPECT_EQ(call.meta.flavor, "generic");
  EXPECT_EQ(call.meta.timeout_ms, f.opts.defaults.timeout_ms);
  EXPECT_EQ(call.meta.memory_bytes, f.opts.defaults.memory_bytes);
  auto head = payload_head(call.payload);
  EXPECT_EQ(head.at("mode").as_string(), "python");
  EXPECT_EQ(head.at("argv").as_array()[1].as_string(), "/tmp/main.py");
  EXPECT_EQ(head.at("files").as_array()[0].as_object().at("path").as_string(), "main.py");
  EXPECT_TRUE(call.payload.ends_with("print(1)in"));
  call.done(step_exited(0, "1\n"));
  ASSERT_EQ(c.got.size(), 1u);
  ASSERT_TRUE(c.got[0]);
  EXPECT_EQ(c.got[0]->verdict, Verdict::kOk);
  EXPECT_EQ(c.got[0]->run->stdout_data, "1\n");
  EXPECT_FALSE(c.got[0]->compile);
  auto st = f.svc->status();
  EXPECT_EQ(st.runs_total, 1u);
  EXPECT_EQ(st.verdicts["ok"], 1u);
  EXPECT_EQ(st.in_flight, 0u);
}

TEST(FunctionService, PrestartedLanguagesUseTheirFlavor) {
  Collect c;
  Fixture f;
  ASSERT_TRUE(f.svc->run("a", req("js", "console.log(1)"), c.fn()));
  auto call = f.worker(0)->take();
  EXPECT_EQ(call.meta.flavor, "nodejs");
  EXPECT_EQ(payload_head(call.payload).at("argv").as_array()[1].as_string(), "/tmp/main.js");
}

TEST(FunctionService, CompilesOnceForManyRuns) {
  Collect c;
  Fixture f(1, 4);
  for (int i = 0; i < 20; ++i)
    ASSERT_TRUE(f.svc->run("a", req("cpp", "int main(){}", std::to_string(i)), c.fn()));
  auto w = f.worker(0);
  ASSERT_EQ(w->pending(), 1u);  // one compile, every run waits for it
  auto compile = w->take();
  auto head = payload_head(compile.payload);
  EXPECT_EQ(head.at("argv").as_array()[0].as_string(), "g++");
  EXPECT_EQ(head.at("fetch").as_array()[0].as_string(), "test");
  StepResult built = step_exited(0);
  built.files.push_back(File{"test", "BINARY", 0644});
  compile.done(built);
  size_t runs = 0;
  while (w->pending()) {
    auto call = w->take();
    auto h = payload_head(call.payload);
    bool has_binary = false;
    for (const auto& file : h.at("files").as_array())
      if (file.as_object().at("path").as_string() == "test")
        has_binary = file.as_object().at("mode").as_int64() == 0755;
    EXPECT_TRUE(has_binary);
    EXPECT_EQ(h.at("argv").as_array()[0].as_string(), "./test");
    call.done(step_exited(0, "ok"));
    ++runs;
  }
  EXPECT_EQ(runs, 20u);
  ASSERT_EQ(c.got.size(), 20u);
  for (auto& r : c.got) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->verdict, Verdict::kOk);
    ASSERT_TRUE(r->compile);
  }
  // Later runs of the same program find it compiled.
  ASSERT_TRUE(f.svc->run("b", req("cpp", "int main(){}"), c.fn()));
  auto call = w->take();
  EXPECT_EQ(payload_head(call.payload).at("argv").as_array()[0].as_string(), "./test");
  call.done(step_exited(0));
  EXPECT_TRUE(c.got.back()->compile_cached);
  EXPECT_EQ(f.svc->status().cache.misses, 1u);
}

TEST(FunctionService, ACompileErrorIsAVerdictAndIsRemembered) {
  Collect c;
  Fixture f;
  ASSERT_TRUE(f.svc->run("a", req("c", "int main( {"), c.fn()));
  auto compile = f.worker(0)->take();
  StepResult bad = step_exited(1);
  bad.stderr_data = "main.c:1: error: expected";
  compile.done(bad);
  ASSERT_EQ(c.got.size(), 1u);
  ASSERT_TRUE(c.got[0]);
  EXPECT_EQ(c.got[0]->verdict, Verdict::kCompileError);
  EXPECT_FALSE(c.got[0]->run);
  EXPECT_EQ(c.got[0]->compile->stderr_data, "main.c:1: error: expected");
  ASSERT_TRUE(f.svc->run("a", req("c", "int main( {"), c.fn()));
  EXPECT_EQ(f.worker(0)->pending(), 0u);  // nothing ran
  ASSERT_EQ(c.got.size(), 2u);
  EXPECT_EQ(c.got[1]->verdict, Verdict::kCompileError);
  EXPECT_TRUE(c.got[1]->compile_cached);
}

TEST(FunctionService, ACancelledCompileDoesNotFailOthersWaitingForIt) {
  Collect a, b;
  Fixture f(1, 4);
  auto leader = f.svc->run("a", req("cpp", "int main(){}"), a.fn());
  ASSERT_TRUE(leader);
  ASSERT_TRUE(f.svc->run("b", req("cpp", "int main(){}"), b.fn()));
  f.svc->cancel(*leader);
  auto compile = f.worker(0)->take();
  EXPECT_TRUE(compile.cancelled);
  StepResult killed;
  killed.signal = 9;
  killed.verdict = verdict_of(killed);
  compile.done(killed);
  ASSERT_EQ(a.got.size(), 1u);
  EXPECT_FALSE(a.got[0]);
  EXPECT_TRUE(b.got.empty());  // b compiles again instead of getting a bogus compile error
  auto again = f.worker(0)->take();
  EXPECT_EQ(payload_head(again.payload).at("argv").as_array()[0].as_string(), "g++");
  StepResult built = step_exited(0);
  built.files.push_back(File{"test", "BIN", 0644});
  again.done(built);
  f.worker(0)->take().done(step_exited(0, "ran"));
  ASSERT_EQ(b.got.size(), 1u);
  ASSERT_TRUE(b.got[0]);
  EXPECT_EQ(b.got[0]->verdict, Verdict::kOk);
}

TEST(FunctionService, ClientsTakeTurns) {
  Collect c;
  Fixture f(1, 1);
  for (int i = 0; i < 10; ++i)
    ASSERT_TRUE(f.svc->run("batch", req("bash", "echo " + std::to_string(i)), c.fn()));
  ASSERT_TRUE(f.svc->run("single", req("bash", "echo single"), c.fn()));
  auto w = f.worker(0);
  std::vector<std::string> order;
  while (w->pending()) {
    auto call = w->take();
    std::string src = call.payload.substr(call.payload.find("echo"));
    order.push_back(src);
    call.done(step_exited(0));
  }
  ASSERT_EQ(order.size(), 11u);
  EXPECT_EQ(order[0], "echo 0");
  EXPECT_EQ(order[1], "echo single");  // not behind the other client's ten
}

TEST(FunctionService, PerClientLimit) {
  Collect c;
  Fixture f(1, 8, 2);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(f.svc->run("a", req("bash", "true"), c.fn()));
  EXPECT_EQ(f.worker(0)->pending(), 2u);
  ASSERT_TRUE(f.svc->run("b", req("bash", "true"), c.fn()));
  EXPECT_EQ(f.worker(0)->pending(), 3u);
  EXPECT_EQ(f.svc->status().queued, 3u);
}

TEST(FunctionService, ALostWorkerFailsItsCallsAndIsReplaced) {
  Collect c;
  Fixture f(1, 1);
  ASSERT_TRUE(f.svc->run("a", req("bash", "one"), c.fn()));
  ASSERT_TRUE(f.svc->run("a", req("bash", "two"), c.fn()));
  f.worker(0)->lose();
  ASSERT_EQ(c.got.size(), 1u);
  ASSERT_FALSE(c.got[0]);
  EXPECT_EQ(c.got[0].error().code, Code::kUnavailable);
  ASSERT_EQ(f.workers_made(), 2u);
  EXPECT_TRUE(f.worker(0)->destroyed());
  auto call = f.worker(1)->take();
  EXPECT_TRUE(call.payload.ends_with("two"));
  call.done(step_exited(0));
  ASSERT_EQ(c.got.size(), 2u);
  EXPECT_TRUE(c.got[1]);
}

TEST(FunctionService, NoWorkerNoWaitingForever) {
  Collect c;
  Fixture f;
  f.fail_next = 1;
  ASSERT_TRUE(f.svc->run("a", req("python", "1"), c.fn()));
  ASSERT_EQ(c.got.size(), 1u);
  ASSERT_FALSE(c.got[0]);
  EXPECT_NE(c.got[0].error().message().find("cannot start a worker"), std::string::npos);
  EXPECT_EQ(f.svc->status().pools.at(0).last_error, "cannot start a worker");
  // The next run tries again (the back-off is 0 here).
  ASSERT_TRUE(f.svc->run("a", req("python", "1"), c.fn()));
  EXPECT_EQ(f.worker(0)->pending(), 1u);
}

TEST(FunctionService, CancelStopsQueuedAndRunningCalls) {
  Collect c;
  Fixture f(1, 1);
  auto first = f.svc->run("a", req("bash", "one"), c.fn());
  auto second = f.svc->run("a", req("bash", "two"), c.fn());
  ASSERT_TRUE(first && second);
  f.svc->cancel(*second);
  ASSERT_EQ(c.got.size(), 1u);
  EXPECT_FALSE(c.got[0]);
  f.svc->cancel(*first);
  auto call = f.worker(0)->take();
  EXPECT_TRUE(call.cancelled);
  StepResult killed;
  killed.signal = 9;
  killed.verdict = verdict_of(killed);
  call.done(killed);
  EXPECT_EQ(c.got.size(), 2u);
  EXPECT_EQ(f.svc->status().in_flight, 0u);
}

TEST(FunctionService, BatchAnswersInRequestOrder) {
  Fixture f(1, 4);
  std::vector<Result<RunResult>> results;
  std::vector<RunRequest> reqs = {req("bash", "a"), req("python", "b"), req("bash", "c")};
  ASSERT_TRUE(f.svc->run_batch("a", reqs,
                               [&](std::vector<Result<RunResult>> r) { results = std::move(r); }));
  auto calls = f.worker(0)->take_all();
  ASSERT_EQ(calls.size(), 3u);
  for (size_t i = calls.size(); i-- > 0;) calls[i].done(step_exited(static_cast<int64_t>(i)));
  ASSERT_EQ(results.size(), 3u);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(*results[static_cast<size_t>(i)]->run->exit_code, i);
}

TEST(FunctionService, BadRequestsFailBeforeAnythingRuns) {
  Collect c;
  Fixture f;
  auto bad = [&](RunRequest r, const char* says) {
    auto j = f.svc->run("a", std::move(r), c.fn());
    ASSERT_FALSE(j);
    EXPECT_EQ(j.error().code, Code::kInvalidArgument);
    EXPECT_NE(j.error().message().find(says), std::string::npos) << j.error().message();
  };
  bad(req("cobol", "x"), "serves: ");
  RunRequest t = req("python", "x");
  t.limits.timeout_ms = f.opts.max.timeout_ms + 1;
  bad(t, "timeout");
  RunRequest m = req("python", "x");
  m.limits.memory_bytes = 1 << 20;
  bad(m, "memory");
  RunRequest p = req("python", "x");
  p.files.push_back(File{"../etc/x", "", 0644});
  bad(p, "scratch");
  RunRequest dup = req("python", "x");
  dup.files.push_back(File{"main.py", "", 0644});
  bad(dup, "twice");
  RunRequest nul = req("python", "x");
  nul.args.push_back(std::string("a\0b", 3));
  bad(nul, "NUL");
  RunRequest fetch = req("python", "x");
  fetch.fetch.push_back("/etc/passwd");
  bad(fetch, "scratch");
  auto b = f.svc->run_batch("a", {req("python", "x"), req("cobol", "y")}, [](auto) {});
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message().find("run 1"), std::string::npos);
  EXPECT_EQ(f.workers_made(), 0u);
}

TEST(FunctionService, ShutdownFailsWhatIsQueuedAndRemovesWorkers) {
  Collect c;
  Fixture f(1, 1);
  ASSERT_TRUE(f.svc->run("a", req("bash", "1"), c.fn()));
  ASSERT_TRUE(f.svc->run("a", req("bash", "2"), c.fn()));
  f.svc->shutdown();
  ASSERT_GE(c.got.size(), 1u);
  EXPECT_FALSE(c.got[0]);
  EXPECT_TRUE(f.worker(0)->destroyed());
  auto late = f.svc->run("a", req("bash", "3"), c.fn());
  ASSERT_TRUE(late);
  EXPECT_FALSE(c.got.back());
}

TEST(FunctionService, MetricsNameTheQueueRateAndVerdicts) {
  Collect c;
  Fixture f;
  ASSERT_TRUE(f.svc->run("a", req("bash", "x"), c.fn()));
  StepResult tle;
  tle.timed_out = true;
  tle.verdict = verdict_of(tle);
  f.worker(0)->take().done(tle);
  std::string m;
  f.svc->render_metrics(&m);
  for (const char* s :
       {"tidepool_fn_queue_depth 0", "tidepool_fn_calls_per_second",
        "tidepool_fn_verdicts_total{verdict=\"time_limit\"} 1",
        "tidepool_fn_verdicts_total{verdict=\"ok\"} 0",
        "tidepool_fn_runs_total{language=\"bash\"} 1", "tidepool_fn_run_seconds_count 1"})
    EXPECT_NE(m.find(s), std::string::npos) << s;
}

// Random runs of several clients, random completion order, workers lost at random: every
// run ends exactly once, nothing stays queued or in flight, and no client ever holds more
// than its limit.
TEST(FunctionService, RandomInterleavingsEndEveryRunOnce) {
  const int seeds = std::getenv("TP_TEST_SEEDS") ? std::atoi(std::getenv("TP_TEST_SEEDS")) : 200;
  for (int seed = 0; seed < seeds; ++seed) {
    std::mt19937 rng(seed);
    Fixture f(1 + rng() % 2, 1 + rng() % 3, 1 + rng() % 3);
    std::vector<int> ended;
    int started = 0;
    const char* langs[] = {"bash", "python", "cpp", "nodejs"};
    for (int step = 0; step < 150; ++step) {
      int op = static_cast<int>(rng() % 10);
      if (op < 4) {
        int id = started++;
        ended.push_back(0);
        std::string lang = langs[rng() % 4];
        std::string client = "c" + std::to_string(rng() % 3);
        // Few distinct programs, so compiles are shared.
        auto j = f.svc->run(client, req(lang, "p" + std::to_string(rng() % 3)),
                            [&ended, id](Result<RunResult>) { ++ended[static_cast<size_t>(id)]; });
        ASSERT_TRUE(j);
        if (rng() % 8 == 0) f.svc->cancel(*j);
      } else if (op < 9) {
        std::vector<std::shared_ptr<FakeWorker>> alive;
        for (size_t i = 0; i < f.workers_made(); ++i)
          if (f.worker(i)->alive() && f.worker(i)->pending()) alive.push_back(f.worker(i));
        if (alive.empty()) continue;
        auto w = alive[rng() % alive.size()];
        auto call = w->take(rng() % w->pending());
        StepResult s = step_exited(rng() % 2);
        s.files.push_back(File{"test", "BIN", 0644});
        call.done(s);
      } else {
        std::vector<std::shared_ptr<FakeWorker>> alive;
        for (size_t i = 0; i < f.workers_made(); ++i)
          if (f.worker(i)->alive()) alive.push_back(f.worker(i));
        if (!alive.empty()) alive[rng() % alive.size()]->lose();
      }
    }
    // Drain: finish everything that is left.
    for (int round = 0; round < 10000; ++round) {
      bool any = false;
      for (size_t i = 0; i < f.workers_made(); ++i) {
        auto w = f.worker(i);
        if (!w->alive() || !w->pending()) continue;
        any = true;
        StepResult s = step_exited(0);
        s.files.push_back(File{"test", "BIN", 0644});
        w->take().done(s);
      }
      if (!any) break;
    }
    auto st = f.svc->status();
    EXPECT_EQ(st.queued, 0u) << "seed " << seed;
    EXPECT_EQ(st.in_flight, 0u) << "seed " << seed;
    for (size_t i = 0; i < ended.size(); ++i)
      ASSERT_EQ(ended[i], 1) << "seed " << seed << " run " << i;
  }
}

}  // namespace
}  // namespace tp::function
