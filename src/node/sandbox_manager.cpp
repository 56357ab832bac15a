#include "node/sandbox_manager.h"

#include <boost/asio/post.hpp>

#include <chrono>
#include <future>

#include "common/ids.h"
#include "common/log.h"

namespace tp::node {

namespace asio = boost::asio;
using control::SandboxRecord;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {
int64_t mono_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
constexpr auto kAgentReadyTimeout = std::chrono::seconds(15);
}  // namespace

struct SandboxManager::BgProc {
  std::mutex mu;
  ProcessInfo info;  // out/err accumulate here
  std::vector<std::function<void()>> waiters;  // run once when it exits
};

struct SandboxManager::Live {
  std::mutex mu;  // guards rec, last_active_ms, running_execs, destroying
  SandboxRecord rec;
  std::unique_ptr<runtime::SandboxInstance> inst;  // immutable once live
  ResolvedImage image;                             // immutable once live
  std::shared_ptr<AgentClient> agent;              // immutable once live
  uint64_t disk_bytes = 0;
  int64_t last_active_ms = 0;
  int running_execs = 0;
  bool destroying = false;
  // Ended, but its final record could not be stored (e.g. a full disk): it stays in
  // live_ (so that it is reported stopped, not the stale stored state) until on_tick
  // stores it.
  bool unrecorded = false;
  std::map<uint32_t, std::shared_ptr<BgProc>> procs;
};

namespace {
// Background processes kept per sandbox; the oldest exited ones are forgotten first.
constexpr size_t kMaxProcs = 1024;
}  // namespace

SandboxManager::SandboxManager(asio::io_context& io, std::unique_ptr<runtime::Backend> backend,
                               control::Store& store, Metrics& metrics, std::string node_name)
    : io_(io),
      backend_(std::move(backend)),
      store_(store),
      metrics_(metrics),
      node_(std::move(node_name)),
      timer_(io) {}

SandboxManager::~SandboxManager() { blocking_.join(); }

void SandboxManager::persist(const SandboxRecord& r) {
  auto res = store_.put(r);
  if (!res) TP_SB_ERROR(r.id, "store: {}", res.error().message());
}

Result<void> SandboxManager::recover() {
  auto recs = store_.list(/*live_only=*/true);
  if (!recs) return std::unexpected(recs.error());
  // A record that cannot be marked stopped (e.g. a full disk) would stay "running"
  // for a sandbox that is gone: refuse to serve, after cleaning up, so that the
  // next start (with space again) records it.
  std::optional<Error> unrecorded;
  for (auto& r : *recs) {
    TP_SB_WARN(r.id, "left behind by a previous run (state {}): cleaning up", r.state);
    r.state = "stopped";
    r.ended_at_ms = now_ms();
    r.end_reason = "daemon_restart";
    if (auto res = store_.put(r); !res && !unrecorded)
      unrecorded = Error{res.error().code, res.error().sys_errno,
                         "cannot record " + r.id + " as stopped: " + res.error().message()};
  }
  auto cleaned = backend_->cleanup_orphans({});
  for (const auto& id : cleaned) TP_SB_WARN(id, "removed leftovers of a previous run");
  if (unrecorded) return std::unexpected(*unrecorded);
  // Forget ended sandboxes after a day.
  (void)store_.prune_ended(now_ms() - 24ll * 3600 * 1000);
  return {};
}

void SandboxManager::start() {
  timer_.expires_after(std::chrono::milliseconds(500));
  timer_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    on_tick();
    {
      std::lock_guard lk(mu_);
      if (stopping_) return;
    }
    start();
  });
}

