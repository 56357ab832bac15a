// SandboxManager with a fake backend, the in-memory store and fake agents:
// every race the header documents ends in one stored, answered state.
#include "node/sandbox_manager.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "control/memory_store.h"
#include "fakes.h"
#include "manager_fixture.h"

namespace tp::node {
namespace {

TEST_F(ManagerTest, CreateThenDelete) {
  make();
  auto r = create_sync();
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->state, "running");
  EXPECT_EQ(stored(r->id).state, "running");
  EXPECT_TRUE(backend_->is_live(r->id));
  auto d = destroy_async(r->id);
  auto fin = get_or_fail(d);
  ASSERT_TRUE(fin);
  EXPECT_EQ(fin->state, "stopped");
  EXPECT_EQ(fin->end_reason, "deleted");
  auto s = stored(r->id);
  EXPECT_EQ(s.state, "stopped");
  EXPECT_EQ(s.end_reason, "deleted");
  EXPECT_EQ(s.version, 2u);  // running, stopped (a creating sandbox is not stored)
  EXPECT_EQ(backend_->live_count(), 0u);
  EXPECT_EQ(mgr_->live_count(), 0u);
  // Deleting again answers the final record.
  auto again = destroy_async(r->id);
  auto a = get_or_fail(again);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->end_reason, "deleted");
  auto nf = destroy_async("n0-nothere");
  EXPECT_EQ(get_or_fail(nf).error().code, Code::kNotFound);
}

TEST_F(ManagerTest, DeleteDuringCreateAnswersConflictAndStoresStopped) {
  backend_->hold_creates = true;
  make();
  auto [id, created] = create_async();
  ASSERT_FALSE(id.empty());
  backend_->wait_entered(id);
  EXPECT_EQ(mgr_->get(id)->state, "creating");
  // Only in memory while it is created: listed, but not stored yet.
  auto listed = mgr_->list({});
  ASSERT_TRUE(listed);
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].state, "creating");
  ASSERT_TRUE(store_.get(id));
  EXPECT_FALSE(store_.get(id)->has_value());
  auto deleted = destroy_async(id);
  // The create is still held: exec is refused already.
  auto ex = mgr_->exec(id, ExecParams{}, ExecCallbacks{});
  ASSERT_FALSE(ex);
  EXPECT_EQ(ex.error().code, Code::kConflict);
  backend_->release_create(id);
  auto c = get_or_fail(created);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, Code::kConflict);
  EXPECT_NE(c.error().message().find("deleted while creating"), std::string::npos)
      << c.error().message();
  auto d = get_or_fail(deleted);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->state, "stopped");
  EXPECT_EQ(d->end_reason, "deleted");
  EXPECT_EQ(stopped_reason(id), "deleted");
  EXPECT_EQ(backend_->live_count(), 0u);
  EXPECT_TRUE(backend_->destroyed.count(id));
  expect_consistent(false);
}

TEST_F(ManagerTest, DeleteRightAfterCreateLeavesNothing) {
  backend_->hold_creates = true;
  make();
  auto [id, created] = create_async();
  auto deleted = destroy_async(id);
  backend_->release_create(id);
  auto c = get_or_fail(created);
  ASSERT_FALSE(c);
  auto d = get_or_fail(deleted);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->end_reason, "deleted");
  EXPECT_EQ(backend_->live_count(), 0u);
  expect_consistent(false);
}

TEST_F(ManagerTest, ExecDuringDeleteIsRefusedAndRunningExecFails) {
  make();
  auto r = create_sync();
  ASSERT_TRUE(r);
  auto done = std::make_shared<std::promise<Result<ExecOutcome>>>();
  auto fdone = done->get_future();
  ExecCallbacks cb;
  cb.on_done = [done](Result<ExecOutcome> o) { done->set_value(o); };
  ExecParams p;
  p.argv = {"sleep", "100"};
  ASSERT_TRUE(mgr_->exec(r->id, p, cb));
  auto d = destroy_async(r->id);
  auto ex = mgr_->exec(r->id, p, ExecCallbacks{});
  ASSERT_FALSE(ex);
  EXPECT_EQ(ex.error().code, Code::kConflict);
  auto o = get_or_fail(fdone);
  ASSERT_FALSE(o);
  EXPECT_EQ(o.error().code, Code::kUnavailable);
  ASSERT_TRUE(get_or_fail(d));
  auto after = mgr_->exec(r->id, p, ExecCallbacks{});
  ASSERT_FALSE(after);
  EXPECT_EQ(after.error().code, Code::kConflict);
  EXPECT_FALSE(mgr_->ref(r->id));
}

// oom_killed: only a command killed by SIGKILL while the sandbox's OOM-kill count
// rose (read after the exec went to the agent, and again at its end); not when the
// count before it could not be read.
TEST_F(ManagerTest, ExecReportsAnOomKillOnlyWhenTheCountRoseDuringIt) {
  make();
  auto r = create_sync();
  ASSERT_TRUE(r);
  auto a = agent(r->id);
  int reads = 0;  // oom_kills() calls so far
  // Runs command `id`; `meanwhile` runs once the count before it was read (or not).
  auto run = [&](uint32_t id, int signal, const std::function<void()>& meanwhile) {
    auto done = std::make_shared<std::promise<Result<ExecOutcome>>>();
    auto f = done->get_future();
    ExecCallbacks cb;
    cb.on_done = [done](Result<ExecOutcome> o) { done->set_value(o); };
    ExecParams p;
    p.argv = {"eat"};
    auto eid = mgr_->exec(r->id, p, cb);
    EXPECT_EQ(eid.value_or(0), id);
    backend_->wait_oom_reads(++reads);
    meanwhile();
    a->finish(id, "", signal ? -1 : 0, signal);
    if (signal == 9) ++reads;  // read again at its end
    auto o = get_or_fail(f);
    EXPECT_TRUE(o);
    return o && o->oom_killed;
  };
  auto oom_kill = [&] {
    std::lock_guard lk(backend_->mu);
    backend_->oom_kills[r->id]++;
  };
  EXPECT_TRUE(run(1, 9, oom_kill));
  EXPECT_FALSE(run(2, 9, [] {}));     // killed, but no OOM kill meanwhile
  EXPECT_FALSE(run(3, 0, oom_kill));  // another process was OOM-killed; it exited
  {
    std::lock_guard lk(backend_->mu);
    backend_->oom_unreadable.insert(r->id);
  }
  // The count before it unknown: not reported, though it rose.
  EXPECT_FALSE(run(4, 9, [&] {
    {
      std::lock_guard lk(backend_->mu);
      backend_->oom_unreadable.erase(r->id);
    }
    oom_kill();
  }));
  auto d = destroy_async(r->id);
  ASSERT_TRUE(get_or_fail(d));
}

TEST_F(ManagerTest, TtlExpiryThenDeleteTheFirstReasonWins) {
  make();
  CreateParams p;
  p.ttl_seconds = 0;
  auto r = create_sync(p);
  ASSERT_TRUE(r);
  mgr_->tick();
  auto d = destroy_async(r->id);
  auto fin = get_or_fail(d);
  ASSERT_TRUE(fin);
  EXPECT_EQ(fin->end_reason, "ttl");
  EXPECT_EQ(stored(r->id).end_reason, "ttl");
  expect_consistent(false);
}

TEST_F(ManagerTest, AgentNotReadyFailsTheCreate) {
  agent_ready_ = false;
  make();
  auto [id, created] = create_async();
  auto c = get_or_fail(created);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, Code::kInternal);
  // The answer comes after the stop: the record is final already.
  EXPECT_EQ(stopped_reason(id), "failed");
  EXPECT_EQ(backend_->live_count(), 0u);
}

TEST_F(ManagerTest, BackendFailureStoresFailed) {
  backend_->fail_creates = true;
  make();
  auto [id, created] = create_async();
  ASSERT_FALSE(get_or_fail(created));
  EXPECT_EQ(stopped_reason(id), "failed");
  EXPECT_EQ(mgr_->live_count(), 0u);
}

