// Teardown pacing (node/sandbox_manager.h): a stop answered ahead leaves its teardown
// for a quiet moment, frozen meanwhile; whoever waits for the end, a full backlog, the
// delay bound or shutdown has it run.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "manager_fixture.h"

namespace tp::node {
namespace {

class TeardownPacingTest : public ManagerTest {
 protected:
  void TearDown() override {
    stop_ = true;
    if (client_.joinable()) client_.join();
    ManagerTest::TearDown();
  }
  // Clients count as busy for quiet_ after their last request, as the warm pools say
  // (WarmPools::busy_for_s); while busy_ is set, a client sends one every millisecond.
  // While it is set they are busy whatever that thread does: stalled for longer than
  // quiet_ on a loaded machine, it must not make them look quiet.
  void make_paced(ManagerOptions o = {}) {
    make(std::move(o));
    mgr_->set_clients_busy([this] {
      if (busy_) return std::chrono::duration<double>(quiet_.load()).count();
      return std::chrono::duration<double>(last_.load() + quiet_.load() - Clock::now()).count();
    });
    if (!client_.joinable())
      client_ = std::thread([this] {
        while (!stop_) {
          if (busy_) last_ = Clock::now();
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      });
  }
  // A deadlock guard, not a timing threshold.
  template <class F>
  void wait_for(F cond, const char* what) {
    for (int i = 0; i < 60000 && !cond(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_TRUE(cond()) << what;
  }
  // Clients stop and the manager sees them quiet.
  void be_quiet() {
    busy_ = false;
    wait_for([&] { return Clock::now() > last_.load() + quiet_.load(); }, "quiet clients");
  }
  SandboxRecord stop_ahead(const std::string& id) {
    auto f = destroy_nowait_async(id);
    auto r = get_or_fail(f);
    EXPECT_TRUE(r) << r.error().message();
    EXPECT_EQ(r ? r->state : "", "stopping");
    return r ? *r : SandboxRecord{};
  }
  // A paced manager whose teardowns may wait an hour, and a sandbox of it whose stop was
  // answered ahead and whose teardown waits.
  std::string deferred_sandbox() {
    ManagerOptions o;
    o.max_teardown_delay = std::chrono::hours(1);
    make_paced(o);
    auto a = create_sync();
    EXPECT_TRUE(a);
    if (!a) return "";
    const uint64_t before = metrics_.teardowns_deferred.load();
    stop_ahead(a->id);
    wait_for([&] { return metrics_.teardowns_deferred.load() == before + 1; },
             "the teardown deferred");
    return a->id;
  }
  bool frozen_for_destroy(const std::string& id) {
    std::lock_guard lk(backend_->mu);
    return backend_->frozen_for_destroy.count(id) > 0;
  }
  // What the fake backend knows of a sandbox, for a failure's message.
  std::string fake_state(const std::string& id) {
    std::lock_guard lk(backend_->mu);
    auto& b = *backend_;
    return "live " + std::to_string(b.live.count(id)) + ", frozen " +
           std::to_string(b.frozen.count(id)) + ", destroyed " +
           std::to_string(b.destroyed.count(id)) + ", released " +
           std::to_string(b.released.count(id)) + ", frozen for destroy " +
           std::to_string(b.frozen_for_destroy.count(id));
  }
  using Clock = std::chrono::steady_clock;
  // Long enough that a stall of the client thread on a loaded machine never looks
  // quiet; the randomised test, which waits for quiet every seed, shortens it.
  std::atomic<Clock::duration> quiet_{std::chrono::seconds(1)};
  std::atomic<bool> busy_{true}, stop_{false};
  std::atomic<Clock::time_point> last_{Clock::now()};
  std::thread client_;
};

TEST_F(TeardownPacingTest, WhileClientsAreBusyTheSandboxIsFrozenAndTornDownOnceTheyAreQuiet) {
  const std::string a = deferred_sandbox();
  ASSERT_FALSE(a.empty());
  // Nothing of it runs, its stop is stored, and no request gets in.
  EXPECT_TRUE(backend_->is_frozen(a));
  EXPECT_TRUE(backend_->is_live(a));
  EXPECT_EQ(stored(a).end_reason, "deleted");
  EXPECT_EQ(stored(a).ended_at_ms, 0);
  ExecParams p;
  p.argv = {"true"};
  EXPECT_EQ(mgr_->exec(a, p, {}).error().code, Code::kConflict);
  // The API shows it stopping (the stored record stays running with its end reason).
  auto g = mgr_->get(a);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->state, "stopping");
  EXPECT_EQ(stored(a).state, "running");
  auto listed = [&](const std::string& state) {
    ListFilter f;
    f.state = state;
    auto l = mgr_->list(f);
    EXPECT_TRUE(l);
    return l && std::any_of(l->begin(), l->end(), [&](const SandboxRecord& r) {
             return r.id == a && r.state == (state.empty() ? "stopping" : state);
           });
  };
  EXPECT_TRUE(listed(""));
  EXPECT_TRUE(listed("stopping"));
  EXPECT_FALSE(listed("running"));
  busy_ = false;
  wait_for([&] { return !backend_->is_live(a); }, "the teardown once quiet");
  wait_for([&] { return stopped_reason(a) == "deleted"; }, "its final record");
  EXPECT_FALSE(backend_->is_frozen(a)) << fake_state(a);
  // The manager forgets a sandbox just after its final record is stored.
  wait_for([&] { return mgr_->live_count() == 0; }, "the manager to forget it");
}

TEST_F(TeardownPacingTest, QuietClientsOrATierThatCannotFreezeHaveItTornDownAtOnce) {
  ManagerOptions o;
  o.max_teardown_delay = std::chrono::hours(1);
  make_paced(o);
  be_quiet();
  auto a = create_sync();
  ASSERT_TRUE(a);
  stop_ahead(a->id);
  wait_for([&] { return stopped_reason(a->id) == "deleted"; }, "a's final record");
  busy_ = true;
  backend_->freeze_fails = true;
  auto b = create_sync();
  ASSERT_TRUE(b);
  stop_ahead(b->id);
  wait_for([&] { return stopped_reason(b->id) == "deleted"; }, "b's final record");
  EXPECT_FALSE(frozen_for_destroy(a->id));
  EXPECT_FALSE(frozen_for_destroy(b->id));
  EXPECT_EQ(metrics_.teardowns_deferred.load(), 0u);
  EXPECT_EQ(backend_->live_count(), 0u);
}

TEST_F(TeardownPacingTest, ADeleteThatWaitsHasADeferredTeardownRunAtOnce) {
  const std::string a = deferred_sandbox();
  ASSERT_FALSE(a.empty());
  auto d = destroy_async(a);  // clients stay busy, and the delay is an hour
  auto r = get_or_fail(d);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->state, "stopped");
  EXPECT_EQ(r->end_reason, "deleted");
  EXPECT_FALSE(backend_->is_live(a));
}

TEST_F(TeardownPacingTest, ADeleteThatWaitsRightAfterAStopAnsweredAheadIsNotHeldBack) {
  ManagerOptions o;
  o.max_teardown_delay = std::chrono::hours(1);
  make_paced(o);  // clients stay busy throughout
  for (int i = 0; i < 20; ++i) {
    auto a = create_sync();
    ASSERT_TRUE(a);
    // The waiting delete may come before or after the stop's op decides to defer.
    auto ahead = destroy_nowait_async(a->id);
    auto waited = destroy_async(a->id);
    // A deadlock guard, not a timing threshold: held back, it would wait an hour.
    if (waited.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      ADD_FAILURE() << "round " << i << ": the waiting delete was held back";
      mgr_->shutdown();  // runs what waits, which answers it
      return;
    }
    auto r = waited.get();
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_EQ(r->state, "stopped");
    EXPECT_FALSE(backend_->is_live(a->id));
    ASSERT_TRUE(get_or_fail(ahead));
  }
}

TEST_F(TeardownPacingTest, NoTeardownWaitsLongerThanTheDelayOrBeyondTheBacklog) {
  ManagerOptions o;
  o.max_deferred_teardowns = 2;
  o.max_teardown_delay = std::chrono::hours(1);
  make_paced(o);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto s = create_sync();
    ASSERT_TRUE(s);
    ids.push_back(s->id);
  }
  // A stop is answered before its sandbox's op defers the teardown, and sandboxes' ops
  // run side by side: the first two are waiting before the third stops.
  for (uint64_t i = 0; i < 2; ++i) {
    stop_ahead(ids[i]);
    wait_for([&] { return metrics_.teardowns_deferred.load() == i + 1; }, "a deferred teardown");
  }
  stop_ahead(ids[2]);
  // The third found two waiting: torn down at once, never frozen.
  wait_for([&] { return stopped_reason(ids[2]) == "deleted"; }, "the third's final record");
  EXPECT_FALSE(frozen_for_destroy(ids[2]));
  EXPECT_TRUE(backend_->is_live(ids[0]) && backend_->is_live(ids[1]));
  EXPECT_EQ(metrics_.teardowns_deferred.load(), 2u);