void SandboxManager::on_tick() {
  int64_t now = now_ms();
  std::vector<std::pair<std::shared_ptr<Live>, std::string>> expired;
  std::vector<std::pair<std::shared_ptr<Live>, SandboxRecord>> unrecorded;
  {
    std::lock_guard lk(mu_);
    for (auto& [id, live] : live_) {
      std::lock_guard lk2(live->mu);
      if (live->unrecorded) unrecorded.emplace_back(live, live->rec);
      if (live->destroying) continue;
      if (live->rec.expires_at_ms && now >= live->rec.expires_at_ms) {
        expired.emplace_back(live, "ttl");
      } else if (live->rec.idle_timeout_seconds && live->running_execs == 0 &&
                 now - live->last_active_ms >=
                     static_cast<int64_t>(live->rec.idle_timeout_seconds) * 1000) {
        expired.emplace_back(live, "idle");
      }
    }
  }
  for (auto& [live, reason] : expired) {
    TP_SB_INFO(live->rec.id, "expired ({})", reason);
    teardown(live, reason, nullptr);
  }
  for (auto& [live, rec] : unrecorded) {
    if (!store_.put(rec)) continue;  // still failing: retry on the next tick
    std::lock_guard lk(mu_);
    auto it = live_.find(rec.id);
    if (it != live_.end() && it->second == live) live_.erase(it);
  }
}

void SandboxManager::shutdown() {
  std::vector<std::shared_ptr<Live>> all;
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    for (auto& [id, l] : live_) all.push_back(l);
  }
  timer_.cancel();
  std::vector<std::future<void>> done;
  for (auto& l : all) {
    auto p = std::make_shared<std::promise<void>>();
    done.push_back(p->get_future());
    teardown(l, "daemon_shutdown", [p](Result<SandboxRecord>) { p->set_value(); });
  }
  for (auto& f : done) f.wait();
}

void SandboxManager::create(CreateParams p,
                            std::function<void(Result<SandboxRecord>)> cb) {
  if (p.tier != "container") {
    asio::post(io_, [cb, t = p.tier] {
      cb(fail(Code::kInvalidArgument, "tier '" + t + "' is not available on this node"));
    });
    return;
  }
  if (p.image.empty()) {
    asio::post(io_, [cb] { cb(fail(Code::kInvalidArgument, "field 'image' must not be empty")); });
    return;
  }
  if (p.image != "host" && !resolver_) {
    asio::post(io_, [cb, img = p.image] { cb(fail(Code::kNotFound, "image '" + img + "' not found")); });
    return;
  }
  auto live = std::make_shared<Live>();
  SandboxRecord& r = live->rec;
  r.id = ids::new_sandbox_id(node_);
  r.state = "creating";
  r.tier = p.tier;
  r.image = p.image;
  r.node = node_;
  r.memory_mb = p.memory_mb;
  r.cpus = p.cpus;
  r.pids = p.pids;
  r.disk_mb = p.disk_mb;
  r.ttl_seconds = p.ttl_seconds;
  r.idle_timeout_seconds = p.idle_timeout_seconds;
  r.labels = p.labels;
  r.env = p.env;
  r.created_at_ms = now_ms();
  r.expires_at_ms = r.created_at_ms + static_cast<int64_t>(p.ttl_seconds) * 1000;
  live->disk_bytes = p.disk_mb << 20;
  {
    std::lock_guard lk(mu_);
    if (stopping_) {
      asio::post(io_, [cb] { cb(fail(Code::kUnavailable, "daemon is shutting down")); });
      return;
    }
    live_[r.id] = live;  // visible as "creating"
  }
  int64_t start_us = mono_us();
  asio::post(blocking_, [this, live, cb, start_us] {
    runtime::SandboxSpec spec;
    spec.id = live->rec.id;
    spec.image = live->rec.image;
    spec.memory_bytes = live->rec.memory_mb << 20;
    spec.cpus = live->rec.cpus;
    spec.pids_max = static_cast<uint32_t>(live->rec.pids);
    spec.disk_bytes = live->disk_bytes;
    Result<std::unique_ptr<runtime::SandboxInstance>> inst = fail(Code::kInternal, "not created");
    if (live->rec.image != "host") {
      auto img = resolver_(live->rec.image);
      if (img) {
        live->image = std::move(*img);
        spec.layers = live->image.layers;
      } else {
        inst = std::unexpected(img.error());
      }
    }
    for (const auto& [k, v] : live->image.env) spec.env.emplace(k, v);
    for (const auto& [k, v] : live->rec.env) spec.env[k] = v;
    if (live->rec.image == "host" || !live->image.layers.empty()) inst = backend_->create(spec);
    if (!inst) {
      TP_SB_ERROR(live->rec.id, "create failed: {}", inst.error().message());
      metrics_.creation_failures++;
      {
        std::lock_guard lk(mu_);
        live_.erase(live->rec.id);
      }
      {
        std::lock_guard lk(live->mu);
        live->rec.state = "stopped";
        live->rec.ended_at_ms = now_ms();
        live->rec.end_reason = "failed";
      }
      persist(live->rec);
      Error e = inst.error();
      asio::post(io_, [cb, e] { cb(std::unexpected(e)); });
      return;
    }
    live->inst = std::move(*inst);
    // Recorded here, while the agent starts (finish_create waits for it), not on
    // the io thread after: a crash in between leaves a "running" record, which
    // recover() cleans up like any other; an agent that fails overwrites it.
    SandboxRecord running;
    {
      std::lock_guard lk(live->mu);
      running = live->rec;
    }
    running.state = "running";
    persist(running);
    finish_create(live, cb, start_us);
  });
}

