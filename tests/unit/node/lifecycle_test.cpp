// WarmPools and JobManager over a real SandboxManager (fake backend and agents, the
// in-memory stores) with their clocks in the test's hands: pools hand out each
// sandbox once and refill, refills wait for clients, leases pause and reclaim,
// quotas name what they refuse.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "control/doc_store.h"
#include "manager_fixture.h"
#include "node/jobs.h"
#include "node/pools.h"

namespace tp::node {
namespace {

using control::JobRecord;
using control::TemplateRecord;

// Polls `cond` (a deadlock guard, not a timing threshold).
template <class F>
bool eventually(F cond) {
  for (int i = 0; i < 6000; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

class LifecycleTest : public ManagerTest {
 protected:
  void SetUp() override {
    ManagerTest::SetUp();
    make();
  }
  void TearDown() override {
    // Refills still in flight would answer into a torn-down fixture.
    if (pools_) {
      EXPECT_TRUE(eventually([&] {
        for (const auto& p : pools_->status())
          if (p.creating) return false;
        return true;
      }));
    }
    pools_.reset();
    jobs_.reset();
    ManagerTest::TearDown();
  }
  void make_pools(WarmPools::Options o = {}) {
    o.tick = std::chrono::hours(1);  // the test ticks
    // Every read moves the clock on a little, so a refill takes measurable time.
    o.now_s = [this] { return clock_s_.fetch_add(0.001); };
    pools_ = std::make_unique<WarmPools>(*mgr_, templates_, metrics_, o);
    ASSERT_TRUE(pools_->start());
  }
  void make_jobs() {
    JobManager::Options o;
    o.tick = std::chrono::hours(1);
    o.now_ms = [this] { return clock_ms_.load(); };
    jobs_ = std::make_unique<JobManager>(*mgr_, job_store_, metrics_, o);
    ASSERT_TRUE(jobs_->start());
  }
  TemplateRecord tpl(const std::string& name, uint32_t min, uint32_t max) {
    TemplateRecord t;
    t.name = name;
    t.memory_mb = 256;
    t.pool_min = min;
    t.pool_max = max;
    return t;
  }
  PoolStatus pool(const std::string& name) {
    for (auto& s : pools_->status())
      if (s.template_name == name) return s;
    ADD_FAILURE() << "no pool " << name;
    return {};
  }
  // Ticks until the pool holds `n` ready (refills are asynchronous).
  bool fill(const std::string& name, uint32_t n) {
    return eventually([&] {
      pools_->tick();
      return pool(name).ready >= n && pool(name).creating == 0;
    });
  }
  std::pair<Result<SandboxRecord>, bool> pool_create(CreateParams p) {
    auto pr = std::make_shared<std::promise<std::pair<Result<SandboxRecord>, bool>>>();
    auto f = pr->get_future();
    pools_->create(std::move(p), [pr](Result<SandboxRecord> r, bool from_pool) {
      pr->set_value({std::move(r), from_pool});
    });
    return get_or_fail(f);
  }
  Result<SandboxRecord> job_create(const std::string& job, const std::string& step = "",
                                   uint64_t memory_mb = 512) {
    CreateParams p;
    p.job = job;
    p.step = step;
    p.memory_mb = memory_mb;
    return create_sync(p);
  }

  control::MemoryDocStore template_docs_, job_docs_;
  control::TemplateStore templates_{template_docs_};
  control::JobStore job_store_{job_docs_};
  std::atomic<double> clock_s_{1000};
  std::atomic<int64_t> clock_ms_{1'700'000'000'000};
  std::unique_ptr<WarmPools> pools_;
  std::unique_ptr<JobManager> jobs_;
};

TEST_F(LifecycleTest, APoolRefillsAfterUseAndNeverHandsOutAUsedSandbox) {
  make_pools();
  ASSERT_TRUE(pools_->put_template(tpl("py", 2, 2)));
  ASSERT_TRUE(fill("py", 2));
  EXPECT_TRUE(ids_live().empty()) << "pooled sandboxes are not the client's";
  std::set<std::string> handed;
  for (int round = 0; round < 4; ++round) {
    CreateParams p;
    p.template_name = "py";
    p.labels = {{"round", std::to_string(round)}};
    auto [r, from_pool] = pool_create(p);
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_TRUE(from_pool);
    EXPECT_FALSE(r->pooled);
    EXPECT_EQ(r->template_name, "py");
    EXPECT_EQ(r->memory_mb, 256u);  // the template's
    EXPECT_EQ(r->labels.at("round"), std::to_string(round));
    EXPECT_TRUE(handed.insert(r->id).second) << r->id << " handed out twice";
    // Used and deleted: it must never come back.
    auto d = destroy_async(r->id);
    ASSERT_TRUE(get_or_fail(d));
    ASSERT_TRUE(fill("py", 2));
  }
  EXPECT_EQ(pool("py").hits, 4u);
  // The sandboxes still pooled are fresh ones, none of those handed out.
  for (const auto& r : mgr_->pooled()) EXPECT_FALSE(handed.count(r.id)) << r.id;
  EXPECT_EQ(mgr_->pooled().size(), 2u);
}

TEST_F(LifecycleTest, ARequestOfATemplatesShapeIsServedByItsPoolAndAnEmptyPoolGoesCold) {
  make_pools();
  ASSERT_TRUE(pools_->put_template(tpl("small", 1, 1)));
  ASSERT_TRUE(fill("small", 1));
  CreateParams same;
  same.memory_mb = 256;  // image, tier, cpus, pids, disk as the defaults: the same shape
  auto [a, pa] = pool_create(same);
  ASSERT_TRUE(a);
  EXPECT_TRUE(pa);
  auto [b, pb] = pool_create(same);  // the pool is empty now: made cold
  ASSERT_TRUE(b);
  EXPECT_FALSE(pb);
  EXPECT_EQ(pool("small").misses, 1u);
  CreateParams other;
  other.memory_mb = 300;
  auto [c, pc] = pool_create(other);
  ASSERT_TRUE(c);
  EXPECT_FALSE(pc);
  CreateParams missing;
  missing.template_name = "nope";
  auto [d, pd] = pool_create(missing);
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code, Code::kNotFound);
  EXPECT_NE(d.error().message().find("nope"), std::string::npos);
}

// A request that names a template and sets its own shape gets that shape, made cold;
// the template's pool keeps its sandbox.
TEST_F(LifecycleTest, ARequestThatSetsItsOwnShapeOverItsTemplateIsMadeCold) {
  make_pools();
  ASSERT_TRUE(pools_->put_template(tpl("py", 1, 1)));
  ASSERT_TRUE(fill("py", 1));
  CreateParams p;
  p.template_name = "py";
  p.memory_mb = 1024;
  p.given = {"memory_mb"};
  auto [r, from_pool] = pool_create(p);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_FALSE(from_pool);
  EXPECT_EQ(r->memory_mb, 1024u);
  EXPECT_EQ(r->template_name, "py");
  EXPECT_EQ(pool("py").ready, 1u);
  // Setting a field to the template's own value is the template's shape: pooled.
  p.memory_mb = 256;
  auto [same, pooled] = pool_create(p);
  ASSERT_TRUE(same);
  EXPECT_TRUE(pooled);
}

TEST_F(LifecycleTest, RefillsWaitWhileAClientsColdWorkIsInFlight) {
  make_pools();
  ASSERT_TRUE(pools_->put_template(tpl("t", 3, 3)));
  pools_->client_work(+1);
  for (int i = 0; i < 5; ++i) pools_->tick();
  EXPECT_EQ(pool("t").creating, 0u);
  EXPECT_EQ(pool("t").ready, 0u);
  pools_->client_work(-1);
  pools_->tick();
  EXPECT_LE(pool("t").creating, 1u) << "one refill at a time";
  EXPECT_GE(pool("t").creating + pool("t").ready, 1u);
  ASSERT_TRUE(fill("t", 3));
}

TEST_F(LifecycleTest, RefillsWaitWhileClientsAreBusyUnlessThePoolIsDownToAQuarter) {
  WarmPools::Options o;
  o.quiet_s = 100;  // busy from a request until the clock moves on by 100 s
  make_pools(o);
  ASSERT_TRUE(pools_->put_template(tpl("t", 8, 8)));
  ASSERT_TRUE(fill("t", 8));  // no request yet: quiet
  CreateParams p;
  p.template_name = "t";
  ASSERT_TRUE(pool_create(p).first);
  pools_->client_request();
  for (int i = 0; i < 5; ++i) pools_->tick();
  EXPECT_EQ(pool("t").creating, 0u) << "a refill started while clients were busy";
  EXPECT_EQ(pool("t").ready, 7u);
  // Down to 1 of 8 (under a quarter): it refills while clients are busy, up to a quarter.
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(pool_create(p).first);
  pools_->client_request();
  ASSERT_TRUE(fill("t", 2));
  for (int i = 0; i < 5; ++i) pools_->tick();
  EXPECT_EQ(pool("t").creating, 0u);
  EXPECT_EQ(pool("t").ready, 2u) << "refilled beyond a quarter while clients were busy";
  // Quiet again: the rest.
  clock_s_.fetch_add(200);
  ASSERT_TRUE(fill("t", 8));
  EXPECT_EQ(pool("t").hits, 7u);
}

TEST_F(LifecycleTest, ThePoolTargetFollowsDemandWithinItsBoundsAndTheBudget) {
  WarmPools::Options o;
  o.budget_mb = 4;
  o.idle_cost_kb = 1024;  // four pooled sandboxes at most, all pools together
  make_pools(o);
  ASSERT_TRUE(pools_->put_template(tpl("d", 1, 50)));
  ASSERT_TRUE(fill("d", 1));
  EXPECT_EQ(pool("d").target, 1u) << "no demand: the minimum";
  // 20 requests a second for a while: the rate follows, and the target with it.
  std::atomic<int> answered{0};
  const int kSeconds = 10, kPerSecond = 20;
  for (int s = 0; s < kSeconds; ++s) {
    for (int i = 0; i < kPerSecond; ++i) {
      CreateParams p;
      p.template_name = "d";
      pools_->create(p, [&](Result<SandboxRecord> r, bool) {
        EXPECT_TRUE(r);
        answered++;
      });
    }
    clock_s_ = clock_s_ + 1.0;
    pools_->tick();
  }
  ASSERT_TRUE(eventually([&] { return answered == kSeconds * kPerSecond; }));
  EXPECT_GT(pool("d").rate, 5);  // 20/s for one half-life: about half of it
  EXPECT_GT(pool("d").cold_seconds, 0) << "measured by the refills and the cold creates";
  EXPECT_LE(pool("d").target, 50u);  // rate x cold time (PoolTarget), within the bounds
  ASSERT_TRUE(eventually([&] {
    pools_->tick();
    return pool("d").creating == 0;
  }));
  EXPECT_LE(mgr_->pooled().size(), 4u) << "over the node-wide budget";
  // Demand gone: the rate decays and the pool shrinks back to its minimum.
  for (int s = 0; s < 300; ++s) {
    clock_s_ = clock_s_ + 1.0;
    pools_->tick();
  }
  EXPECT_EQ(pool("d").target, 1u);
  EXPECT_LE(pool("d").ready, 1u);
}

TEST(PoolTarget, IsDemandTimesColdCreateRoundedUpWithinTheBounds) {
  EXPECT_EQ(pool_target(0, 0.1, 0, 10), 0u);
  EXPECT_EQ(pool_target(0, 0.1, 2, 10), 2u);
  EXPECT_EQ(pool_target(20, 0.5, 0, 100), 10u);
  EXPECT_EQ(pool_target(21, 0.5, 0, 100), 11u);  // 10.5, rounded up
  EXPECT_EQ(pool_target(1000, 0.5, 0, 100), 100u);
  EXPECT_EQ(pool_target(3, 0.1, 0, 100), 1u);
  EXPECT_EQ(pool_target(-1, 0.1, 1, 0), 1u);  // min wins over a smaller max
}

TEST_F(LifecycleTest, ReplacingATemplateDrainsItsPoolAndDeletingForgetsIt) {
  make_pools();
  ASSERT_TRUE(pools_->put_template(tpl("r", 2, 2)));
  ASSERT_TRUE(fill("r", 2));
  auto old = mgr_->pooled();
  ASSERT_EQ(old.size(), 2u);
  auto t = tpl("r", 2, 2);
  t.memory_mb = 128;
  EXPECT_EQ(pools_->put_template(t).error().code, Code::kConflict) << "version 0 only creates";
  t.version = pools_->get_template("r")->version;
  ASSERT_TRUE(pools_->put_template(t));
  ASSERT_TRUE(eventually([&] {
    for (const auto& r : old)
      if (stored(r.id).state != "stopped") return false;
    return true;
  }));
  for (const auto& r : old) EXPECT_EQ(stored(r.id).end_reason, "pool_drained");
  ASSERT_TRUE(fill("r", 2));
  for (const auto& r : mgr_->pooled()) EXPECT_EQ(r.memory_mb, 128u);
  ASSERT_TRUE(pools_->remove_template("r"));
  EXPECT_TRUE(eventually([&] { return mgr_->pooled().empty(); }));
  EXPECT_EQ(pools_->get_template("r").error().code, Code::kNotFound);
}

TEST_F(LifecycleTest, AnInvalidTemplateIsRefusedWithItsReason) {
  make_pools();
  auto bad = tpl("x", 3, 2);
  auto r = pools_->put_template(bad);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kInvalidArgument);
  EXPECT_NE(r.error().message().find("pool_min"), std::string::npos);
  bad = tpl("bad name", 0, 0);
  EXPECT_EQ(pools_->put_template(bad).error().code, Code::kInvalidArgument);
}

TEST_F(LifecycleTest, ALapsedLeasePausesItsSandboxesAndGraceExpiryReclaimsThem) {
  make_jobs();
  JobRecord spec;
  spec.lease_seconds = 10;
  spec.grace_seconds = 20;
  auto j = jobs_->create(spec);
  ASSERT_TRUE(j) << j.error().message();
  auto a = job_create(j->id), b = job_create(j->id);
  ASSERT_TRUE(a && b);
  clock_ms_ += 9'000;
  jobs_->tick();
  EXPECT_EQ(jobs_->get(j->id)->job.state, "active");
  clock_ms_ += 2'000;
  jobs_->tick();
  EXPECT_EQ(jobs_->get(j->id)->job.state, "lapsed");
  ASSERT_TRUE(eventually([&] { return stored(a->id).state == "paused"; }));
  ASSERT_TRUE(eventually([&] { return stored(b->id).state == "paused"; }));
  EXPECT_EQ(jobs_->get(j->id)->paused, 2u);
  // A lapsed job takes no new sandboxes.
  auto refused = job_create(j->id);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, Code::kConflict);
  EXPECT_NE(refused.error().message().find("lapsed"), std::string::npos);
  // The trainer is back: its job is active again, and a request resumes a sandbox.
  ASSERT_TRUE(jobs_->heartbeat(j->id));
  EXPECT_EQ(jobs_->get(j->id)->job.state, "active");
  ExecParams ep;
  ep.argv = {"true"};
  ExecCallbacks cb;
  cb.on_done = [](Result<ExecOutcome>) {};
  ASSERT_TRUE(mgr_->exec(a->id, ep, cb));
  EXPECT_EQ(mgr_->get(a->id)->state, "running");
  // Lapses again, and the grace period runs out: everything is reclaimed.
  clock_ms_ += 11'000;
  jobs_->tick();
  EXPECT_EQ(jobs_->get(j->id)->job.state, "lapsed");
  clock_ms_ += 19'000;
  jobs_->tick();
  EXPECT_EQ(jobs_->get(j->id)->job.state, "lapsed");
  clock_ms_ += 2'000;
  jobs_->tick();
  auto ended = jobs_->get(j->id);
  ASSERT_TRUE(ended);
  EXPECT_EQ(ended->job.state, "ended");
  EXPECT_EQ(ended->job.end_reason, "expired");
  for (const auto& id : {a->id, b->id}) {
    ASSERT_TRUE(eventually([&] { return stored(id).state == "stopped"; })) << id;
    EXPECT_EQ(stored(id).end_reason, "lease_expired");
    EXPECT_FALSE(backend_->is_live(id));
    EXPECT_FALSE(backend_->is_frozen(id));
  }
  EXPECT_EQ(jobs_->heartbeat(j->id).error().code, Code::kConflict);
}

TEST_F(LifecycleTest, QuotaRefusalsNameTheQuotaItsUseAndItsLimit) {
  make_jobs();
  JobRecord spec;
  spec.quota.sandboxes = 2;
  spec.quota.memory_mb = 1000;
  auto j = jobs_->create(spec);
  ASSERT_TRUE(j);
  ASSERT_TRUE(job_create(j->id, "", 400));
  auto mem = job_create(j->id, "", 700);
  ASSERT_FALSE(mem);
  EXPECT_EQ(mem.error().code, Code::kResourceExhausted);
  EXPECT_NE(mem.error().message().find("memory_mb quota: 400 in use + 700 asked > limit 1000"),
            std::string::npos)
      << mem.error().message();
  ASSERT_TRUE(job_create(j->id, "", 400));
  auto count = job_create(j->id, "", 16);
  ASSERT_FALSE(count);
  EXPECT_NE(count.error().message().find("sandboxes quota: 2 in use + 1 asked > limit 2"),
            std::string::npos)
      << count.error().message();
  auto v = jobs_->get(j->id);
  EXPECT_EQ(v->use.sandboxes, 2u);
  EXPECT_EQ(v->use.memory_mb, 800u);
  auto none = job_create("job-000000000000");
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, Code::kNotFound);
}

