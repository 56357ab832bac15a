// TrajectoryEvents (node/trajectory_events.h) over a real step log: what each hook
// appends, in which order, and the notes that let a restart record a lost step.
#include "node/trajectory_events.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "temp_step_log.h"

namespace tp::node {
namespace {

namespace fs = std::filesystem;
constexpr const char* kEvSb = "n0-e0e0e0e0e0e0";

class TrajectoryEventsTest : public ::testing::Test {
 protected:
  static control::SandboxRecord record() {
    control::SandboxRecord r;
    r.id = kEvSb;
    r.state = "running";
    r.tier = "container";
    r.image = "app:2";
    r.layers = {"sha256:" + std::string(64, 'c'), "sha256:" + std::string(64, 'd')};
    r.memory_mb = 128;
    r.cpus = 2;
    r.pids = 32;
    r.disk_mb = 50;
    r.ttl_seconds = 60;
    r.idle_timeout_seconds = 5;
    r.labels = {{"k", "v"}};
    r.env = {{"E", "1"}};
    r.created_at_ms = 1000;
    return r;
  }
  std::vector<StepRecord> all() {
    auto r = log_->list(kEvSb, 0, 100, true);
    EXPECT_TRUE(r);
    return r ? *r : std::vector<StepRecord>{};
  }
  testing::TempStepLog tmp_;
  std::shared_ptr<StepLog>& log_ = tmp_.log;
};

TEST_F(TrajectoryEventsTest, ACreatedEventHoldsWhatAReplayNeeds) {
  auto r = record();
  auto back = record_of_created(created_detail(r));
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back->image, r.image);
  EXPECT_EQ(back->layers, r.layers);
  EXPECT_EQ(back->memory_mb, r.memory_mb);
  EXPECT_EQ(back->cpus, r.cpus);
  EXPECT_EQ(back->pids, r.pids);
  EXPECT_EQ(back->disk_mb, r.disk_mb);
  EXPECT_EQ(back->ttl_seconds, r.ttl_seconds);
  EXPECT_EQ(back->idle_timeout_seconds, r.idle_timeout_seconds);
  EXPECT_EQ(back->labels, r.labels);
  EXPECT_EQ(back->env, r.env);
  EXPECT_FALSE(record_of_created("not json"));
  EXPECT_FALSE(record_of_created(R"({"memory_mb":"lots"})"));
}

TEST_F(TrajectoryEventsTest, TheHooksAppendEventsInOrderAndTheEndLast) {
  TrajectoryEvents ev;
  ManagerOptions o;
  ev.attach(o);
  auto r = record();
  o.on_created(r);  // nothing: no log yet
  EXPECT_TRUE(all().empty());
  ev.set_log(log_.get(), true);
  o.on_created(r);  // durable when it returns
  ASSERT_EQ(all().size(), 1u);
  ProcessInfo p;
  p.pid = 3;
  p.argv = {"sleep", "1"};
  p.outcome = ExecOutcome{};
  p.outcome->result.exit_code = 2;
  o.on_process_exit(kEvSb, p);
  log_->hold(kEvSb);  // a call still being answered
  auto ended = record();
  ended.state = "stopped";
  ended.end_reason = "ttl";
  ended.ended_at_ms = 5000;
  o.on_ended(ended);
  StepRecord call;
  call.key = "k";
  call.request.method = "POST";
  call.request.target = std::string("/v1/sandboxes/") + kEvSb + "/exec";
  call.status = 503;
  ASSERT_TRUE(log_->append_sync(kEvSb, call, "{}"));
  log_->release(kEvSb);
  ASSERT_TRUE(log_->append_sync(kEvSb, call, "{}"));  // queued after the end
  auto recs = all();
  ASSERT_EQ(recs.size(), 5u);
  EXPECT_EQ(recs[0].event, "created");
  EXPECT_EQ(recs[1].event, "process_exit");
  EXPECT_NE(recs[1].detail.find(R"("exit_code":2)"), std::string::npos) << recs[1].detail;
  EXPECT_EQ(recs[2].kind, StepKind::kCall);  // the held call before the end
  EXPECT_EQ(recs[3].event, "ended");
  EXPECT_NE(recs[3].detail.find(R"("end_reason":"ttl")"), std::string::npos) << recs[3].detail;
  EXPECT_TRUE(log_->info(kEvSb).ended);
  ev.set_log(nullptr, false);
}

TEST_F(TrajectoryEventsTest, WithoutEventsOnlyTheRetentionClockStarts) {
  TrajectoryEvents ev;
  ManagerOptions o;
  ev.attach(o);
  ev.set_log(log_.get(), false);
  o.on_created(record());
  o.on_process_exit(kEvSb, ProcessInfo{});
  o.on_ended(record());
  EXPECT_TRUE(all().empty());
  ev.set_log(nullptr, false);
}

TEST_F(TrajectoryEventsTest, AStepLostInARestartIsRecordedAs503UnlessItWasAnswered) {
  StepFingerprint fp{"POST", std::string("/v1/sandboxes/") + kEvSb + "/exec",
                     std::string(32, '\x7f'), 12};
  std::string tag = step_tag("T/4", fp, R"({"transport":"tcp"})");
  auto rec = step_lost_record(tag, 0, 42);
  ASSERT_TRUE(rec) << rec.error().message();
  EXPECT_EQ(rec->key, "T/4");
  EXPECT_EQ(rec->request, fp);  // a retry of the same request matches it (no 409)
  EXPECT_EQ(rec->status, 503);
  EXPECT_NE(rec->answer.find("stopped"), std::string::npos);
  EXPECT_NE(step_lost_record(tag, 9, 42)->answer.find("background process 9"), std::string::npos);
  EXPECT_FALSE(step_lost_record("{}", 0, 1));
  TrajectoryEvents ev;
  ManagerOptions o;
  ev.attach(o);
  ev.set_log(log_.get(), false);
  o.on_step_lost(kEvSb, tag, 0);
  auto loc = log_->find("T/4");
  ASSERT_TRUE(loc);
  auto got = log_->read(*loc, true);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 503);
  EXPECT_EQ(got->caller, R"({"transport":"tcp"})");
  o.on_step_lost(kEvSb, tag, 0);  // recorded already: not again
  EXPECT_EQ(all().size(), 1u);
  ev.set_log(nullptr, false);
}

}  // namespace
}  // namespace tp::node