void SandboxManager::finish_create(std::shared_ptr<Live> live,
                                   std::function<void(Result<SandboxRecord>)> cb,
                                   int64_t start_us) {
  live->agent = AgentClient::create(io_, live->inst->agent_fd(), live->rec.id);
  auto timer = std::make_shared<asio::steady_timer>(io_, kAgentReadyTimeout);
  auto once = std::make_shared<std::once_flag>();
  auto finish = [this, live, cb, start_us, timer, once](Result<void> ready) {
    std::call_once(*once, [&] {
      timer->cancel();
      if (!ready) {
        Error e = ready.error();
        TP_SB_ERROR(live->rec.id, "agent not ready: {}", e.message());
        metrics_.creation_failures++;
        teardown(live, "failed", [cb, e](Result<SandboxRecord>) {
          cb(fail(Code::kInternal, "sandbox failed to start: " + e.message()));
        });
        return;
      }
      SandboxRecord snapshot;
      {
        std::lock_guard lk(live->mu);
        live->rec.state = "running";
        live->last_active_ms = now_ms();
        snapshot = live->rec;
      }
      metrics_.creations++;
      metrics_.create_seconds.observe(static_cast<double>(mono_us() - start_us) / 1e6);
      TP_SB_INFO(snapshot.id, "running (pid {})", live->inst->pid());
      cb(snapshot);
    });
  };
  timer->async_wait([finish](boost::system::error_code ec) {
    if (!ec) finish(fail(Code::kDeadlineExceeded, "agent did not report ready in time"));
  });
  std::weak_ptr<Live> weak = live;
  live->agent->set_on_closed([this, weak](const Error& e) {
    auto l = weak.lock();
    if (!l) return;
    bool destroying;
    {
      std::lock_guard lk(l->mu);
      destroying = l->destroying;
    }
    if (!destroying) {
      TP_SB_WARN(l->rec.id, "agent connection lost ({}): sandbox failed", e.message());
      teardown(l, "failed", nullptr);
    }
  });
  live->agent->start(finish);
}

void SandboxManager::teardown(std::shared_ptr<Live> live, std::string reason,
                              std::function<void(Result<SandboxRecord>)> cb) {
  {
    std::lock_guard lk(live->mu);
    if (live->destroying) {
      // Someone else is tearing it down; answer with the record as it will end.
      if (cb) {
        SandboxRecord r = live->rec;
        asio::post(io_, [cb, r] { cb(r); });
      }
      return;
    }
    live->destroying = true;
  }
  asio::post(blocking_, [this, live, reason, cb] {
    if (live->agent) live->agent->close();
    Result<void> d = live->inst ? live->inst->destroy() : Result<void>{};
    live->image.pin.reset();
    if (!d) TP_SB_ERROR(live->rec.id, "destroy: {}", d.error().message());
    SandboxRecord snapshot;
    {
      std::lock_guard lk(live->mu);
      live->rec.state = "stopped";
      live->rec.ended_at_ms = now_ms();
      live->rec.end_reason = reason;
      snapshot = live->rec;
    }
    auto stored = store_.put(snapshot);
    if (!stored) {
      TP_SB_ERROR(snapshot.id, "store: {}; kept in memory until it can be stored", stored.error().message());
      std::lock_guard lk(live->mu);
      live->unrecorded = true;
    } else {
      std::lock_guard lk(mu_);
      auto it = live_.find(snapshot.id);
      if (it != live_.end() && it->second == live) live_.erase(it);
    }
    metrics_.destructions++;
    TP_SB_INFO(snapshot.id, "stopped ({})", reason);
    if (cb) asio::post(io_, [cb, snapshot, d] {
      if (!d) cb(std::unexpected(d.error()));
      else cb(snapshot);
    });
  });
}

