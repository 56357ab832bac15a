// Fakes for the node's unit tests: a runtime Backend whose creates can be held
// at a gate, its instances, and an AgentClient that answers from memory.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "node/agent_client.h"
#include "runtime/backend.h"

namespace tp::node::testing {

// A gate a thread waits at until the test opens it (opening first is fine).
class Gate {
 public:
  void open() {
    std::lock_guard lk(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

class FakeBackend;

class FakeInstance : public runtime::SandboxInstance {
 public:
  FakeInstance(FakeBackend* b, std::string id, std::string address)
      : b_(b), id_(std::move(id)), address_(std::move(address)) {}
  ~FakeInstance() override;
  const std::string& id() const override { return id_; }
  int agent_fd() const override { return -1; }
  pid_t pid() const override { return 1; }
  bool alive() override { return !destroyed_ && !released_; }
  Result<runtime::Usage> usage() override { return runtime::Usage{}; }
  Result<uint64_t> oom_kills() override;
  Result<void> destroy() override;
  std::string agent_address() const override { return address_; }
  void release() override;
  Result<void> freeze() override;
  Result<void> freeze_for_destroy() override;
  Result<void> thaw() override;

 private:
  FakeBackend* b_;
  std::string id_;
  std::string address_;
  bool destroyed_ = false;
  bool released_ = false;
};

// Tracks every instance it made: `live` ones hold resources (not destroyed,
// not released); `released` ones keep running for a next daemon.
class FakeBackend : public runtime::Backend {
 public:
  std::string tier() const override { return "container"; }
  Result<std::unique_ptr<runtime::SandboxInstance>> create(
      const runtime::SandboxSpec& spec) override {
    std::shared_ptr<Gate> gate;
    {
      std::lock_guard lk(mu);
      entered.insert(spec.id);
      specs[spec.id] = spec;
      if (hold_creates) {
        auto& g = gates[spec.id];
        if (!g) g = std::make_shared<Gate>();
        gate = g;
      }
      cv.notify_all();
    }
    if (gate) gate->wait();
    std::lock_guard lk(mu);
    if (fail_creates) return fail(Code::kInternal, "fake create failure");
    live.insert(spec.id);
    uid_bases[spec.id] = spec.uid_base;
    return std::unique_ptr<runtime::SandboxInstance>(new FakeInstance(this, spec.id, address));
  }
  Result<std::unique_ptr<runtime::SandboxInstance>> adopt(
      const runtime::SandboxSpec& spec) override {
    std::lock_guard lk(mu);
    specs[spec.id] = spec;
    if (!adoptable.count(spec.id)) return fail(Code::kNotFound, "gone");
    adopted.insert(spec.id);
    live.insert(spec.id);
    uid_bases[spec.id] = spec.uid_base;
    return std::unique_ptr<runtime::SandboxInstance>(new FakeInstance(this, spec.id, address));
  }
  std::vector<std::string> cleanup_orphans(const std::vector<std::string>& keep) override {
    std::lock_guard lk(mu);
    kept = keep;
    keeps.push_back(keep);
    cleanup_calls++;
    return {};
  }
  // Opens (or pre-opens) the gate of one create.
  void release_create(const std::string& id) {
    std::shared_ptr<Gate> g;
    {
      std::lock_guard lk(mu);
      auto& slot = gates[id];
      if (!slot) slot = std::make_shared<Gate>();
      g = slot;
    }
    g->open();
  }
  void wait_entered(const std::string& id) {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return entered.count(id) > 0; });
  }
  size_t live_count() {
    std::lock_guard lk(mu);
    return live.size();
  }
  bool is_live(const std::string& id) {
    std::lock_guard lk(mu);
    return live.count(id) > 0;
  }
  // Under mu: another sandbox's destroy may change the set meanwhile.
  bool is_frozen(const std::string& id) {
    std::lock_guard lk(mu);
    return frozen.count(id) > 0;
  }

  std::mutex mu;
  std::condition_variable cv;
  bool hold_creates = false;
  bool fail_creates = false;
  std::string address = "/run/fake/agent.sock";  // "" = cannot be released
  std::map<std::string, std::shared_ptr<Gate>> gates;
  std::set<std::string> entered, live, released, destroyed, adoptable, adopted;
  std::map<std::string, runtime::SandboxSpec> specs;  // the last create's or adopt's, by id
  std::vector<std::string> kept;
  int cleanup_calls = 0;
  std::vector<std::vector<std::string>> keeps;  // every cleanup_orphans() call's, in order
  std::map<std::string, uint32_t> uid_bases;    // SandboxSpec::uid_base of each create/adopt
  std::set<std::string> failing_destroys;       // destroy() fails and the instance lives on
  std::set<std::string> frozen;                 // freeze()d and not thawed
  // Called by freeze() once frozen (without the backend's lock): lets a test act while
  // a pause is under way.
  std::function<void(const std::string& id)> on_freeze;
  std::set<std::string> frozen_for_destroy;   // ever freeze_for_destroy()d
  bool freeze_fails = false;                  // freeze_for_destroy() fails
  std::map<std::string, uint64_t> oom_kills;  // a sandbox's OOM-kill count
  std::set<std::string> oom_unreadable;       // its oom_kills() fails
  int oom_reads = 0;                          // oom_kills() calls, any sandbox
  void wait_oom_reads(int n) {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return oom_reads >= n; });
  }
};

