// The SandboxManager test fixture: a real manager over a fake backend, the
// in-memory store and fake agents, on two io threads (shared by the manager's tests
// and those of what drives it: pools, jobs).
#pragma once

#include <gtest/gtest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "control/memory_store.h"
#include "fakes.h"
#include "node/sandbox_manager.h"

namespace tp::node {

namespace asio = boost::asio;
using control::SandboxRecord;
using testing::FakeAgent;
using testing::FakeBackend;

template <class T>
inline T get_or_fail(std::future<T>& f) {
  // A deadlock guard, not a timing threshold: every answer comes in milliseconds.
  if (f.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "no answer";
    std::abort();
  }
  return f.get();
}

// Runs an operation that answers a record; its answer as a future.
inline std::future<Result<SandboxRecord>> record_future(
    const std::function<void(std::function<void(Result<SandboxRecord>)>)>& op) {
  auto pr = std::make_shared<std::promise<Result<SandboxRecord>>>();
  auto f = pr->get_future();
  op([pr](Result<SandboxRecord> r) { pr->set_value(r); });
  return f;
}

class ManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tp-mgr-XXXXXX";
    dir_ = mkdtemp(tmpl);
    auto b = std::make_unique<FakeBackend>();
    backend_ = b.get();
    ASSERT_TRUE(registry_.add(std::move(b)));
    for (int i = 0; i < 2; ++i) threads_.emplace_back([this] { io_.run(); });
  }
  void TearDown() override {
    guard_.reset();
    io_.stop();
    for (auto& t : threads_) t.join();
    mgr_.reset();
    std::filesystem::remove_all(dir_);
  }
  void make(ManagerOptions o = {}) {
    o.data_dir = dir_;
    o.blocking_threads = 4;
    o.agent_from_fd = [this](asio::io_context& io, int,
                             std::string id) -> std::shared_ptr<AgentClient> {
      auto a = std::make_shared<FakeAgent>(io, agent_ready_);
      a->die_at_ready = agent_dies_at_ready_;
      std::lock_guard lk(mu_);
      agents_[id] = a;
      return a;
    };
    mgr_ = std::make_unique<SandboxManager>(io_, registry_, store_, metrics_, std::move(o));
  }
  std::shared_ptr<FakeAgent> agent(const std::string& id) {
    std::lock_guard lk(mu_);
    return agents_[id];
  }
  // Starts a create; answers its id (registered at once) and the future answer. Ended
  // sandboxes count too: a create that fails fast may be stored as ended before we look.
  std::pair<std::string, std::future<Result<SandboxRecord>>> create_async(CreateParams p = {}) {
    auto before = ids_live(true);
    auto pr = std::make_shared<std::promise<Result<SandboxRecord>>>();
    auto f = pr->get_future();
    mgr_->create(p, [pr](Result<SandboxRecord> r) { pr->set_value(r); });
    for (const auto& id : ids_live(true))
      if (!before.count(id)) return {id, std::move(f)};
    return {"", std::move(f)};
  }
  std::set<std::string> ids_live(bool with_ended = false) {
    std::set<std::string> out;
    ListFilter f;
    f.all = with_ended;
    auto l = mgr_->list(f);
    EXPECT_TRUE(l);
    if (l)
      for (auto& r : *l) out.insert(r.id);
    return out;
  }
  Result<SandboxRecord> create_sync(CreateParams p = {}) {
    auto [id, f] = create_async(p);
    return get_or_fail(f);
  }
  Result<ProcessInfo> start_process_sync(const std::string& id, ExecParams p) {
    auto pr = std::make_shared<std::promise<Result<ProcessInfo>>>();
    auto f = pr->get_future();
    mgr_->start_process(id, std::move(p), [pr](Result<ProcessInfo> i) { pr->set_value(i); });
    return get_or_fail(f);
  }
  std::future<Result<SandboxRecord>> destroy_async(const std::string& id,
                                                   EndReason why = EndReason::kDeleted) {
    auto pr = std::make_shared<std::promise<Result<SandboxRecord>>>();
    auto f = pr->get_future();
    mgr_->destroy(id, why, [pr](Result<SandboxRecord> r) { pr->set_value(r); });
    return f;
  }
  std::future<Result<SandboxRecord>> destroy_nowait_async(const std::string& id) {
    auto pr = std::make_shared<std::promise<Result<SandboxRecord>>>();
    auto f = pr->get_future();
    mgr_->destroy_nowait(id, EndReason::kDeleted,
                         [pr](Result<SandboxRecord> r) { pr->set_value(r); });
    return f;
  }
  SandboxRecord stored(const std::string& id) {
    auto r = store_.get(id);
    EXPECT_TRUE(r && *r) << id;
    return r && *r ? **r : SandboxRecord{};
  }
  // The end reason of a stored record that is stopped, else "not stopped: <state>".
  std::string stopped_reason(const std::string& id) {
    SandboxRecord s = stored(id);
    return s.state == "stopped" ? s.end_reason : "not stopped: " + s.state;
  }
  // Every stored record consistent with the backend and with itself.
  void expect_consistent(bool released_ok) {
    auto all = store_.list({});
    ASSERT_TRUE(all);
    for (const auto& r : *all) {
      if (r.state == "stopped") {
        EXPECT_FALSE(r.end_reason.empty()) << r.id;
        EXPECT_NE(r.ended_at_ms, 0) << r.id;
        EXPECT_FALSE(backend_->is_live(r.id)) << r.id << " stopped but its instance lives";
      } else {
        EXPECT_EQ(r.end_reason, "") << r.id << " is " << r.state << " with an end reason";
        EXPECT_EQ(r.ended_at_ms, 0) << r.id;
        EXPECT_EQ(r.state, "running") << r.id;
        bool released = backend_->released.count(r.id) > 0;
        EXPECT_TRUE(backend_->is_live(r.id) || (released_ok && released)) << r.id;
      }
    }
  }

  std::string dir_;
  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard_{
      asio::make_work_guard(io_)};
  // recover() runs the io_context itself: the fixture's runners stop first.
  // A manager that recover()s first, as a restarted daemon's does; recover() runs the
  // io_context itself, so the fixture's runners stop meanwhile.
  void make_recovered(ManagerOptions o) {
    stop_runners();
    make(std::move(o));
    ASSERT_TRUE(mgr_->recover());
    guard_.emplace(asio::make_work_guard(io_));
    for (int i = 0; i < 2; ++i) threads_.emplace_back([this] { io_.run(); });
  }
  void stop_runners() {
    guard_.reset();
    io_.stop();
    for (auto& t : threads_) t.join();
    threads_.clear();
    io_.restart();
  }
  std::vector<std::thread> threads_;
  control::MemorySandboxStore store_;
  Metrics metrics_;
  runtime::Registry registry_;
  FakeBackend* backend_ = nullptr;
  bool agent_ready_ = true;
  bool agent_dies_at_ready_ = false;  // FakeAgent::die_at_ready of every agent made
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<FakeAgent>> agents_;
  std::unique_ptr<SandboxManager> mgr_;
};

}  // namespace tp::node