std::shared_ptr<SandboxManager::Live> SandboxManager::find_live(const std::string& id) {
  std::lock_guard lk(mu_);
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : it->second;
}

Error SandboxManager::not_live_error(const std::string& id) {
  auto rec = store_.get(id);
  if (rec && *rec) return Error{Code::kConflict, 0, "sandbox " + id + " is " + (*rec)->state};
  return Error{Code::kNotFound, 0, "sandbox " + id + " not found"};
}

Result<SandboxRecord> SandboxManager::get(const std::string& id) {
  if (auto live = find_live(id)) {
    std::lock_guard lk(live->mu);
    return live->rec;
  }
  auto rec = store_.get(id);
  if (!rec) return std::unexpected(rec.error());
  if (!*rec) return fail(Code::kNotFound, "sandbox " + id + " not found");
  return **rec;
}

Result<std::vector<SandboxRecord>> SandboxManager::list(
    const std::map<std::string, std::string>& labels, const std::string& state, bool all) {
  std::map<std::string, SandboxRecord> merged;
  if (all || state == "stopped" || state == "lost") {
    auto recs = store_.list(false);
    if (!recs) return std::unexpected(recs.error());
    for (auto& r : *recs) merged[r.id] = std::move(r);
  }
  {
    std::lock_guard lk(mu_);
    for (auto& [id, live] : live_) {
      std::lock_guard lk2(live->mu);
      merged[id] = live->rec;
    }
  }
  std::vector<SandboxRecord> out;
  for (auto& [id, r] : merged) {
    if (!state.empty() && r.state != state) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto it = r.labels.find(k);
      if (it == r.labels.end() || it->second != v) {
        match = false;
        break;
      }
    }
    if (match) out.push_back(std::move(r));
  }
  std::sort(out.begin(), out.end(),
            [](const SandboxRecord& a, const SandboxRecord& b) { return a.created_at_ms < b.created_at_ms; });
  return out;
}

void SandboxManager::destroy(const std::string& id, std::string reason,
                             std::function<void(Result<SandboxRecord>)> cb) {
  auto live = find_live(id);
  if (!live) {
    auto rec = store_.get(id);
    if (rec && *rec) {
      // Already ended: deleting again is not an error; answer the record.
      SandboxRecord r = **rec;
      asio::post(io_, [cb, r] { cb(r); });
    } else {
      asio::post(io_, [cb, id] { cb(fail(Code::kNotFound, "sandbox " + id + " not found")); });
    }
    return;
  }
  teardown(live, std::move(reason), std::move(cb));
}