TEST_F(ManagerTest, AgentDeathStopsTheSandbox) {
  make();
  auto r = create_sync();
  ASSERT_TRUE(r);
  agent(r->id)->die();
  for (int i = 0; i < 6000 && mgr_->live_count() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(stopped_reason(r->id), "failed");
  EXPECT_EQ(backend_->live_count(), 0u);
}

// Its agent dies while it is paused: it fails as a running one would, instead of
// being answered as paused (and running again later) with nobody to serve it.
// Ids made for creates refused before their sandbox existed go back (the trajectory
// log's spares: they stayed taken until the daemon stopped).
TEST_F(ManagerTest, AnIdOfARefusedCreateIsDropped) {
  std::mutex m;
  std::vector<std::pair<std::string, bool>> dropped;
  int made = 0;
  ManagerOptions o;
  o.new_id = [&] {
    std::lock_guard lk(m);
    return "n0-" + std::to_string(++made);
  };
  o.drop_id = [&](const std::string& id, bool unseen) {
    std::lock_guard lk(m);
    dropped.emplace_back(id, unseen);
  };
  make(o);
  mgr_->set_admission([](const CreateParams&, const JobUse&) -> Result<void> {
    return fail(Code::kResourceExhausted, "sandboxes quota: full");
  });
  CreateParams p;
  p.job = "job-1";
  auto refused = create_sync(p);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, Code::kResourceExhausted);
  auto ok = create_sync();
  ASSERT_TRUE(ok);
  mgr_->shutdown();
  auto late = create_sync();
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().code, Code::kUnavailable);
  std::lock_guard lk(m);
  EXPECT_EQ(dropped, (std::vector<std::pair<std::string, bool>>{{"n0-1", true}, {"n0-3", true}}));
  EXPECT_EQ(ok->id, "n0-2");
}