// A job at its quota asks for a pooled template: refused, and the pool keeps every
// sandbox (it used to lose each one it tried, and those stayed alive, hidden).
TEST_F(LifecycleTest, AClaimRefusedByItsJobLeavesThePoolWhole) {
  make_pools();
  make_jobs();
  JobRecord spec;
  spec.quota.sandboxes = 1;
  auto j = jobs_->create(spec);
  ASSERT_TRUE(j) << j.error().message();
  ASSERT_TRUE(pools_->put_template(tpl("py", 2, 2)));
  ASSERT_TRUE(fill("py", 2));
  CreateParams p;
  p.template_name = "py";
  p.job = j->id;
  auto [a, pa] = pool_create(p);
  ASSERT_TRUE(a) << a.error().message();
  EXPECT_TRUE(pa);
  ASSERT_TRUE(fill("py", 2));
  auto [b, pb] = pool_create(p);
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().code, Code::kResourceExhausted);
  EXPECT_FALSE(pb);
  EXPECT_EQ(pool("py").ready, 2u);
  EXPECT_EQ(mgr_->pooled().size(), 2u);
  EXPECT_EQ(pool("py").hits, 1u);
  // Both are still handed out, to a request the job's quota does not hold back.
  CreateParams free;
  free.template_name = "py";
  for (int i = 0; i < 2; ++i) {
    auto [c, pc] = pool_create(free);
    ASSERT_TRUE(c) << c.error().message();
    EXPECT_TRUE(pc);
  }
}