Result<uint32_t> SandboxManager::exec(const std::string& id, ExecParams p, ExecCallbacks cb) {
  auto live = find_live(id);
  if (!live) return std::unexpected(not_live_error(id));
  uint32_t uid = p.uid.value_or(live->image.uid);
  uint32_t gid = p.uid ? *p.uid : live->image.gid;
  std::map<std::string, std::string> env = {
      {"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
      {"HOME", uid == 0 ? "/root" : "/"},
      {"LANG", "C.UTF-8"},
      {"TERM", "xterm"},
      {"HOSTNAME", id},
  };
  {
    std::lock_guard lk(live->mu);
    if (live->destroying || live->rec.state != "running")
      return fail(Code::kConflict, "sandbox " + id + " is " +
                                       (live->destroying ? "stopping" : live->rec.state));
    for (const auto& [k, v] : live->image.env) env[k] = v;
    for (const auto& [k, v] : live->rec.env) env[k] = v;
    if (p.cwd.empty()) p.cwd = live->image.workdir.empty() ? "/" : live->image.workdir;
    live->running_execs++;
    live->last_active_ms = now_ms();
  }
  for (const auto& [k, v] : p.env) env[k] = v;
  ExecRequest req;
  req.argv = std::move(p.argv);
  for (const auto& [k, v] : env) req.env.push_back(k + "=" + v);
  req.cwd = p.cwd;
  req.uid = uid;
  req.gid = gid;
  req.timeout_ms = p.timeout_ms;
  req.output_limit = p.output_limit;
  req.stdin_data = std::move(p.stdin_data);
  req.stdin_open = p.stdin_open;
  uint64_t oom_before = 0;
  if (auto k = live->inst->oom_kills()) oom_before = *k;
  metrics_.exec_total++;
  ExecHandlers h;
  h.on_started = cb.on_started;
  h.on_output = cb.on_output;
  h.on_done = [this, live, oom_before, done = std::move(cb.on_done),
               on_output = cb.on_output](Result<ExecResult> r) {
    {
      std::lock_guard lk(live->mu);
      live->running_execs--;
      live->last_active_ms = now_ms();
    }
    if (!r) {
      // A program that cannot be executed is a result, as in a shell: 127 when it
      // does not exist, 126 when it is not executable; the reason goes to stderr.
      const Error& e = r.error();
      if (e.context.find("execve") != std::string::npos &&
          (e.code == Code::kNotFound || e.code == Code::kPermissionDenied)) {
        if (on_output) on_output(2, e.message() + "\n");
        ExecOutcome o;
        o.result.exit_code = e.code == Code::kNotFound ? 127 : 126;
        done(o);
        return;
      }
      done(std::unexpected(r.error()));
      return;
    }
    ExecOutcome o;
    o.result = *r;
    metrics_.exec_seconds.observe(static_cast<double>(r->wall_us) / 1e6);
    if (r->signal == 9) {
      if (auto k = live->inst->oom_kills()) o.oom_killed = *k > oom_before;
    }
    done(o);
  };
  return live->agent->exec(req, std::move(h));
}

void SandboxManager::signal_exec(const std::string& id, uint32_t exec_id, int signo) {
  if (auto live = find_live(id)) live->agent->signal(exec_id, signo);
}

Result<ProcessInfo> SandboxManager::start_process(const std::string& id, ExecParams p) {
  auto live = find_live(id);
  if (!live) return std::unexpected(not_live_error(id));
  auto bg = std::make_shared<BgProc>();
  bg->info.argv = p.argv;
  bg->info.started_ms = now_ms();
  ExecCallbacks cb;
  cb.on_output = [bg](int stream, std::string_view data) {
    std::lock_guard lk(bg->mu);
    (stream == 2 ? bg->info.err : bg->info.out).append(data);
  };
  cb.on_done = [bg](Result<ExecOutcome> r) {
    std::vector<std::function<void()>> waiters;
    {
      std::lock_guard lk(bg->mu);
      bg->info.exited = true;
      if (r) bg->info.outcome = *r;
      else bg->info.error = r.error();
      waiters.swap(bg->waiters);
    }
    for (auto& w : waiters) w();
  };
  auto eid = exec(id, std::move(p), std::move(cb));
  if (!eid) return std::unexpected(eid.error());
  ProcessInfo snapshot;
  {
    std::lock_guard lk(bg->mu);
    bg->info.pid = *eid;
    snapshot = bg->info;
  }
  snapshot.out.clear();
  snapshot.err.clear();
  std::lock_guard lk(live->mu);
  if (live->procs.size() >= kMaxProcs) {
    for (auto it = live->procs.begin(); it != live->procs.end(); ++it) {
      std::lock_guard lk2(it->second->mu);
      if (it->second->info.exited) {
        live->procs.erase(it);
        break;
      }
    }
  }
  live->procs[*eid] = bg;
  return snapshot;
}

Result<std::shared_ptr<SandboxManager::BgProc>> SandboxManager::find_proc(const std::string& id,
                                                                          uint32_t pid) {
  auto live = find_live(id);
  if (!live) return std::unexpected(not_live_error(id));
  std::lock_guard lk(live->mu);
  live->last_active_ms = now_ms();
  auto it = live->procs.find(pid);
  if (it == live->procs.end())
    return fail(Code::kNotFound, "process " + std::to_string(pid) + " not found in sandbox " + id);
  return it->second;
}

Result<std::vector<ProcessInfo>> SandboxManager::list_processes(const std::string& id) {
  auto live = find_live(id);
  if (!live) return std::unexpected(not_live_error(id));
  std::vector<std::shared_ptr<BgProc>> procs;
  {
    std::lock_guard lk(live->mu);
    for (auto& [pid, bg] : live->procs) procs.push_back(bg);
  }
  std::vector<ProcessInfo> out;
  for (auto& bg : procs) {
    std::lock_guard lk(bg->mu);
    ProcessInfo i = bg->info;
    i.out.clear();
    i.err.clear();
    out.push_back(std::move(i));
  }
  return out;
}

Result<ProcessInfo> SandboxManager::get_process(const std::string& id, uint32_t pid) {
  auto bg = find_proc(id, pid);
  if (!bg) return std::unexpected(bg.error());
  std::lock_guard lk((*bg)->mu);
  ProcessInfo i = (*bg)->info;
  i.out.clear();
  i.err.clear();
  return i;
}

void SandboxManager::wait_process(const std::string& id, uint32_t pid, int64_t timeout_ms,
                                  std::function<void(Result<ProcessInfo>)> cb) {
  auto found = find_proc(id, pid);
  if (!found) {
    asio::post(io_, [cb, e = found.error()] { cb(std::unexpected(e)); });
    return;
  }
  auto bg = *found;
  auto once = std::make_shared<std::once_flag>();
  auto timer = std::make_shared<asio::steady_timer>(io_);
  auto answer = [bg, cb, once, timer] {
    std::call_once(*once, [&] {
      timer->cancel();
      ProcessInfo i;
      {
        std::lock_guard lk(bg->mu);
        i = bg->info;
      }
      cb(i);
    });
  };
  {
    std::lock_guard lk(bg->mu);
    if (!bg->info.exited) {
      bg->waiters.push_back([this, answer] { asio::post(io_, answer); });
      if (timeout_ms >= 0) {
        timer->expires_after(std::chrono::milliseconds(timeout_ms));
        timer->async_wait([answer](boost::system::error_code ec) {
          if (!ec) answer();
        });
      }
      return;
    }
  }
  asio::post(io_, answer);
}

Result<void> SandboxManager::process_stdin(const std::string& id, uint32_t pid, std::string data,
                                           bool eof) {
  auto bg = find_proc(id, pid);
  if (!bg) return std::unexpected(bg.error());
  {
    std::lock_guard lk((*bg)->mu);
    if ((*bg)->info.exited) return fail(Code::kConflict, "process " + std::to_string(pid) + " has exited");
  }
  auto live = find_live(id);
  if (!live) return std::unexpected(not_live_error(id));
  live->agent->send_stdin(pid, std::move(data), eof);
  return {};
}

Result<void> SandboxManager::signal_process(const std::string& id, uint32_t pid, int signo) {
  auto bg = find_proc(id, pid);
  if (!bg) return std::unexpected(bg.error());
  {
    std::lock_guard lk((*bg)->mu);
    if ((*bg)->info.exited) return fail(Code::kConflict, "process " + std::to_string(pid) + " has exited");
  }
  signal_exec(id, pid, signo);
  return {};
}

Result<SandboxRef> SandboxManager::ref(const std::string& id) {
  auto live = find_live(id);
  if (!live) return std::unexpected(not_live_error(id));
  std::lock_guard lk(live->mu);
  if (live->destroying || live->rec.state != "running")
    return fail(Code::kConflict, "sandbox " + id + " is " +
                                     (live->destroying ? "stopping" : live->rec.state));
  live->last_active_ms = now_ms();
  return SandboxRef{live->agent, live->disk_bytes};
}

void SandboxManager::after(std::chrono::milliseconds delay, std::function<void()> fn) {
  auto t = std::make_shared<asio::steady_timer>(io_, delay);
  t->async_wait([t, fn = std::move(fn)](boost::system::error_code ec) {
    if (!ec) fn();
  });
}

std::map<std::string, uint64_t> SandboxManager::count_by_state() {
  std::map<std::string, uint64_t> out;
  std::lock_guard lk(mu_);
  for (auto& [id, live] : live_) {
    std::lock_guard lk2(live->mu);
    out[live->rec.state]++;
  }
  return out;
}

}  // namespace tp::node