TEST_F(ManagerTest, AgentDeathWhilePausedStopsTheSandbox) {
  make();
  auto r = create_sync();
  ASSERT_TRUE(r);
  auto paused = record_future([&](auto cb) { mgr_->pause(r->id, cb); });
  ASSERT_TRUE(get_or_fail(paused));
  agent(r->id)->die();
  for (int i = 0; i < 6000 && mgr_->live_count() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(stopped_reason(r->id), "failed");
  EXPECT_EQ(backend_->live_count(), 0u);
  EXPECT_FALSE(backend_->is_frozen(r->id));
}

// Its agent reports ready and its connection closes before the create is done with
// it: the create fails, or (when the ready was handled first) the sandbox fails at
// once. Never a sandbox answered and stored running with nobody to serve it.
TEST_F(ManagerTest, AgentDeathJustAfterItsReadyFailsTheSandbox) {
  agent_dies_at_ready_ = true;
  make();
  for (int i = 0; i < 20; ++i) {
    auto [id, created] = create_async();
    (void)get_or_fail(created);
    for (int j = 0; j < 6000 && mgr_->live_count() > 0; ++j)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(stopped_reason(id), "failed") << "round " << i;
  }
  EXPECT_EQ(backend_->live_count(), 0u);
}

TEST_F(ManagerTest, StoreFailureKeepsTheFinalRecordUntilItCanBeStored) {
  make();
  auto r = create_sync();
  ASSERT_TRUE(r);
  store_.fail_writes(true);
  auto d = destroy_async(r->id);
  ASSERT_TRUE(get_or_fail(d));
  EXPECT_EQ(stored(r->id).state, "running");      // not written
  EXPECT_EQ(mgr_->get(r->id)->state, "stopped");  // but answered as it is
  EXPECT_EQ(mgr_->get(r->id)->end_reason, "deleted");
  store_.fail_writes(false);
  mgr_->tick();
  EXPECT_EQ(stopped_reason(r->id), "deleted");
  EXPECT_EQ(mgr_->live_count(), 0u);
}

// The first write of a record is its insert once the sandbox runs: when that fails, the
// create fails, the sandbox is destroyed, and its final record is inserted once the
// store works again.
TEST_F(ManagerTest, StoreFailureAtFirstWriteFailsTheCreateAndStoresItLater) {
  make();
  store_.fail_writes(true);
  auto [id, created] = create_async();
  auto c = get_or_fail(created);
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message().find("cannot record sandbox"), std::string::npos)
      << c.error().message();
  for (int i = 0; i < 6000 && backend_->live_count() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(backend_->live_count(), 0u);
  EXPECT_TRUE(backend_->destroyed.count(id));
  ASSERT_TRUE(store_.get(id));
  EXPECT_FALSE(store_.get(id)->has_value());   // never written
  EXPECT_EQ(mgr_->get(id)->state, "stopped");  // but answered as it is
  store_.fail_writes(false);
  mgr_->tick();
  EXPECT_EQ(stopped_reason(id), "failed");
  EXPECT_EQ(stored(id).version, 1u);
  EXPECT_EQ(mgr_->live_count(), 0u);
}

TEST_F(ManagerTest, ShutdownReleasesRunningAndStopsCreating) {
  backend_->hold_creates = true;
  make();
  auto [run_id, run_f] = create_async();
  backend_->release_create(run_id);
  auto running = get_or_fail(run_f);
  ASSERT_TRUE(running);
  auto [held_id, held_f] = create_async();
  backend_->wait_entered(held_id);
  std::thread stopper([this] { mgr_->shutdown(); });
  // Once the shutdown asked the held one to stop (file calls then say so), let its create go on.
  for (;;) {
    auto r = mgr_->ref(held_id);
    if (!r && r.error().message().find("stopping") != std::string::npos) break;
    std::this_thread::yield();
  }
  backend_->release_create(held_id);
  stopper.join();
  auto held = get_or_fail(held_f);
  ASSERT_FALSE(held);
  EXPECT_EQ(held.error().code, Code::kConflict);
  EXPECT_EQ(stored(held_id).end_reason, "daemon_shutdown");
  EXPECT_EQ(stored(run_id).state, "running");  // left for the next daemon
  EXPECT_EQ(stored(run_id).end_reason, "");
  EXPECT_TRUE(backend_->released.count(run_id));
  EXPECT_TRUE(agent(run_id)->closed());
  EXPECT_EQ(backend_->live_count(), 0u);
  expect_consistent(true);
  auto late = create_async();
  EXPECT_EQ(get_or_fail(late.second).error().code, Code::kUnavailable);
}

TEST_F(ManagerTest, ShutdownStopsWhenAskedOrWhenTheTierCannotHandOver) {
  for (bool stop_on_exit : {true, false}) {
    backend_->address = stop_on_exit ? "/run/fake" : "";
    ManagerOptions o;
    o.stop_on_exit = stop_on_exit;
    make(o);
    auto r = create_sync();
    ASSERT_TRUE(r);
    mgr_->shutdown();
    EXPECT_EQ(stopped_reason(r->id), "daemon_shutdown");
    EXPECT_EQ(backend_->live_count(), 0u);
    EXPECT_FALSE(backend_->released.count(r->id));
  }
}

TEST_F(ManagerTest, BackgroundProcessOutputLivesInFilesUntilTheSandboxEnds) {
  make();
  auto r = create_sync();
  ASSERT_TRUE(r);
  ExecParams p;
  p.argv = {"echo", "hi"};
  p.output_limit = 4;
  auto info = start_process_sync(r->id, p);
  ASSERT_TRUE(info) << info.error().message();
  EXPECT_EQ(info->pid, 1u);
  // Answered once the agent said it runs, with its pid in the sandbox.
  EXPECT_EQ(info->os_pid, 101u);
  EXPECT_FALSE(info->exited);
  EXPECT_EQ(mgr_->get_process(r->id, 1)->os_pid, 101u);
  std::string dir = dir_ + "/sandboxes/" + r->id;
  EXPECT_TRUE(std::filesystem::exists(dir + "/proc-1.out"));
  auto a = agent(r->id);
  // The agent got the node's note of what the command is.
  EXPECT_NE(a->meta_of(1).find("\"kind\":\"process\""), std::string::npos) << a->meta_of(1);
  EXPECT_NE(a->meta_of(1).find("\"handle\":1"), std::string::npos) << a->meta_of(1);
  a->finish(1, "hello world", 0);
  auto pr = std::make_shared<std::promise<Result<ProcessInfo>>>();
  auto f = pr->get_future();
  mgr_->wait_process(r->id, 1, -1, [pr](Result<ProcessInfo> i) { pr->set_value(i); });
  auto w = get_or_fail(f);
  ASSERT_TRUE(w);
  EXPECT_TRUE(w->exited);
  EXPECT_EQ(w->out, "hell");                        // capped at output_limit
  EXPECT_EQ(mgr_->get_process(r->id, 1)->out, "");  // only wait answers output
  auto d = destroy_async(r->id);
  ASSERT_TRUE(get_or_fail(d));
  EXPECT_FALSE(std::filesystem::exists(dir));
}

// A process whose command cannot run (the agent answers only its end) is answered
// as ended, not as running; one in a sandbox that is not there is an error at once.
TEST_F(ManagerTest, BackgroundProcessThatNeverRunsIsAnsweredEnded) {
  make();
  auto r = create_sync();
  ASSERT_TRUE(r);
  auto a = agent(r->id);
  a->fail_before_start = true;
  ExecParams p;
  p.argv = {"/nope"};
  auto pr = std::make_shared<std::promise<Result<ProcessInfo>>>();
  auto f = pr->get_future();
  mgr_->start_process(r->id, p, [pr](Result<ProcessInfo> i) { pr->set_value(i); });
  // Not answered while the agent has said nothing.
  EXPECT_EQ(f.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  a->finish(1, "", 127);
  auto info = get_or_fail(f);
  ASSERT_TRUE(info) << info.error().message();
  EXPECT_TRUE(info->exited);
  EXPECT_EQ(info->os_pid, 0u);
  ASSERT_TRUE(info->outcome);
  EXPECT_EQ(info->outcome->result.exit_code, 127);
  auto missing = start_process_sync("n0-none", p);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, Code::kNotFound);
  auto d = destroy_async(r->id);
  ASSERT_TRUE(get_or_fail(d));
}

// A running sandbox's record as an earlier daemon run stored it, on uid range `base`.
SandboxRecord running_record(const std::string& id, uint32_t base) {
  SandboxRecord r;
  r.id = id;
  r.state = "running";
  r.tier = "container";
  r.image = "host";
  r.node = "n0";
  r.created_at_ms = 1;
  r.expires_at_ms = now_ms() + 3600 * 1000;
  r.uid_base = base;
  return r;
}

TEST_F(ManagerTest, RecoverAdoptsWhatItCanAndStoresTheRestStopped) {
  auto rec = [](const std::string& id) { return running_record(id, 0); };
  for (const char* id : {"n0-adopt", "n0-gone", "n0-mute", "n0-tier", "n0-pooled"}) {
    auto r = rec(id);
    if (std::string(id) == "n0-tier") r.tier = "microvm";
    r.pooled = std::string(id) == "n0-pooled";  // a warm pool's, not handed out
    ASSERT_TRUE(store_.insert(r));
  }
  auto ended = rec("n0-old");
  ended.state = "stopped";
  ended.end_reason = "ttl";
  ended.ended_at_ms = now_ms();
  ASSERT_TRUE(store_.insert(ended));
  backend_->adoptable = {"n0-adopt", "n0-mute", "n0-pooled"};
  std::filesystem::create_directories(dir_ + "/sandboxes/n0-adopt");
  std::filesystem::create_directories(dir_ + "/sandboxes/n0-gone");
  {
    int fd = ::open((dir_ + "/sandboxes/n0-adopt/proc-7.out").c_str(), O_WRONLY | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, "before", 6), 6);
    ::close(fd);
  }
  std::shared_ptr<FakeAgent> adopted;
  ManagerOptions o;
  o.agent_connect = [&](asio::io_context& io, const std::string& addr,
                        std::string id) -> Result<std::shared_ptr<AgentClient>> {
    EXPECT_EQ(addr, backend_->address);
    if (id == "n0-mute") return fail(Code::kUnavailable, "connection refused");
    if (id != "n0-adopt") return std::make_shared<FakeAgent>(io);
    adopted = std::make_shared<FakeAgent>(io);
    adopted->resumed_ = {
        {40, R"({"kind":"process","handle":7,"argv":["sleep","9"],"started_ms":5,"limit":100})",
         true, 33},
        {41, R"({"kind":"exec"})", true},
    };
    return adopted;
  };
  make_recovered(o);

  EXPECT_EQ(stored("n0-adopt").state, "running");
  EXPECT_EQ(stored("n0-adopt").end_reason, "");
  EXPECT_EQ(mgr_->get("n0-adopt")->state, "running");
  EXPECT_EQ(stopped_reason("n0-gone"), "daemon_restart");
  EXPECT_EQ(stored("n0-tier").end_reason, "daemon_restart");
  EXPECT_EQ(stopped_reason("n0-mute"), "agent_lost");
  EXPECT_EQ(stored("n0-old").end_reason, "ttl");
  // Leftovers are removed twice: what no live record names while the records are
  // adopted (every recorded one kept), then what was recorded but not adopted.
  ASSERT_EQ(backend_->keeps.size(), 2u);
  EXPECT_EQ(std::set<std::string>(backend_->keeps[0].begin(), backend_->keeps[0].end()),
            (std::set<std::string>{"n0-adopt", "n0-gone", "n0-mute", "n0-tier", "n0-pooled"}));
  EXPECT_EQ(std::set<std::string>(backend_->kept.begin(), backend_->kept.end()),
            (std::set<std::string>{"n0-adopt", "n0-pooled"}));
  // The warm pool's sandbox is adopted as one (WarmPools::start() takes it back).
  EXPECT_EQ(stored("n0-pooled").state, "running");
  auto pooled = mgr_->pooled();
  ASSERT_EQ(pooled.size(), 1u);
  EXPECT_EQ(pooled[0].id, "n0-pooled");
  EXPECT_FALSE(backend_->is_live("n0-mute"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/sandboxes/n0-adopt"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/sandboxes/n0-gone"));
  // The request's command was killed; the background process is back under its handle.
  EXPECT_EQ(adopted->signalled(), std::vector<uint32_t>{41});
  auto procs = mgr_->list_processes("n0-adopt");
  ASSERT_TRUE(procs);
  ASSERT_EQ(procs->size(), 1u);
  EXPECT_EQ((*procs)[0].pid, 7u);
  EXPECT_EQ((*procs)[0].os_pid, 33u);  // as the agent's kResumed says
  EXPECT_EQ((*procs)[0].argv, (std::vector<std::string>{"sleep", "9"}));
  EXPECT_FALSE((*procs)[0].exited);
  adopted->finish(40, " after", 0);
  auto pr = std::make_shared<std::promise<Result<ProcessInfo>>>();
  auto f = pr->get_future();
  mgr_->wait_process("n0-adopt", 7, -1, [pr](Result<ProcessInfo> i) { pr->set_value(i); });
  auto w = get_or_fail(f);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->out, "before after");
  // A new process does not reuse the handle.
  ExecParams p;
  p.argv = {"true"};
  auto np = start_process_sync("n0-adopt", p);
  ASSERT_TRUE(np);
  EXPECT_EQ(np->pid, 8u);
  auto d = destroy_async("n0-adopt");
  ASSERT_TRUE(get_or_fail(d));
  EXPECT_EQ(backend_->live_count(), 1u);  // the pooled one, until its pool drains it
  auto rp = std::make_shared<std::promise<Result<SandboxRecord>>>();
  auto fp = rp->get_future();
  mgr_->destroy("n0-pooled", EndReason::kPoolDrained,
                [rp](Result<SandboxRecord> r) { rp->set_value(std::move(r)); });
  ASSERT_TRUE(get_or_fail(fp));
  EXPECT_EQ(backend_->live_count(), 0u);
}