TEST_F(LifecycleTest, EndingAStepReclaimsOnlyItsSandboxesAndEndingTheJobAllOfThem) {
  make_jobs();
  auto j = jobs_->create({});
  ASSERT_TRUE(j);
  auto s1a = job_create(j->id, "s1"), s1b = job_create(j->id, "s1"), s2 = job_create(j->id, "s2");
  auto free = create_sync();
  ASSERT_TRUE(s1a && s1b && s2 && free);
  auto pr = std::make_shared<std::promise<Result<uint64_t>>>();
  auto f = pr->get_future();
  jobs_->end_step(j->id, "s1", [pr](Result<uint64_t> n) { pr->set_value(n); });
  auto n = get_or_fail(f);
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 2u);
  for (const auto& id : {s1a->id, s1b->id}) {
    ASSERT_TRUE(eventually([&] { return stored(id).state == "stopped"; }));
    EXPECT_EQ(stored(id).end_reason, "step_ended");
  }
  EXPECT_EQ(stored(s2->id).state, "running");
  auto pe = std::make_shared<std::promise<Result<JobRecord>>>();
  auto fe = pe->get_future();
  jobs_->end(j->id, [pe](Result<JobRecord> r) { pe->set_value(r); });
  auto e = get_or_fail(fe);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->state, "ended");
  ASSERT_TRUE(eventually([&] { return stored(s2->id).state == "stopped"; }));
  EXPECT_EQ(stored(s2->id).end_reason, "job_ended");
  EXPECT_EQ(stored(free->id).state, "running") << "not the job's";
  auto late = job_create(j->id);
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().code, Code::kNotFound);
}

TEST_F(LifecycleTest, JobsAndTheirLeasesSurviveARestartAndWhatCameDueMeanwhileHappens) {
  make_jobs();
  JobRecord spec;
  spec.lease_seconds = 5;
  spec.grace_seconds = 5;
  auto j = jobs_->create(spec);
  ASSERT_TRUE(j);
  auto sb = job_create(j->id);
  ASSERT_TRUE(sb);
  jobs_.reset();  // the daemon goes away
  clock_ms_ += 6'000;
  make_jobs();  // ... and its successor ticks at start: the lease has lapsed
  EXPECT_EQ(jobs_->get(j->id)->job.state, "lapsed");
  ASSERT_TRUE(eventually([&] { return stored(sb->id).state == "paused"; }));
  EXPECT_EQ(jobs_
                ->create([] {
                  JobRecord r;
                  r.lease_seconds = 0;
                  return r;
                }())
                .error()
                .code,
            Code::kInvalidArgument);
}

}  // namespace
}  // namespace tp::node