inline FakeInstance::~FakeInstance() { (void)destroy(); }
inline Result<uint64_t> FakeInstance::oom_kills() {
  std::lock_guard lk(b_->mu);
  b_->oom_reads++;
  b_->cv.notify_all();
  if (b_->oom_unreadable.count(id_)) return fail(Code::kUnavailable, "fake: no oom count");
  return b_->oom_kills[id_];
}
inline Result<void> FakeInstance::destroy() {
  if (destroyed_ || released_) return {};
  std::lock_guard lk(b_->mu);
  if (b_->failing_destroys.count(id_)) return fail(Code::kInternal, "fake destroy failure");
  destroyed_ = true;
  b_->frozen.erase(id_);  // destroy thaws first (a v1-frozen task cannot die)
  b_->live.erase(id_);
  b_->destroyed.insert(id_);
  return {};
}
inline Result<void> FakeInstance::freeze() {
  std::function<void(const std::string&)> hook;
  {
    std::lock_guard lk(b_->mu);
    if (destroyed_) return fail(Code::kConflict, "destroyed");
    b_->frozen.insert(id_);
    hook = b_->on_freeze;
  }
  if (hook) hook(id_);
  return {};
}
inline Result<void> FakeInstance::freeze_for_destroy() {
  std::lock_guard lk(b_->mu);
  if (destroyed_) return fail(Code::kConflict, "destroyed");
  if (b_->freeze_fails) return fail(Code::kUnavailable, "fake: cannot freeze");
  b_->frozen.insert(id_);
  b_->frozen_for_destroy.insert(id_);
  return {};
}
inline Result<void> FakeInstance::thaw() {
  std::lock_guard lk(b_->mu);
  b_->frozen.erase(id_);
  return {};
}
inline void FakeInstance::release() {
  if (destroyed_ || released_) return;
  released_ = true;
  std::lock_guard lk(b_->mu);
  b_->live.erase(id_);
  b_->released.insert(id_);
}