// Images as the manager sees them: reference -> layer digests, with pins
// counted per digest (what keeps a layer from gc).
struct FakeImages {
  std::mutex mu;
  std::set<std::string> stored;                            // layer digests
  std::map<std::string, std::vector<std::string>> images;  // ref -> digests
  std::map<std::string, int> pins;                         // digest -> live pins
  ImageResolver resolver() {
    return [this](const std::string& ref) -> Result<ResolvedImage> {
      std::lock_guard lk(mu);
      std::vector<std::string> ds;
      if (ref.rfind("layers:", 0) == 0) {
        std::string rest = ref.substr(7);
        for (size_t i = 0; i <= rest.size();) {
          size_t j = rest.find(',', i);
          if (j == std::string::npos) j = rest.size();
          ds.push_back(rest.substr(i, j - i));
          i = j + 1;
        }
      } else {
        auto it = images.find(ref);
        if (it == images.end()) return fail(Code::kNotFound, "image '" + ref + "' not found");
        ds = it->second;
      }
      for (const auto& d : ds)
        if (!stored.count(d)) return fail(Code::kNotFound, "layer " + d + " not found");
      for (const auto& d : ds) ++pins[d];
      ResolvedImage img;
      img.layers = ds;
      img.env = {{"FROM_IMAGE", ref}};
      img.pin = std::shared_ptr<void>(new int(0), [this, ds](void* p) {
        delete static_cast<int*>(p);
        std::lock_guard lk(mu);
        for (const auto& d : ds) --pins[d];
      });
      return img;
    };
  }
  int pinned(const std::string& d) {
    std::lock_guard lk(mu);
    return pins.count(d) ? pins[d] : 0;
  }
};

std::string digest(char c) { return "sha256:" + std::string(64, c); }

TEST_F(ManagerTest, ImageLayersReachTheSpecAndTheRecordAsDigests) {
  FakeImages imgs;
  imgs.stored = {digest('a'), digest('b')};
  imgs.images["app:1"] = {digest('a'), digest('b')};
  make();
  mgr_->set_image_resolver(imgs.resolver());
  CreateParams p;
  p.image = "app:1";
  auto r = create_sync(p);
  ASSERT_TRUE(r) << r.error().message();
  const std::vector<std::string> want = {digest('a'), digest('b')};
  EXPECT_EQ(r->layers, want);
  EXPECT_EQ(stored(r->id).layers, want) << "stored with the first record";
  {
    std::lock_guard lk(backend_->mu);
    EXPECT_EQ(backend_->specs[r->id].layers, want);
    EXPECT_EQ(backend_->specs[r->id].image, "app:1");
    EXPECT_EQ(backend_->specs[r->id].env.at("FROM_IMAGE"), "app:1");
  }
  EXPECT_EQ(imgs.pinned(digest('a')), 1);
  auto d = destroy_async(r->id);
  ASSERT_TRUE(get_or_fail(d));
  EXPECT_EQ(imgs.pinned(digest('a')), 0);
  // An unknown image: nothing reaches the backend; the failure is stored.
  p.image = "nope:1";
  auto [id, f] = create_async(p);
  auto bad = get_or_fail(f);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Code::kNotFound);
  {
    std::lock_guard lk(backend_->mu);
    EXPECT_EQ(backend_->entered.count(id), 0u);
  }
  EXPECT_EQ(stored(id).end_reason, "failed");
  EXPECT_TRUE(stored(id).layers.empty());
  // The host image has no layers.
  auto h = create_sync();
  ASSERT_TRUE(h);
  EXPECT_TRUE(h->layers.empty());
  std::lock_guard lk(backend_->mu);
  EXPECT_TRUE(backend_->specs[h->id].layers.empty());
}

TEST_F(ManagerTest, ADeleteWithoutWaitIsAnsweredOnceItsStopIsStoredAndEndsLikeAnyDelete) {
  make();
  auto a = create_sync();
  ASSERT_TRUE(a);
  auto f = destroy_nowait_async(a->id);
  auto r = get_or_fail(f);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->state, "stopping");
  EXPECT_EQ(r->end_reason, "deleted");
  EXPECT_EQ(r->ended_at_ms, 0);
  EXPECT_GT(r->version, a->version) << "answered before its stop was stored";
  // Then it ends as a waited-for delete does: stored stopped, nothing of it left.
  auto d = destroy_async(a->id);
  ASSERT_TRUE(get_or_fail(d));
  EXPECT_EQ(stopped_reason(a->id), "deleted");
  EXPECT_FALSE(backend_->is_live(a->id));
  // Deleting it again without waiting answers its final record; an unknown id, 404.
  auto f2 = destroy_nowait_async(a->id);
  auto again = get_or_fail(f2);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->state, "stopped");
  auto f3 = destroy_nowait_async("n0-nosuchthing");
  auto none = get_or_fail(f3);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, Code::kNotFound);
}

// Paused when the daemon went (a client's pause, a lapsed lease): paused after the
// restart too, not running again because the adoption had to thaw it.
TEST_F(ManagerTest, ARestartKeepsAPausedSandboxPaused) {
  auto r = running_record("n0-paused", 0);
  r.state = "paused";
  ASSERT_TRUE(store_.insert(r));
  ASSERT_TRUE(store_.insert(running_record("n0-running", 0)));
  backend_->adoptable = {"n0-paused", "n0-running"};
  ManagerOptions o;
  o.agent_connect = [&](asio::io_context& io, const std::string&,
                        std::string) -> Result<std::shared_ptr<AgentClient>> {
    return std::make_shared<FakeAgent>(io);
  };
  make_recovered(o);
  EXPECT_EQ(stored("n0-paused").state, "paused");
  EXPECT_EQ(mgr_->get("n0-paused")->state, "paused");
  EXPECT_TRUE(backend_->is_frozen("n0-paused"));
  EXPECT_EQ(stored("n0-running").state, "running");
  EXPECT_FALSE(backend_->is_frozen("n0-running"));
  // And a request resumes it as before the restart.
  auto resumed = record_future([&](auto cb) { mgr_->resume("n0-paused", cb); });
  EXPECT_EQ(get_or_fail(resumed)->state, "running");
  EXPECT_FALSE(backend_->is_frozen("n0-paused"));
}

TEST_F(ManagerTest, ARestartFinishesADeleteThatWasAnsweredBeforeItsTeardown) {
  // What a daemon that died during a DELETE ?wait=false teardown leaves: the record
  // still running with its end reason, the instance still there.
  auto r = running_record("n0-accepted", 0);
  r.end_reason = "deleted";
  ASSERT_TRUE(store_.insert(r));
  ASSERT_TRUE(store_.insert(running_record("n0-other", 0)));
  backend_->adoptable = {"n0-accepted", "n0-other"};
  ManagerOptions o;
  o.agent_connect = [&](asio::io_context& io, const std::string&,
                        std::string) -> Result<std::shared_ptr<AgentClient>> {
    return std::make_shared<FakeAgent>(io);
  };
  make_recovered(o);
  EXPECT_EQ(stopped_reason("n0-accepted"), "deleted");
  EXPECT_NE(stored("n0-accepted").ended_at_ms, 0);
  EXPECT_FALSE(backend_->is_live("n0-accepted"));
  EXPECT_FALSE(mgr_->get("n0-accepted")->state == "running");
  EXPECT_EQ(stored("n0-other").state, "running");
  EXPECT_EQ(backend_->kept, std::vector<std::string>{"n0-other"});
}

