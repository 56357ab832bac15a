// Teardown pacing (node/sandbox_manager.h): a stop answered ahead leaves its teardown
// for a quiet moment, frozen meanwhile; whoever waits for the end, a full backlog, the
// delay bound or shutdown has it run.
#include <atomic>
#include <chrono>
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
  // Clients count as busy for kQuiet after their last request, as the warm pools say
  // (WarmPools::busy_for_s); while busy_ is set, a client sends one every millisecond.
  void make_paced(ManagerOptions o = {}) {
    make(std::move(o));
    mgr_->set_clients_busy([this] {
      return std::chrono::duration<double>(last_.load() + kQuiet - Clock::now()).count();
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
    wait_for([&] { return Clock::now() > last_.load() + kQuiet; }, "quiet clients");
  }
  SandboxRecord stop_ahead(const std::string& id) {
    auto f = destroy_nowait_async(id);
    auto r = get_or_fail(f);
    EXPECT_TRUE(r) << r.error().message();
    EXPECT_EQ(r ? r->state : "", "stopping");
    return r ? *r : SandboxRecord{};
  }
  bool frozen_for_destroy(const std::string& id) {
    std::lock_guard lk(backend_->mu);
    return backend_->frozen_for_destroy.count(id) > 0;
  }
  using Clock = std::chrono::steady_clock;
  static constexpr auto kQuiet = std::chrono::milliseconds(10);
  std::atomic<bool> busy_{true}, stop_{false};
  std::atomic<Clock::time_point> last_{Clock::now()};
  std::thread client_;
};

TEST_F(TeardownPacingTest, WhileClientsAreBusyTheSandboxIsFrozenAndTornDownOnceTheyAreQuiet) {
  ManagerOptions o;
  o.max_teardown_delay = std::chrono::hours(1);
  make_paced(o);
  auto a = create_sync();
  ASSERT_TRUE(a);
  stop_ahead(a->id);
  wait_for([&] { return metrics_.teardowns_deferred.load() == 1; }, "the teardown deferred");
  // Nothing of it runs, its stop is stored, and no request gets in.
  EXPECT_TRUE(backend_->is_frozen(a->id));
  EXPECT_TRUE(backend_->is_live(a->id));
  EXPECT_EQ(stored(a->id).end_reason, "deleted");
  EXPECT_EQ(stored(a->id).ended_at_ms, 0);
  ExecParams p;
  p.argv = {"true"};
  EXPECT_EQ(mgr_->exec(a->id, p, {}).error().code, Code::kConflict);
  busy_ = false;
  wait_for([&] { return !backend_->is_live(a->id); }, "the teardown once quiet");
  wait_for([&] { return stopped_reason(a->id) == "deleted"; }, "its final record");
  EXPECT_FALSE(backend_->is_frozen(a->id));
  EXPECT_EQ(mgr_->live_count(), 0u);
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
  ManagerOptions o;
  o.max_teardown_delay = std::chrono::hours(1);
  make_paced(o);
  auto a = create_sync();
  ASSERT_TRUE(a);
  stop_ahead(a->id);
  wait_for([&] { return metrics_.teardowns_deferred.load() == 1; }, "the teardown deferred");
  auto d = destroy_async(a->id);  // clients stay busy, and the delay is an hour
  auto r = get_or_fail(d);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->state, "stopped");
  EXPECT_EQ(r->end_reason, "deleted");
  EXPECT_FALSE(backend_->is_live(a->id));
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
  for (const auto& id : ids) stop_ahead(id);
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
  ManagerOptions o;
  o.max_teardown_delay = std::chrono::hours(1);
  o.stop_on_exit = false;  // the others are handed over to the next daemon
  make_paced(o);
  auto a = create_sync();
  auto b = create_sync();
  ASSERT_TRUE(a && b);
  stop_ahead(a->id);
  wait_for([&] { return metrics_.teardowns_deferred.load() == 1; }, "the teardown deferred");
  mgr_->shutdown();
  EXPECT_EQ(stopped_reason(a->id), "deleted");
  EXPECT_FALSE(backend_->is_live(a->id));
  EXPECT_FALSE(backend_->released.count(a->id));
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

}  // namespace
}  // namespace tp::node