// An agent session in memory. Execs stay pending until finish() or close().
class FakeAgent : public AgentClient {
 public:
  FakeAgent(boost::asio::io_context& io, bool ready = true) : io_(io), ready_(ready) {}
  void start(std::function<void(Result<void>)> on_ready) override {
    bool ok = ready_;
    // Only then is `this` used (the fixture keeps every agent it made).
    bool dies = ok && die_at_ready;
    boost::asio::post(io_, [this, on_ready, ok, dies] {
      // The session ends just as the agent reports ready: its close is on its way
      // (posted) when the ready is handled.
      if (dies) die();
      if (ok)
        on_ready(Result<void>{});
      else
        on_ready(fail(Code::kUnavailable, "fake agent not ready"));
    });
  }
  void set_on_closed(std::function<void(const Error&)> cb) override {
    std::lock_guard lk(mu_);
    on_closed_ = std::move(cb);
  }
  uint32_t exec(const ExecRequest& req, ExecHandlers h) override {
    std::lock_guard lk(mu_);
    uint32_t id = next_++;
    metas_[id] = req.meta;
    windows_[id] = req.window;
    if (closed_) {
      boost::asio::post(io_, [h] { h.on_done(fail(Code::kUnavailable, "closed")); });
    } else {
      // As the agent does: kStarted (pid 100 + id) when the node asks for it, unless
      // the command is made to fail before it runs (fail_before_start).
      if (h.on_started && !fail_before_start)
        boost::asio::post(io_, [s = h.on_started, id] { s(100 + id); });
      pending_[id] = std::move(h);
    }
    return id;
  }
  void send_stdin(uint32_t, std::string, bool) override {}
  void signal(uint32_t id, int) override {
    std::lock_guard lk(mu_);
    signalled_.push_back(id);
  }
  void credit(uint32_t id, uint64_t bytes) override {
    std::lock_guard lk(mu_);
    credited_[id] += bytes;
  }
  void write_file(std::string, std::string, uint32_t, bool,
                  std::function<void(Result<uint64_t>)> cb) override {
    boost::asio::post(io_, [cb] { cb(uint64_t{0}); });
  }
  void write_file_from(std::string, ByteSource, uint32_t, bool,
                       std::function<void(Result<uint64_t>)> cb) override {
    boost::asio::post(io_, [cb] { cb(uint64_t{0}); });
  }
  void write_stdin(uint32_t, std::string, bool, std::function<void(Result<void>)> cb) override {
    boost::asio::post(io_, [cb] { cb(Result<void>{}); });
  }
  void read_file(std::string, uint64_t, std::function<void(Result<std::string>)> cb) override {
    boost::asio::post(io_, [cb] { cb(std::string()); });
  }
  void read_chunk(std::string, uint64_t, uint64_t,
                  std::function<void(Result<FileChunk>)> cb) override {
    boost::asio::post(io_, [cb] { cb(FileChunk{}); });
  }
  void stat(std::string, std::function<void(Result<FileEntry>)> cb) override {
    boost::asio::post(io_, [cb] { cb(FileEntry{}); });
  }
  void list(std::string, std::function<void(Result<std::vector<FileEntry>>)> cb) override {
    boost::asio::post(io_, [cb] { cb(std::vector<FileEntry>{}); });
  }
  void remove(std::string, bool, std::function<void(Result<void>)> cb) override {
    boost::asio::post(io_, [cb] { cb(Result<void>{}); });
  }
  void mkdir(std::string, uint32_t, bool, std::function<void(Result<void>)> cb) override {
    boost::asio::post(io_, [cb] { cb(Result<void>{}); });
  }
  void ping(std::function<void(Result<void>)> cb) override {
    boost::asio::post(io_, [cb] { cb(Result<void>{}); });
  }
  std::vector<ResumedCommand> resumed() const override { return resumed_; }
  Result<void> attach(uint32_t id, ExecHandlers h) override {
    std::lock_guard lk(mu_);
    for (const auto& c : resumed_)
      if (c.id == id) {
        pending_[id] = std::move(h);
        return {};
      }
    return fail(Code::kNotFound, "not resumed");
  }
  void close() override { end(Error{Code::kUnavailable, 0, "closed by the node"}); }
  size_t pending() const override {
    std::lock_guard lk(mu_);
    return pending_.size();
  }

  // The agent side ends the session (the agent died).
  void die() { end(Error{Code::kUnavailable, 0, "agent died"}); }
  // Output then exit of a pending command (killed by `signal` when it is not 0).
  void finish(uint32_t id, std::string out, int64_t code, int signal = 0) {
    ExecHandlers h;
    {
      std::lock_guard lk(mu_);
      auto it = pending_.find(id);
      if (it == pending_.end()) return;
      h = std::move(it->second);
      pending_.erase(it);
    }
    boost::asio::post(io_, [h, out, code, signal] {
      if (h.on_output && !out.empty()) h.on_output(1, out);
      ExecResult r;
      r.exit_code = code;
      r.signal = signal;
      h.on_done(r);
    });
  }
  std::string meta_of(uint32_t id) {
    std::lock_guard lk(mu_);
    return metas_[id];
  }
  bool closed() {
    std::lock_guard lk(mu_);
    return closed_;
  }
  std::vector<uint32_t> signalled() {
    std::lock_guard lk(mu_);
    return signalled_;
  }
  uint64_t credited(uint32_t id) {
    std::lock_guard lk(mu_);
    return credited_[id];
  }
  uint64_t window_of(uint32_t id) {
    std::lock_guard lk(mu_);
    return windows_[id];
  }

  std::vector<ResumedCommand> resumed_;
  bool fail_before_start = false;  // execs get no kStarted (their finish() is their only answer)
  std::atomic<bool> die_at_ready{false};  // dies as it reports ready (start())

 private:
  void end(Error e) {
    std::map<uint32_t, ExecHandlers> pending;
    std::function<void(const Error&)> cb;
    {
      std::lock_guard lk(mu_);
      if (closed_) return;
      closed_ = true;
      pending.swap(pending_);
      cb = on_closed_;
    }
    boost::asio::post(io_, [pending, cb, e] {
      for (auto& [id, h] : pending) h.on_done(std::unexpected(e));
      if (cb) cb(e);
    });
  }
  boost::asio::io_context& io_;
  bool ready_;
  mutable std::mutex mu_;
  bool closed_ = false;
  uint32_t next_ = 1;
  std::map<uint32_t, ExecHandlers> pending_;
  std::map<uint32_t, std::string> metas_;
  std::vector<uint32_t> signalled_;
  std::map<uint32_t, uint64_t> credited_, windows_;
  std::function<void(const Error&)> on_closed_;
};

}  // namespace tp::node::testing