TEST_F(ManagerTest, AdoptionPinsTheRecordedLayersEvenWhenTheImageMoved) {
  FakeImages imgs;
  imgs.stored = {digest('a'), digest('b')};
  imgs.images["app"] = {digest('b')};  // "app" meant layer a when the sandboxes were created
  auto rec = [](const std::string& id, const std::string& image, std::vector<std::string> ls) {
    SandboxRecord r;
    r.id = id;
    r.state = "running";
    r.tier = "container";
    r.image = image;
    r.layers = std::move(ls);
    r.node = "n0";
    r.created_at_ms = 1;
    r.expires_at_ms = now_ms() + 3600 * 1000;
    return r;
  };
  ASSERT_TRUE(store_.insert(rec("n0-moved", "app", {digest('a')})));
  ASSERT_TRUE(store_.insert(rec("n0-older", "app", {})));  // a record of an older daemon
  ASSERT_TRUE(store_.insert(rec("n0-orphan", "gone", {digest('a')})));
  ASSERT_TRUE(store_.insert(rec("n0-lost", "app", {digest('c')})));  // its layer is not stored
  backend_->adoptable = {"n0-moved", "n0-older", "n0-orphan", "n0-lost"};
  ManagerOptions o;
  o.agent_connect = [](asio::io_context& io, const std::string&,
                       std::string) -> Result<std::shared_ptr<AgentClient>> {
    return std::make_shared<FakeAgent>(io);
  };
  stop_runners();
  make(o);
  mgr_->set_image_resolver(imgs.resolver());
  ASSERT_TRUE(mgr_->recover());
  guard_.emplace(asio::make_work_guard(io_));
  for (int i = 0; i < 2; ++i) threads_.emplace_back([this] { io_.run(); });

  {
    std::lock_guard lk(backend_->mu);
    EXPECT_EQ(backend_->specs["n0-moved"].layers, std::vector<std::string>{digest('a')});
    EXPECT_EQ(backend_->specs["n0-older"].layers, std::vector<std::string>{digest('b')});
    EXPECT_EQ(backend_->specs["n0-orphan"].layers, std::vector<std::string>{digest('a')});
    EXPECT_EQ(backend_->specs.count("n0-lost"), 0u) << "refused before the backend";
  }
  EXPECT_EQ(stored("n0-moved").state, "running");
  EXPECT_EQ(stored("n0-orphan").state, "running");
  EXPECT_EQ(stopped_reason("n0-lost"), "daemon_restart");
  // Layer a is what n0-moved and n0-orphan run on: pinned, whatever "app" means now.
  EXPECT_EQ(imgs.pinned(digest('a')), 2);
  EXPECT_EQ(imgs.pinned(digest('b')), 1);
  for (const char* id : {"n0-moved", "n0-older", "n0-orphan"}) {
    auto d = destroy_async(id);
    ASSERT_TRUE(get_or_fail(d));
  }
  EXPECT_EQ(imgs.pinned(digest('a')), 0);
  EXPECT_EQ(imgs.pinned(digest('b')), 0);
}

// Uid ranges: one per sandbox, recorded, passed to the backend, freed only once
// the sandbox is destroyed; exhaustion answers 503 and stores nothing.
TEST_F(ManagerTest, UidRangesAreAllocatedRecordedAndFreedAfterDestroy) {
  constexpr uint32_t kFirst = 1u << 20, S = UidRanges::kSize;
  auto ranges = std::make_shared<UidRanges>(kFirst, 2);
  ManagerOptions o;
  o.uid_ranges = ranges;
  make(o);
  auto a = create_sync();
  auto b = create_sync();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(stored(a->id).uid_base, kFirst);
  EXPECT_EQ(stored(b->id).uid_base, kFirst + S);
  EXPECT_EQ(backend_->uid_bases[a->id], kFirst);
  EXPECT_EQ(backend_->uid_bases[b->id], kFirst + S);
  auto [cid, cf] = create_async();
  auto c = get_or_fail(cf);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, Code::kUnavailable);
  EXPECT_NE(c.error().message().find("no free uid range"), std::string::npos);
  EXPECT_FALSE(*store_.get(cid));  // it never existed
  auto d = destroy_async(a->id);
  ASSERT_TRUE(get_or_fail(d));
  EXPECT_FALSE(ranges->holder(kFirst));
  auto e = create_sync();
  ASSERT_TRUE(e) << e.error().message();
  EXPECT_EQ(stored(e->id).uid_base, kFirst);
  EXPECT_EQ(ranges->holder(kFirst), e->id);
}

TEST_F(ManagerTest, FailedCreateFreesItsRangeAndFailedDestroyKeepsIt) {
  auto ranges = std::make_shared<UidRanges>(1u << 20, 4);
  ManagerOptions o;
  o.uid_ranges = ranges;
  backend_->fail_creates = true;
  make(o);
  auto [id, created] = create_async();
  ASSERT_FALSE(get_or_fail(created));
  EXPECT_EQ(stored(id).state, "stopped");
  EXPECT_EQ(ranges->held(), 0u);
  backend_->fail_creates = false;
  auto r = create_sync();
  ASSERT_TRUE(r);
  backend_->failing_destroys.insert(r->id);
  auto d = destroy_async(r->id);
  (void)get_or_fail(d);
  // Something of it may still run: its ids are not handed out again.
  EXPECT_EQ(ranges->holder(stored(r->id).uid_base), r->id);
  auto n = create_sync();
  ASSERT_TRUE(n);
  EXPECT_NE(stored(n->id).uid_base, stored(r->id).uid_base);
  backend_->failing_destroys.clear();
}

TEST_F(ManagerTest, RecoverHoldsTheRangesOfAdoptedSandboxesAndFreesTheOthers) {
  // Far from any daemon's ranges: recover() also holds ranges that host processes run in.
  constexpr uint32_t kFirst = 0x70000000u, S = UidRanges::kSize;
  auto rec = running_record;
  ASSERT_TRUE(store_.insert(rec("n0-kept", kFirst + 2 * S)));
  ASSERT_TRUE(store_.insert(rec("n0-gone", kFirst)));
  ASSERT_TRUE(store_.insert(rec("n0-legacy", 0)));  // from before per-sandbox ranges
  backend_->adoptable = {"n0-kept", "n0-legacy"};
  auto ranges = std::make_shared<UidRanges>(kFirst, 3);
  ManagerOptions o;
  o.uid_ranges = ranges;
  o.agent_connect = [&](asio::io_context& io, const std::string&,
                        std::string) -> Result<std::shared_ptr<AgentClient>> {
    return std::make_shared<FakeAgent>(io);
  };
  make_recovered(o);

  EXPECT_EQ(backend_->uid_bases["n0-kept"], kFirst + 2 * S);  // adopted with its own range
  EXPECT_EQ(backend_->uid_bases["n0-legacy"], 0u);            // in the shared one, as before
  EXPECT_EQ(ranges->holder(kFirst + 2 * S), "n0-kept");
  EXPECT_FALSE(ranges->holder(kFirst));  // n0-gone's, freed after cleanup
  auto a = create_sync();
  auto b = create_sync();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(stored(a->id).uid_base, kFirst);
  EXPECT_EQ(stored(b->id).uid_base, kFirst + S);
  auto c = create_sync();
  EXPECT_FALSE(c);  // the adopted sandbox's range is never handed out
  for (const auto& id : {a->id, b->id, std::string("n0-kept"), std::string("n0-legacy")}) {
    auto d = destroy_async(id);
    ASSERT_TRUE(get_or_fail(d));
  }
  EXPECT_EQ(ranges->held(), 0u);
}

// A range some host process runs in (left by an earlier run, or another daemon's)
// is never handed out while the process runs, and serves again once it is gone.
TEST_F(ManagerTest, RecoverHoldsRangesThatHostProcessesRunIn) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (a process running as another uid)";
  constexpr uint32_t kFirst = 0x70100000u, S = UidRanges::kSize;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (setresgid(kFirst + S + 5, kFirst + S + 5, kFirst + S + 5) == 0 &&
        setresuid(kFirst + S + 5, kFirst + S + 5, kFirst + S + 5) == 0)
      pause();
    _exit(1);
  }
  while (!host_uids_in_use(kFirst + S, kFirst + 2 * S).count(kFirst + S + 5)) ::usleep(1000);
  auto ranges = std::make_shared<UidRanges>(kFirst, 2);
  ManagerOptions o;
  o.uid_ranges = ranges;
  stop_runners();
  make(o);
  auto rec = mgr_->recover();
  if (!rec) kill(pid, SIGKILL), waitpid(pid, nullptr, 0);
  ASSERT_TRUE(rec);
  guard_.emplace(asio::make_work_guard(io_));
  for (int i = 0; i < 2; ++i) threads_.emplace_back([this] { io_.run(); });
  EXPECT_EQ(ranges->holder(kFirst + S), UidRanges::kInUseOnHost);
  auto a = create_sync();
  ASSERT_TRUE(a);
  EXPECT_EQ(stored(a->id).uid_base, kFirst);
  EXPECT_FALSE(create_sync());  // checked again: the process still runs
  EXPECT_EQ(ranges->holder(kFirst + S), UidRanges::kInUseOnHost);
  kill(pid, SIGKILL);
  EXPECT_FALSE(create_sync());  // dead but not reaped: a zombie is still charged to its ids
  waitpid(pid, nullptr, 0);
  auto b = create_sync();  // gone: the range serves again
  ASSERT_TRUE(b) << b.error().message();
  EXPECT_EQ(stored(b->id).uid_base, kFirst + S);
  for (const auto& id : {a->id, b->id}) {
    auto d = destroy_async(id);
    ASSERT_TRUE(get_or_fail(d));
  }
  EXPECT_EQ(ranges->held(), 0u);
}