  // A short delay: clients stay busy, the teardown runs anyway.
  ManagerOptions s;
  s.max_teardown_delay = std::chrono::milliseconds(20);
  make_paced(s);  // (the first manager's sandboxes go with it)
  auto a = create_sync();
  ASSERT_TRUE(a);
  stop_ahead(a->id);
  wait_for([&] { return stopped_reason(a->id) == "deleted"; }, "the teardown after the delay");
  EXPECT_TRUE(frozen_for_destroy(a->id));
  EXPECT_FALSE(backend_->is_live(a->id));
}

TEST_F(TeardownPacingTest, ShutdownTearsDownWhatWaitsEvenWhenItReleasesTheRest) {
  const std::string a = deferred_sandbox();  // (stop_on_exit false: the rest is handed over)
  ASSERT_FALSE(a.empty());
  auto b = create_sync();
  ASSERT_TRUE(b);
  mgr_->shutdown();
  EXPECT_EQ(stopped_reason(a), "deleted");
  EXPECT_FALSE(backend_->is_live(a));
  EXPECT_FALSE(backend_->released.count(a));
  EXPECT_TRUE(backend_->released.count(b->id));
  EXPECT_EQ(stored(b->id).state, "running");
}

TEST_F(TeardownPacingTest, AJobsSandboxIsTornDownAtOnceForItsQuotasCountItUntilThen) {
  ManagerOptions o;
  o.max_teardown_delay = std::chrono::hours(1);
  make_paced(o);
  mgr_->set_admission([](const CreateParams&, const JobUse&) { return Result<void>{}; });
  CreateParams p;
  p.job = "j1";
  auto a = create_sync(p);
  ASSERT_TRUE(a) << a.error().message();
  stop_ahead(a->id);
  wait_for([&] { return stopped_reason(a->id) == "deleted"; }, "its final record");
  EXPECT_FALSE(frozen_for_destroy(a->id));
  EXPECT_EQ(mgr_->job_use("j1").sandboxes, 0u);
}

// Random interleavings of stops answered ahead, waited-for deletes, execs, agent deaths,
// busy and quiet clients, a small backlog and a short delay, then shutdown or quiet:
// every stop is answered once, every sandbox ends stopped, and nothing stays frozen or live.
TEST_F(TeardownPacingTest, RandomInterleavingsEndWithEverySandboxGone) {
  const char* env = std::getenv("TP_TEST_SEEDS");
  // (A quarter of TP_TEST_SEEDS where the sanitizers make each seed slow.)
  const int kSeeds = env && std::atoi(env) > 0 ? std::clamp(std::atoi(env) / 4, 8, 200) : 200;
  quiet_ = std::chrono::milliseconds(10);
  for (int seed = 0; seed < kSeeds; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
    ManagerOptions o;
    o.max_deferred_teardowns = 1 + pick(3);
    o.max_teardown_delay = std::chrono::milliseconds(pick(2) ? 2 : 200);
    o.stop_on_exit = pick(2) == 0;
    busy_ = true;
    make_paced(o);
    std::vector<std::string> ids;
    for (int i = 0, n = 2 + pick(5); i < n; ++i) {
      auto s = create_sync();
      ASSERT_TRUE(s) << s.error().message();
      ids.push_back(s->id);
    }
    std::vector<std::future<Result<SandboxRecord>>> ahead, waited;
    for (int step = 0, n = 4 + pick(12); step < n; ++step) {
      const std::string& id = ids[pick(static_cast<int>(ids.size()))];
      switch (pick(6)) {
        case 0:
        case 1:
          ahead.push_back(destroy_nowait_async(id));
          break;
        case 2:
          waited.push_back(destroy_async(id));
          break;
        case 3: {
          ExecParams p;
          p.argv = {"true"};
          ExecCallbacks cb;
          cb.on_done = [](Result<ExecOutcome>) {};
          (void)mgr_->exec(id, p, cb);
          break;
        }
        case 4:
          busy_ = !busy_;
          break;
        default:
          if (auto a = agent(id)) a->die();
      }
    }
    for (auto& f : ahead) {
      auto r = get_or_fail(f);
      ASSERT_TRUE(r) << "seed " << seed << ": " << r.error().message();
      EXPECT_TRUE(r->state == "stopping" || r->state == "stopped") << "seed " << seed;
    }
    for (auto& f : waited) {
      auto r = get_or_fail(f);
      ASSERT_TRUE(r) << "seed " << seed << ": " << r.error().message();
      EXPECT_EQ(r->state, "stopped") << "seed " << seed;
    }
    if (pick(2)) {
      mgr_->shutdown();  // runs what waits; hands over (or stops) the rest
    } else {
      be_quiet();
      for (const auto& id : ids) {
        auto d = destroy_async(id);
        ASSERT_TRUE(get_or_fail(d)) << "seed " << seed;
      }
    }
    for (const auto& id : ids) {
      if (backend_->released.count(id)) {
        EXPECT_EQ(stored(id).end_reason, "") << "seed " << seed << " handed over after a stop";
        continue;
      }
      wait_for([&] { return stored(id).state == "stopped"; }, "a stopped record");
      EXPECT_FALSE(backend_->is_live(id)) << "seed " << seed << " " << id;
      EXPECT_FALSE(backend_->is_frozen(id)) << "seed " << seed << " " << id;
    }
    wait_for([&] { return mgr_->live_count() == 0; }, "the manager to forget them");
    if (HasFailure()) {
      ADD_FAILURE() << "first failing seed " << seed;
      return;
    }
    busy_ = true;
    // Every answer is in; what an op still posts may need the io threads: wait for it
    // before the next seed's make() replaces the manager.
    for (int i = 0; i < 10000 && Sandbox::ops_in_flight() > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    store_.clear();
  }
  EXPECT_GT(metrics_.teardowns_deferred.load(), static_cast<uint64_t>(kSeeds) / 4)
      << "too few teardowns waited: the interleavings miss the paced path";
}

}  // namespace
}  // namespace tp::node