// What a scan of the host's processes sees (ManagerOptions::host_ids_in_use).
struct FakeHostIds {
  std::mutex mu;
  std::condition_variable cv;
  std::set<uint32_t> ids;
  int scans = 0;
  UidRanges::Scan scan() {
    return [this](uint32_t lo, uint64_t hi) {
      std::lock_guard lk(mu);
      ++scans;
      cv.notify_all();
      std::set<uint32_t> out;
      for (uint32_t id : ids)
        if (id >= lo && id < hi) out.insert(id);
      return out;
    };
  }
  void set(std::set<uint32_t> now) {
    std::lock_guard lk(mu);
    ids = std::move(now);
  }
  int count() {
    std::lock_guard lk(mu);
    return scans;
  }
  // Waits until more than `n` scans ran.
  void wait_past(int n) {
    std::unique_lock lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] { return scans > n; }));
  }
};

// A restarted daemon gives up a sandbox whose agent does not answer: its killed init,
// not yet reaped, still runs with its ids at the scan. The range is held while a scan
// finds a process with its ids (the tick's, a create's), and freed once none does.
TEST_F(ManagerTest, RangeSeenInUseAtRecoveryIsFreedOnceItsProcessesAreGone) {
  constexpr uint32_t kFirst = 0x70200000u, S = UidRanges::kSize;
  auto rec = running_record;
  ASSERT_TRUE(store_.insert(rec("n0-kept", kFirst)));
  ASSERT_TRUE(store_.insert(rec("n0-hung", kFirst + S)));
  backend_->adoptable = {"n0-kept", "n0-hung"};
  FakeHostIds host;
  host.set({kFirst + 3, kFirst + S + 1000});  // the kept one's, and the hung one's init
  auto ranges = std::make_shared<UidRanges>(kFirst, 2);
  ManagerOptions o;
  o.uid_ranges = ranges;
  o.host_ids_in_use = host.scan();
  o.uid_recheck = std::chrono::milliseconds(0);
  o.agent_ready_timeout = std::chrono::milliseconds(200);
  o.agent_connect = [&](asio::io_context& io, const std::string&,
                        std::string id) -> Result<std::shared_ptr<AgentClient>> {
    return std::make_shared<FakeAgent>(io, id == "n0-kept");  // the hung one never answers
  };
  make_recovered(o);

  EXPECT_EQ(stored("n0-hung").end_reason, "agent_lost");
  EXPECT_EQ(stored("n0-kept").state, "running");
  EXPECT_EQ(ranges->holder(kFirst), "n0-kept");
  EXPECT_EQ(ranges->holder(kFirst + S), UidRanges::kInUseOnHost);
  // Still in use: a tick's scan and a create's keep it held.
  int n = host.count();
  mgr_->tick();
  host.wait_past(n);
  EXPECT_EQ(ranges->holder(kFirst + S), UidRanges::kInUseOnHost);
  auto refused = create_sync();
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, Code::kUnavailable);
  EXPECT_EQ(ranges->holder(kFirst + S), UidRanges::kInUseOnHost);
  // Gone (reaped): the next tick frees it, and a create gets it.
  host.set({kFirst + 3});
  for (int i = 0; i < 6000 && ranges->holder(kFirst + S); ++i) {
    mgr_->tick();  // (a tick while the last re-check still runs starts none)
    ::usleep(10000);
  }
  EXPECT_FALSE(ranges->holder(kFirst + S));
  EXPECT_EQ(ranges->held_in_use(), 0u);
  auto fresh = create_sync();
  ASSERT_TRUE(fresh) << fresh.error().message();
  EXPECT_EQ(stored(fresh->id).uid_base, kFirst + S);
  // Nothing held for the host any more: ticks scan no more.
  n = host.count();
  mgr_->tick();
  EXPECT_EQ(host.count(), n);
  for (const auto& id : {fresh->id, std::string("n0-kept")}) {
    auto d = destroy_async(id);
    ASSERT_TRUE(get_or_fail(d));
  }
  EXPECT_EQ(ranges->held(), 0u);
}

// A create that finds every range held, some only because a host process ran in
// them, checks those again at once instead of waiting for the tick.
TEST_F(ManagerTest, CreateChecksRangesHeldForTheHostAgainBeforeRefusing) {
  constexpr uint32_t kFirst = 0x70300000u, S = UidRanges::kSize;
  FakeHostIds host;
  host.set({kFirst + 42});
  auto ranges = std::make_shared<UidRanges>(kFirst, 1);
  ManagerOptions o;
  o.uid_ranges = ranges;
  o.host_ids_in_use = host.scan();
  // Longer than any host's uptime (the steady clock starts at boot): the first tick
  // re-checks, later ones do not.
  o.uid_recheck = std::chrono::hours(24 * 365 * 100);
  make_recovered(o);
  EXPECT_EQ(ranges->holder(kFirst), UidRanges::kInUseOnHost);
  int n = host.count();
  mgr_->tick();  // scans once (none before)...
  host.wait_past(n);
  mgr_->tick();  // ...and not again
  n = host.count();
  EXPECT_FALSE(create_sync());
  EXPECT_EQ(host.count(), n + 1);
  host.set({kFirst + S});  // beyond the span: not this daemon's
  auto a = create_sync();
  ASSERT_TRUE(a) << a.error().message();
  EXPECT_EQ(stored(a->id).uid_base, kFirst);
  auto d = destroy_async(a->id);
  ASSERT_TRUE(get_or_fail(d));
}

// Random interleavings of create, delete, exec, ttl expiry, agent death and
// shutdown, with teardowns paced or not: whatever the order, every record ends
// consistent and nothing is left.
TEST_F(ManagerTest, RandomInterleavingsEndConsistent) {
  // TP_TEST_SEEDS lowers the count where each seed is slow (the TSan run: make test-tsan).
  const char* env = std::getenv("TP_TEST_SEEDS");
  const int kSeeds = env && std::atoi(env) > 0 ? std::atoi(env) : 2000;
  for (int seed = 0; seed < kSeeds; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
    const int64_t ops_before = Sandbox::ops_in_flight();  // (ops other tests left behind)
    backend_->hold_creates = true;
    backend_->address = pick(2) ? "/run/fake" : "";
    ManagerOptions o;
    o.stop_on_exit = pick(2) == 0;
    // Teardown pacing: clients busy or quiet (toggled by the tick step), a small backlog.
    const bool paced = pick(2) == 0;
    auto busy = std::make_shared<std::atomic<bool>>(pick(2) == 0);
    o.max_deferred_teardowns = 1 + pick(3);
    o.max_teardown_delay = std::chrono::milliseconds(pick(2) ? 1 : 30);
    make(o);
    if (paced) mgr_->set_clients_busy([busy] { return *busy ? 1.0 : -1.0; });
    std::vector<std::string> ids;
    std::vector<std::future<Result<SandboxRecord>>> creates, deletes, pauses;
    std::vector<bool> nowait;  // of each delete
    std::vector<bool> gate_open;
    int steps = 4 + pick(12);
    for (int s = 0; s < steps; ++s) {
      int what = pick(9);
      if (what == 0 || ids.empty()) {
        CreateParams p;
        p.ttl_seconds = pick(3) == 0 ? 0 : 3600;
        auto [id, f] = create_async(p);
        ASSERT_FALSE(id.empty());
        ids.push_back(id);
        creates.push_back(std::move(f));
        gate_open.push_back(false);
      } else if (what == 1 || what == 2) {
        size_t i = pick(static_cast<int>(ids.size()));
        if (!gate_open[i]) backend_->release_create(ids[i]);
        gate_open[i] = true;
      } else if (what == 3) {
        const std::string& id = ids[pick(static_cast<int>(ids.size()))];
        nowait.push_back(pick(2) == 0);
        deletes.push_back(nowait.back() ? destroy_nowait_async(id) : destroy_async(id));
      } else if (what == 4) {
        ExecParams p;
        p.argv = {"true"};
        ExecCallbacks cb;
        cb.on_done = [](Result<ExecOutcome>) {};
        (void)mgr_->exec(ids[pick(static_cast<int>(ids.size()))], p, cb);
      } else if (what == 5) {
        mgr_->tick();
        *busy = !*busy;
      } else if (what == 7) {
        const std::string& id = ids[pick(static_cast<int>(ids.size()))];
        pauses.push_back(record_future([&](auto cb) { mgr_->pause(id, cb); }));
      } else if (what == 8) {
        const std::string& id = ids[pick(static_cast<int>(ids.size()))];
        pauses.push_back(record_future([&](auto cb) { mgr_->resume(id, cb); }));
      } else {
        if (auto a = agent(ids[pick(static_cast<int>(ids.size()))])) a->die();
      }
    }
    for (size_t i = 0; i < ids.size(); ++i)
      if (!gate_open[i]) backend_->release_create(ids[i]);
    bool shut = pick(2) == 0;
    if (shut) mgr_->shutdown();
    std::map<std::string, bool> created_ok;
    for (size_t i = 0; i < creates.size(); ++i) {
      auto r = get_or_fail(creates[i]);
      created_ok[ids[i]] = r.has_value();
      if (r) {
        EXPECT_EQ(r->state, "running") << "seed " << seed;
      }
    }
    for (size_t i = 0; i < deletes.size(); ++i) {
      auto r = get_or_fail(deletes[i]);
      if (r && !(nowait[i] && r->state == "stopping")) {
        EXPECT_EQ(r->state, "stopped") << "seed " << seed;
      }
    }
    for (auto& p : pauses) (void)get_or_fail(p);  // each answered once, whatever it says
    if (!shut) {
      // Settle: stop what is left (agent deaths may still be stopping some).
      for (const auto& id : ids) {
        auto f = destroy_async(id);
        auto r = get_or_fail(f);
        ASSERT_TRUE(r) << "seed " << seed << ": " << r.error().message();
        EXPECT_EQ(r->state, "stopped") << "seed " << seed;
      }
    }
    for (const auto& id : ids) {
      auto r = stored(id);
      if (r.state == "stopped") {
        EXPECT_FALSE(r.end_reason.empty()) << "seed " << seed;
        EXPECT_FALSE(backend_->is_live(id)) << "seed " << seed << " " << id;
      } else {
        // Only a sandbox the shutdown handed over stays running.
        EXPECT_TRUE(shut) << "seed " << seed << " " << id << " " << r.state;
        EXPECT_TRUE(r.state == "running" || r.state == "paused") << "seed " << seed;
        EXPECT_EQ(r.end_reason, "") << "seed " << seed;
        EXPECT_TRUE(created_ok[id])
            << "seed " << seed << " " << id << " handed over but its create failed";
        EXPECT_TRUE(backend_->released.count(id)) << "seed " << seed << " " << id;
      }
    }
    EXPECT_EQ(backend_->live_count(), 0u) << "seed " << seed;
    EXPECT_EQ(mgr_->live_count(), 0u) << "seed " << seed;
    for (const auto& id : ids) {
      if (!backend_->released.count(id)) {
        EXPECT_FALSE(backend_->is_frozen(id)) << "seed " << seed << " " << id << " still frozen";
      }
    }
    if (HasFailure()) {
      ADD_FAILURE() << "first failing seed " << seed;
      return;
    }
    // Every answer is in, but the io threads may still be running the tail of an op
    // (a resume's Done starting the queued stop, which posts to the manager's pool).
    for (int i = 0; i < 10000 && Sandbox::ops_in_flight() > ops_before; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(Sandbox::ops_in_flight(), ops_before) << "seed " << seed;
    // An op can end (and be counted out) on a pool thread while the io thread that posted
    // it there is still inside that post: hold both io threads, so that every handler
    // that ran or was queued before is done, before the manager and its pool go.
    {
      struct Hold {  // shared: the io threads still read it after this scope is left
        std::mutex m;
        std::condition_variable cv;
        int held = 0;
        bool go = false;
      };
      auto h = std::make_shared<Hold>();
      for (int i = 0; i < 2; ++i)
        asio::post(io_, [h] {
          std::unique_lock lk(h->m);
          ++h->held;
          h->cv.notify_all();
          h->cv.wait(lk, [&] { return h->go; });
        });
      {
        std::unique_lock lk(h->m);
        h->cv.wait(lk, [&] { return h->held == 2; });
      }
      mgr_.reset();
      {
        std::lock_guard lk(h->m);
        h->go = true;
      }
      h->cv.notify_all();
    }
    // The next seed starts with an empty store: the manager lists records (its tick, its
    // shutdown), and 2,000 seeds' worth of them made each seed slower than the last.
    store_.clear();
  }
}

}  // namespace
}  // namespace tp::node

namespace tp::node {
namespace {

TEST_F(ManagerTest, PauseFreezesAndTheNextRequestResumes) {
  make();
  auto r = create_sync();
  ASSERT_TRUE(r);
  const std::string id = r->id;
  auto paused = record_future([&](auto cb) { mgr_->pause(id, cb); });
  auto p = get_or_fail(paused);
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->state, "paused");
  EXPECT_EQ(stored(id).state, "paused");
  EXPECT_TRUE(backend_->is_frozen(id));
  // Pausing again answers the same record.
  auto again = record_future([&](auto cb) { mgr_->pause(id, cb); });
  EXPECT_EQ(get_or_fail(again)->state, "paused");
  // An exec resumes it on the way in, and its record follows.
  ExecParams ep;
  ep.argv = {"true"};
  ExecCallbacks cb;
  cb.on_done = [](Result<ExecOutcome>) {};
  ASSERT_TRUE(mgr_->exec(id, ep, cb));
  EXPECT_FALSE(backend_->is_frozen(id));
  EXPECT_EQ(mgr_->get(id)->state, "running");
  auto settled = record_future([&](auto cb) { mgr_->resume(id, cb); });  // after the record op
  EXPECT_EQ(get_or_fail(settled)->state, "running");
  EXPECT_EQ(stored(id).state, "running");
  EXPECT_EQ(metrics_.pauses.load(), 1u);
  EXPECT_EQ(metrics_.resumes.load(), 1u);
  // A paused sandbox can be deleted (thawed and destroyed).
  ASSERT_TRUE(get_or_fail(*std::make_unique<std::future<Result<SandboxRecord>>>(
      record_future([&](auto cb) { mgr_->pause(id, cb); }))));
  auto d = destroy_async(id);
  auto dr = get_or_fail(d);
  ASSERT_TRUE(dr);
  EXPECT_EQ(dr->state, "stopped");
  EXPECT_FALSE(backend_->is_live(id));
  EXPECT_FALSE(backend_->is_frozen(id));
}

// A delete that comes in while a pause freezes the sandbox: the pause is refused (it
// used to answer 200 with the state "stopping" or "running" on a frozen sandbox), and
// the delete ends it, thawed.
TEST_F(ManagerTest, APauseOvertakenByADeleteIsRefused) {
  make();
  auto r = create_sync();
  ASSERT_TRUE(r);
  std::optional<std::future<Result<SandboxRecord>>> del;
  backend_->on_freeze = [&](const std::string& id) {
    backend_->on_freeze = nullptr;
    del.emplace(destroy_nowait_async(id));
  };
  auto paused = record_future([&](auto cb) { mgr_->pause(r->id, cb); });
  auto p = get_or_fail(paused);
  ASSERT_FALSE(p) << "answered " << p->state;
  EXPECT_EQ(p.error().code, Code::kConflict);
  ASSERT_TRUE(del);
  ASSERT_TRUE(get_or_fail(*del));
  for (int i = 0; i < 6000 && mgr_->live_count() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(stopped_reason(r->id), "deleted");
  EXPECT_FALSE(backend_->is_live(r->id));
  EXPECT_FALSE(backend_->is_frozen(r->id));
}

TEST_F(ManagerTest, PooledSandboxesAreHiddenAndHandedOutOnce) {
  make();
  CreateParams pp;
  pp.pooled = true;
  pp.template_name = "tpl";
  auto f = record_future([&](auto cb) { mgr_->create(pp, cb); });
  auto made = get_or_fail(f);
  ASSERT_TRUE(made) << made.error().message();
  const std::string id = made->id;
  EXPECT_TRUE(made->pooled);
  EXPECT_EQ(made->expires_at_ms, 0);  // no TTL while pooled
  EXPECT_TRUE(ids_live().empty());
  EXPECT_EQ(mgr_->get(id).error().code, Code::kNotFound);
  ExecParams ep;
  ep.argv = {"true"};
  EXPECT_EQ(mgr_->exec(id, ep, {}).error().code, Code::kNotFound);
  EXPECT_EQ(get_or_fail(*std::make_unique<std::future<Result<SandboxRecord>>>(destroy_async(id)))
                .error()
                .code,
            Code::kNotFound);  // not the client's to delete

  CreateParams claim;
  claim.labels = {{"who", "me"}};
  claim.ttl_seconds = 60;
  auto c1 = record_future([&](auto cb) { mgr_->claim(id, claim, cb); });
  auto c2 = record_future([&](auto cb) { mgr_->claim(id, claim, cb); });
  auto r1 = get_or_fail(c1), r2 = get_or_fail(c2);
  ASSERT_TRUE(r1.has_value() != r2.has_value()) << "handed out twice, or never";
  auto& got = r1 ? *r1 : *r2;
  EXPECT_FALSE(got.pooled);
  EXPECT_EQ(got.labels, claim.labels);
  EXPECT_GT(got.expires_at_ms, got.created_at_ms);
  EXPECT_EQ((r1 ? r2 : r1).error().code, Code::kNotFound);
  auto st = stored(id);
  EXPECT_FALSE(st.pooled);
  EXPECT_EQ(st.labels, claim.labels);
  EXPECT_EQ(ids_live(), std::set<std::string>{id});
}

TEST_F(ManagerTest, JobQuotasAreCheckedAtomicallyWithTheCreate) {
  make();
  std::atomic<int> asked{0};
  mgr_->set_admission([&](const CreateParams& p, const JobUse& use) -> Result<void> {
    asked++;
    if (p.job != "j1") return fail(Code::kNotFound, "job '" + p.job + "' not found");
    if (use.sandboxes + 1 > 3)
      return fail(Code::kResourceExhausted,
                  "job j1 quota: sandboxes " + std::to_string(use.sandboxes) + " of 3 in use");
    return {};
  });
  CreateParams p;
  p.job = "j1";
  std::vector<std::future<Result<SandboxRecord>>> fs;
  std::vector<std::thread> ts;
  std::mutex fmu;
  for (int i = 0; i < 8; ++i)
    ts.emplace_back([&] {
      auto f = record_future([&](auto cb) { mgr_->create(p, cb); });
      std::lock_guard lk(fmu);
      fs.push_back(std::move(f));
    });
  for (auto& t : ts) t.join();
  int ok = 0, refused = 0;
  for (auto& f : fs) {
    auto r = get_or_fail(f);
    if (r) {
      ++ok;
      EXPECT_EQ(r->job, "j1");
    } else {
      ++refused;
      EXPECT_EQ(r.error().code, Code::kResourceExhausted);
      EXPECT_NE(r.error().message().find("sandboxes"), std::string::npos);
    }
  }
  EXPECT_EQ(ok, 3);
  EXPECT_EQ(refused, 5);
  ListFilter lf;
  lf.job = "j1";
  EXPECT_EQ(mgr_->list(lf)->size(), 3u);
  // An ended sandbox gives its share back.
  auto one = mgr_->list(lf)->front().id;
  ASSERT_TRUE(
      get_or_fail(*std::make_unique<std::future<Result<SandboxRecord>>>(destroy_async(one))));
  auto f = record_future([&](auto cb) { mgr_->create(p, cb); });
  EXPECT_TRUE(get_or_fail(f));
  CreateParams other;
  other.job = "nope";
  auto g = record_future([&](auto cb) { mgr_->create(other, cb); });
  EXPECT_EQ(get_or_fail(g).error().code, Code::kNotFound);
}

// The trajectory log's hooks: a creation before it is answered, a background process's
// end, a keyed call's note kept with its command, and what a restart finds unanswered.
TEST_F(ManagerTest, TrajectoryHooksSeeCreationsProcessEndsAndStepTags) {
  std::mutex m;
  std::vector<std::string> seen;
  ManagerOptions o;
  o.on_created = [&](const SandboxRecord& r) {
    std::lock_guard lk(m);
    seen.push_back("created " + r.id + " " + r.state);
  };
  o.on_process_exit = [&](const std::string& id, const ProcessInfo& i) {
    std::lock_guard lk(m);
    seen.push_back("exit " + id + " " + std::to_string(i.pid) + " " +
                   std::to_string(i.outcome ? i.outcome->result.exit_code : -99));
  };
  make(o);
  auto r = create_sync();
  ASSERT_TRUE(r);
  {
    std::lock_guard lk(m);
    ASSERT_EQ(seen, std::vector<std::string>{"created " + r->id + " running"});
  }
  ExecParams p;
  p.argv = {"sleep", "1"};
  p.step_tag = "TAG-P";
  ASSERT_TRUE(start_process_sync(r->id, p));
  auto a = agent(r->id);
  EXPECT_NE(a->meta_of(1).find(R"("step":"TAG-P")"), std::string::npos) << a->meta_of(1);
  ExecParams e;
  e.argv = {"true"};
  e.step_tag = "TAG-E";
  ExecCallbacks none;
  none.on_started = [](uint32_t) {};
  none.on_output = [](int, std::string_view) {};
  none.on_done = [](Result<ExecOutcome>) {};
  auto eid = mgr_->exec(r->id, e, none);
  ASSERT_TRUE(eid);
  EXPECT_EQ(a->meta_of(*eid), R"({"kind":"exec","step":"TAG-E"})");
  e.step_tag.clear();
  auto plain = mgr_->exec(r->id, e, none);
  ASSERT_TRUE(plain);
  EXPECT_EQ(a->meta_of(*plain), R"({"kind":"exec"})");
  a->finish(1, "", 3);
  for (int i = 0; i < 600; ++i) {
    {
      std::lock_guard lk(m);
      if (seen.size() == 2) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  {
    std::lock_guard lk(m);
    ASSERT_EQ(seen.size(), 2u);
    EXPECT_EQ(seen[1], "exit " + r->id + " 1 3");
  }
  auto d = destroy_async(r->id);
  ASSERT_TRUE(get_or_fail(d));
}

TEST_F(ManagerTest, RecoverReportsTheKeyedCallsItFindsUnanswered) {
  SandboxRecord r = running_record("n0-steps", 0);
  ASSERT_TRUE(store_.insert(r));
  backend_->adoptable = {"n0-steps"};
  std::shared_ptr<FakeAgent> adopted;
  std::vector<std::string> lost;
  ManagerOptions o;
  o.agent_connect = [&](asio::io_context& io, const std::string&,
                        std::string) -> Result<std::shared_ptr<AgentClient>> {
    adopted = std::make_shared<FakeAgent>(io);
    adopted->resumed_ = {
        {40, R"({"kind":"process","handle":7,"argv":["x"],"started_ms":5,"limit":9,"step":"P"})",
         true},
        {41, R"({"kind":"exec","step":"E"})", true},
        {42, R"({"kind":"exec"})", true},
    };
    return adopted;
  };
  o.on_step_lost = [&](const std::string& id, const std::string& tag, uint32_t pid) {
    lost.push_back(id + " " + tag + " " + std::to_string(pid));
  };
  make_recovered(o);
  // Before serving: the process runs on (its handle), the request's command was stopped.
  EXPECT_EQ(lost, (std::vector<std::string>{"n0-steps P 7", "n0-steps E 0"}));
  EXPECT_EQ(adopted->signalled(), (std::vector<uint32_t>{41, 42}));
  auto d = destroy_async("n0-steps");
  ASSERT_TRUE(get_or_fail(d));
}

}  // namespace
}  // namespace tp::node
