#include "node/sandbox_manager.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/json.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include "common/ids.h"
#include "common/log.h"
#include "common/parallel.h"

namespace tp::node {

namespace asio = boost::asio;
namespace json = boost::json;
using control::SandboxRecord;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {
// Removes the manager's own files of a sandbox (background process output),
// and the directory once empty: the step log keeps its files there after the
// sandbox ends, for its retention time.
void remove_process_files(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().filename().string().starts_with("proc-")) std::filesystem::remove(e.path(), ec);
  ::rmdir(dir.c_str());  // fails, and the directory stays, while it holds anything else
}
int64_t mono_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
// Background processes kept per sandbox; the oldest exited ones are forgotten first.
constexpr size_t kMaxProcs = 1024;

// ExecRequest::meta of a command: what a restarted daemon needs to take it over.
//   {"kind":"exec"}  a request's command (its client is gone after a restart: killed)
//   {"kind":"process","handle":N,"argv":[..],"started_ms":T,"limit":L}  a background process
// Either may carry "step": ExecParams::step_tag, the keyed call it answers.
std::string exec_meta(const std::string& step_tag) {
  json::object o;
  o["kind"] = "exec";
  if (!step_tag.empty()) o["step"] = step_tag;
  return json::serialize(o);
}
std::string process_meta(const ProcessInfo& i, uint64_t limit, const std::string& step_tag) {
  json::object o;
  o["kind"] = "process";
  if (!step_tag.empty()) o["step"] = step_tag;
  o["handle"] = i.pid;
  json::array a;
  for (const auto& s : i.argv) a.emplace_back(json::string(s));
  o["argv"] = std::move(a);
  o["started_ms"] = i.started_ms;
  o["limit"] = limit;
  return json::serialize(o);
}

std::string read_file_or_empty(const std::string& path) {
  if (path.empty()) return {};
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int open_append(const std::string& path) {
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
}

// Appends up to the stream's limit; short writes of a full disk drop the rest.
void append_capped(int fd, uint64_t limit, uint64_t* written, std::string_view data) {
  if (fd < 0 || *written >= limit) return;
  size_t n = std::min<uint64_t>(data.size(), limit - *written);
  while (n > 0) {
    ssize_t w = ::write(fd, data.data(), n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    *written += static_cast<uint64_t>(w);
    data.remove_prefix(static_cast<size_t>(w));
    n -= static_cast<size_t>(w);
  }
}

void proc_output(const std::shared_ptr<BgProc>& bg, int stream, std::string_view data) {
  std::lock_guard lk(bg->mu);
  if (stream == 2)
    append_capped(bg->err_fd, bg->limit, &bg->err_bytes, data);
  else
    append_capped(bg->out_fd, bg->limit, &bg->out_bytes, data);
}

void proc_done(const std::shared_ptr<BgProc>& bg, Result<ExecOutcome> r, const std::string& id,
               const ProcessExitHook& on_exit) {
  std::vector<std::function<void()>> waiters;
  ProcessInfo snap;
  {
    std::lock_guard lk(bg->mu);
    bg->info.exited = true;
    if (r)
      bg->info.outcome = *r;
    else
      bg->info.error = r.error();
    bg->close_files();
    waiters.swap(bg->waiters);
    snap = bg->info;
  }
  for (auto& w : waiters) w();
  if (on_exit) on_exit(id, snap);
}

bool is_pooled(Sandbox& sb) {
  std::lock_guard lk(sb.mu);
  return sb.rec.pooled;
}

// A warm-pool sandbox that can still be handed out. Locked by the caller (sb.mu).
bool claimable_locked(const Sandbox& sb) {
  return sb.rec.pooled && sb.state == State::kRunning && sb.stop_reason == EndReason::kNone;
}

Error ended_while_creating(const std::string& id, EndReason why) {
  if (why == EndReason::kDeleted)
    return Error{Code::kConflict, 0, "sandbox " + id + " was deleted while creating"};
  return Error{
      Code::kConflict, 0,
      "sandbox " + id + " was stopped while creating (" + std::string(to_string(why)) + ")"};
}

runtime::SandboxSpec spec_of(const SandboxRecord& r, const ResolvedImage& img) {
  runtime::SandboxSpec spec;
  spec.id = r.id;
  spec.image = r.image;
  spec.layers = r.layers.empty() ? img.layers : r.layers;
  spec.memory_bytes = r.memory_mb << 20;
  spec.cpus = r.cpus;
  spec.pids_max = static_cast<uint32_t>(r.pids);
  spec.disk_bytes = r.disk_mb << 20;
  spec.uid_base = r.uid_base;
  spec.best_effort = r.priority == "best-effort";
  for (const auto& [k, v] : img.env) spec.env.emplace(k, v);
  for (const auto& [k, v] : r.env) spec.env[k] = v;
  return spec;
}
}  // namespace

SandboxManager::SandboxManager(asio::io_context& io, runtime::Registry& registry,
                               control::SandboxStore& store, Metrics& metrics, ManagerOptions opts)
    : io_(io),
      registry_(registry),
      store_(store),
      metrics_(metrics),
      opts_(std::move(opts)),
      blocking_(opts_.blocking_threads),
      timer_(io) {
  if (!opts_.host_ids_in_use) opts_.host_ids_in_use = host_uids_in_use;
  if (!opts_.agent_from_fd)
    opts_.agent_from_fd = [](asio::io_context& io, int fd, std::string id) {
      return AgentClient::create(io, fd, std::move(id));
    };
}

SandboxManager::~SandboxManager() {
  {
    std::lock_guard lk(gate_->mu);
    gate_->open = false;
  }
  blocking_.join();
}

std::string SandboxManager::sandbox_dir(const std::string& id) const {
  return opts_.data_dir.empty() ? std::string() : opts_.data_dir + "/sandboxes/" + id;
}

// ---- restart ---------------------------------------------------------------

Result<void> SandboxManager::recover() {
  control::SandboxQuery q;
  q.live_only = true;
  q.include_pooled = true;  // a warm pool's sandboxes go back to it (WarmPools::start())
  auto recs = store_.list(q);
  if (!recs) return std::unexpected(recs.error());
  // Agent sessions need the io_context: run it on helper threads meanwhile.
  auto guard = asio::make_work_guard(io_);
  std::vector<std::thread> runners;
  for (int i = 0; i < 2; ++i) runners.emplace_back([this] { io_.run(); });
  std::vector<std::string> keep;
  std::optional<Error> unrecorded;
  // Their uid ranges are held before anything could hand one out again.
  if (opts_.uid_ranges)
    for (const auto& r : *recs)
      if (r.uid_base)
        if (auto h = opts_.uid_ranges->hold(r.uid_base, r.id); !h)
          TP_SB_ERROR(r.id, "uid range: {}", h.error().message());
  // What a previous run left that is no live record's (the function tier's workers,
  // say) is removed while the records are adopted: killing it and waiting for its end
  // is then not part of the wait before serving. Those records' own leftovers are left
  // to the pass below, once it is known which of them were kept.
  std::vector<std::string> recorded;
  for (const auto& r : *recs) recorded.push_back(r.id);
  auto remove_orphans = [this](const std::vector<std::string>& keep) {
    for (auto* b : registry_.all())
      for (const auto& id : b->cleanup_orphans(keep))
        TP_SB_WARN(id, "removed leftovers of a previous run");
  };
  std::thread unrecorded_orphans;
  try {
    unrecorded_orphans = std::thread(remove_orphans, std::cref(recorded));
  } catch (const std::system_error&) {
    remove_orphans(recorded);  // no thread: before the adoptions, then
  }
  // Several at a time: adopting one is mostly waiting for its agent's answer, so a
  // restart with hundreds of sandboxes alive is served again in a fraction of the
  // time one after the other takes.
  {
    std::mutex mu;
    const size_t used = parallel_for(recs->size(), kAdoptersAtOnce, [&](size_t i) {
      Result<bool> kept = false;
      try {
        kept = adopt_one((*recs)[i]);
      } catch (const std::exception& e) {  // e.g. bad_alloc: never past a joinable thread
        kept = fail(Code::kInternal, std::string("adopting: ") + e.what());
      }
      std::lock_guard lk(mu);
      if (!kept) {
        if (!unrecorded) unrecorded = kept.error();
      } else if (*kept) {
        keep.push_back((*recs)[i].id);
      }
    });
    if (used < std::min<size_t>(kAdoptersAtOnce, recs->size()))
      spdlog::warn("recover: adopted with {} threads (no more could start)", used);
  }
  if (unrecorded_orphans.joinable()) unrecorded_orphans.join();
  guard.reset();
  io_.stop();
  for (auto& t : runners) t.join();
  io_.restart();
  remove_orphans(keep);
  if (opts_.uid_ranges) {
    // The ranges of sandboxes not kept are free now that their leftovers are gone...
    for (const auto& r : *recs)
      if (r.uid_base && std::find(keep.begin(), keep.end(), r.id) == keep.end())
        opts_.uid_ranges->release(r.uid_base, r.id);
    // ...unless something still runs as one of their ids (leftovers not gone yet,
    // e.g. an init just killed that host PID 1 has not reaped, or another daemon's
    // sandboxes on the same ids): those stay held until a later scan finds them
    // unused (recheck_ranges()).
    for (const auto& h : opts_.uid_ranges->hold_in_use(opts_.host_ids_in_use))
      spdlog::warn(
          "uid range {} is not handed out while host id {} is in use (left by an earlier run, "
          "or another daemon uses the same --uid-base); checked again every {} ms",
          h.base, h.id, opts_.uid_recheck.count());
  }
  // Output files of the sandboxes that were live and are no more. Only theirs: a sandbox
  // that ended under a daemon had its files removed before its end was stored, and a
  // scan of every directory would cost a restart time in proportion to the node's
  // history (the trajectory log keeps one per ended sandbox).
  for (const auto& r : *recs)
    if (std::find(keep.begin(), keep.end(), r.id) == keep.end())
      if (std::string dir = sandbox_dir(r.id); !dir.empty()) remove_process_files(dir);
  // A record that cannot be marked stopped (e.g. a full disk) would stay "running"
  // for a sandbox that is gone: refuse to serve, so that the next start records it.
  if (unrecorded) return std::unexpected(*unrecorded);
  // Forget ended sandboxes after a day.
  (void)store_.prune_ended(now_ms() - 24ll * 3600 * 1000);
  return {};
}

Result<bool> SandboxManager::adopt_one(SandboxRecord r) {
  auto sb = std::make_shared<Sandbox>(r, State::kAdopting);
  EndReason why = EndReason::kDaemonRestart;
  std::string detail;
  runtime::Backend* b = registry_.find(r.tier);
  Result<std::unique_ptr<runtime::SandboxInstance>> inst =
      fail(Code::kNotFound, "tier " + r.tier + " is not available");
  if (b) {
    auto img = adopted_image(r);
    if (img) {
      sb->image = std::move(*img);
      inst = b->adopt(spec_of(r, sb->image));
    } else {
      inst = std::unexpected(img.error());
    }
  }
  // Its stop was accepted and answered (destroy_nowait) before the daemon went: it
  // is finished, not adopted.
  std::optional<EndReason> accepted_end;
  if (r.ended_at_ms == 0 && !r.end_reason.empty())
    accepted_end = end_reason_from_string(r.end_reason);
  if (accepted_end) {
    why = *accepted_end;
    detail = "its stop was accepted before the daemon went";
    if (inst) (void)(*inst)->destroy();
  } else if (inst) {
    std::string addr = (*inst)->agent_address();
    Result<std::shared_ptr<AgentClient>> agent =
        fail(Code::kUnavailable, "no way to reach its agent");
    if (!addr.empty() && opts_.agent_connect) agent = opts_.agent_connect(io_, addr, r.id);
    Result<void> ready = agent ? Result<void>{} : Result<void>{std::unexpected(agent.error())};
    if (agent) {
      auto p = std::make_shared<std::promise<Result<void>>>();
      auto once = std::make_shared<std::once_flag>();
      auto f = p->get_future();
      (*agent)->start(
          [p, once](Result<void> ok) { std::call_once(*once, [&] { p->set_value(ok); }); });
      if (f.wait_for(opts_.agent_ready_timeout) != std::future_status::ready)
        ready = fail(Code::kDeadlineExceeded, "agent did not answer in time");
      else
        ready = f.get();
    }
    if (ready) {
      sb->backend = b;
      sb->inst = std::move(*inst);
      sb->agent = *agent;
      SandboxRecord snap;
      {
        std::lock_guard lk(sb->mu);
        sb->apply(Event::kAdopted);
        sb->last_active_ms = now_ms();
        snap = sb->rec;
      }
      // Paused when the daemon went: the adoption thawed it to reach its agent, and
      // it is frozen again below, once its commands are sorted out.
      const bool repause = r.state == name(State::kPaused);
      if (snap.state != r.state && !repause) {  // e.g. left "creating" by a crash: it runs now
        auto v = store_.update(snap);
        if (v) {
          std::lock_guard lk(sb->mu);
          sb->rec.version = *v;
        }
      }
      {
        std::lock_guard lk(mu_);
        add_live_locked(sb);
      }
      watch_agent(sb);
      // Its commands: background processes come back, requests' commands are killed.
      for (const auto& c : sb->agent->resumed()) {
        boost::system::error_code ec;
        json::value m = json::parse(c.meta, ec);
        const json::object* o = (!ec && m.is_object()) ? &m.as_object() : nullptr;
        const json::value* kind = o ? o->if_contains("kind") : nullptr;
        const json::value* handle = o ? o->if_contains("handle") : nullptr;
        const json::value* step = o ? o->if_contains("step") : nullptr;
        auto step_lost = [&](uint32_t pid) {
          if (step && step->is_string() && opts_.on_step_lost)
            opts_.on_step_lost(r.id, std::string(step->as_string()), pid);
        };
        if (kind && kind->is_string() && kind->as_string() == "process" && handle &&
            handle->is_int64()) {
          auto bg = std::make_shared<BgProc>();
          bg->info.pid = static_cast<uint32_t>(handle->as_int64());
          bg->info.os_pid = c.pid;
          if (auto* a = o->if_contains("argv"); a && a->is_array())
            for (const auto& s : a->as_array())
              if (s.is_string()) bg->info.argv.emplace_back(s.as_string());
          if (auto* t = o->if_contains("started_ms"); t && t->is_int64())
            bg->info.started_ms = t->as_int64();
          bg->limit = 16ull << 20;
          if (auto* l = o->if_contains("limit"); l && (l->is_uint64() || l->is_int64()))
            bg->limit = l->to_number<uint64_t>();
          bg->exec_id = c.id;
          attach_proc(sb, bg);
          step_lost(bg->info.pid);
        } else {
          ExecHandlers h;
          h.on_done = [](Result<ExecResult>) {};
          (void)sb->agent->attach(c.id, std::move(h));
          sb->agent->signal(c.id, 9);
          step_lost(0);
        }
      }
      if (repause) repause_adopted(sb);
      TP_SB_INFO(r.id, "adopted from a previous run");
      return true;
    }
    why = EndReason::kAgentLost;
    detail = ready.error().message();
    if (agent) (*agent)->close();
    (void)(*inst)->destroy();
  } else {
    detail = inst.error().message();
  }
  sb->image.pin.reset();
  TP_SB_WARN(r.id, "left behind by a previous run (state {}), not adoptable ({}): {}", r.state,
             to_string(why), detail);
  SandboxRecord snap;
  {
    std::lock_guard lk(sb->mu);
    sb->apply(Event::kAdoptFailed);
    sb->rec.ended_at_ms = now_ms();
    sb->rec.end_reason = std::string(to_string(why));
    snap = sb->rec;
  }
  if (auto v = store_.update(snap); !v)
    return std::unexpected(Error{v.error().code, v.error().sys_errno,
                                 "cannot record " + r.id + " as stopped: " + v.error().message()});
  return false;
}

// An adopted sandbox that was paused is paused again (a client's pause, or its job's
// lapsed lease, outlives a restart). If it cannot be frozen it runs, and is stored so.
void SandboxManager::repause_adopted(const std::shared_ptr<Sandbox>& sb) {
  std::lock_guard fz(sb->freeze_mu);
  auto f = sb->inst->freeze();
  SandboxRecord snap;
  {
    std::lock_guard lk(sb->mu);
    if (f) sb->apply(Event::kPause);
    snap = sb->rec;
  }
  if (!f) TP_SB_WARN(sb->id(), "was paused, and cannot be paused again: {}", f.error().message());
  // Stored "paused" before the restart: only a failed freeze changes the record.
  if (f) return;
  if (auto v = store_.update(snap); v) {
    std::lock_guard lk(sb->mu);
    sb->rec.version = *v;
  }
}

Result<ResolvedImage> SandboxManager::adopted_image(const SandboxRecord& r) {
  if (r.image == "host") return ResolvedImage{};
  if (!resolver_) return fail(Code::kNotFound, "no image resolver");
  auto by_ref = resolver_(r.image);
  // Records of older daemons carry no layers: the reference is all there is.
  if (r.layers.empty() || (by_ref && by_ref->layers == r.layers)) return by_ref;
  // The reference names other layers now (a new version, a replaced part) or
  // nothing: the sandbox still runs on the layers it was created with, so
  // those are the ones to pin against gc.
  std::string stack = "layers:";
  for (size_t i = 0; i < r.layers.size(); ++i) stack += (i ? "," : "") + r.layers[i];
  auto exact = resolver_(stack);
  if (!exact) return std::unexpected(exact.error());
  if (by_ref) {
    TP_SB_WARN(r.id,
               "image {} changed since the sandbox was created: keeping its layers, taking "
               "the image's current defaults",
               r.image);
    exact->env = by_ref->env;
    exact->workdir = by_ref->workdir;
    exact->uid = by_ref->uid;
    exact->gid = by_ref->gid;
  } else {
    TP_SB_WARN(r.id,
               "image {} is gone ({}): keeping the sandbox's layers, without the image's "
               "defaults",
               r.image, by_ref.error().message());
  }
  return exact;
}

void SandboxManager::attach_proc(const std::shared_ptr<Sandbox>& sb, std::shared_ptr<BgProc> bg) {
  std::string dir = sandbox_dir(sb->id());
  if (!dir.empty()) {
    std::string base = dir + "/proc-" + std::to_string(bg->info.pid);
    bg->out_path = base + ".out";
    bg->err_path = base + ".err";
    bg->out_fd = open_append(bg->out_path);
    bg->err_fd = open_append(bg->err_path);
    struct stat st {};
    if (bg->out_fd >= 0 && ::fstat(bg->out_fd, &st) == 0)
      bg->out_bytes = static_cast<uint64_t>(st.st_size);
    if (bg->err_fd >= 0 && ::fstat(bg->err_fd, &st) == 0)
      bg->err_bytes = static_cast<uint64_t>(st.st_size);
  }
  {
    std::lock_guard lk(sb->mu);
    sb->procs[bg->info.pid] = bg;
    sb->next_proc = std::max(sb->next_proc, bg->info.pid + 1);
    sb->running_execs++;
  }
  ExecHandlers h;
  h.on_output = [bg](int stream, std::string_view data) { proc_output(bg, stream, data); };
  h.on_done = [sb, bg, hook = opts_.on_process_exit](Result<ExecResult> r) {
    {
      std::lock_guard lk(sb->mu);
      sb->running_execs--;
      sb->last_active_ms = now_ms();
    }
    if (!r) return proc_done(bg, std::unexpected(r.error()), sb->id(), hook);
    ExecOutcome o;
    o.result = *r;
    proc_done(bg, o, sb->id(), hook);
  };
  if (auto a = sb->agent->attach(bg->exec_id, std::move(h)); !a) {
    {
      std::lock_guard lk(sb->mu);
      sb->running_execs--;
    }
    proc_done(bg, std::unexpected(a.error()), sb->id(), opts_.on_process_exit);
  }
}

// ---- timer -------------------------------------------------------------------

void SandboxManager::start() {
  timer_.expires_after(opts_.tick);
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

void SandboxManager::tick() { on_tick(); }

void SandboxManager::on_tick() {
  int64_t now = now_ms();
  // Ranges held because a host process ran in them: a scan, off the io threads.
  // (last_recheck_ belongs to whoever set rechecking_.)
  if (opts_.uid_ranges && opts_.uid_ranges->held_in_use() > 0 && !rechecking_.exchange(true)) {
    const auto t = std::chrono::steady_clock::now();
    std::lock_guard lk(gate_->mu);
    // The first re-check is never too early: the steady clock starts at boot, so a
    // "never" of time_point{} would count as uid_recheck ago only once the host has
    // been up that long.
    if (gate_->open && (!last_recheck_ || t - *last_recheck_ >= opts_.uid_recheck)) {
      last_recheck_ = t;
      asio::post(blocking_, [this] {
        recheck_ranges();
        rechecking_ = false;
      });
    } else {
      rechecking_ = false;
    }
  }
  std::vector<std::pair<std::shared_ptr<Sandbox>, EndReason>> expired;
  std::vector<std::shared_ptr<Sandbox>> unrecorded;
  {
    std::lock_guard lk(mu_);
    for (auto& [id, sb] : live_) {
      std::lock_guard lk2(sb->mu);
      if (sb->unrecorded) unrecorded.push_back(sb);
      if (sb->stop_reason != EndReason::kNone || sb->release_requested) continue;
      if (sb->state != State::kRunning && sb->state != State::kPaused) continue;
      if (sb->rec.expires_at_ms && now >= sb->rec.expires_at_ms) {
        expired.emplace_back(sb, EndReason::kTtl);
      } else if (sb->rec.idle_timeout_seconds && sb->running_execs == 0 &&
                 now - sb->last_active_ms >=
                     static_cast<int64_t>(sb->rec.idle_timeout_seconds) * 1000) {
        expired.emplace_back(sb, EndReason::kIdle);
      }
    }
  }
  for (auto& [sb, reason] : expired) {
    TP_SB_INFO(sb->id(), "expired ({})", to_string(reason));
    request_stop(sb, reason, nullptr);
  }
  for (auto& sb : unrecorded) {
    SandboxRecord snap;
    {
      std::lock_guard lk(sb->mu);
      snap = sb->rec;
    }
    auto v = put_record(snap);
    if (!v) continue;  // still failing: retry on the next tick
    {
      std::lock_guard lk(sb->mu);
      sb->rec.version = *v;
      sb->unrecorded = false;
    }
    std::lock_guard lk(mu_);
    erase_live_locked(sb);
  }
}

void SandboxManager::shutdown() {
  std::vector<std::shared_ptr<Sandbox>> all, later;
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    for (auto& [id, sb] : live_) all.push_back(sb);
    for (auto& d : deferred_) later.push_back(d.sb);
  }
  // Teardowns left for later run now (their stops were answered; request_release
  // below waits for them).
  for (auto& sb : later) reclaim(sb);
  // The timer belongs to the io threads; the cancel runs there, and shutdown()
  // waits for it (bounded: an io_context that no longer runs never runs it), so
  // that the manager may be destroyed once shutdown() returns.
  auto cancelled = std::make_shared<std::promise<void>>();
  auto timer_done = cancelled->get_future();
  asio::post(io_, [this, cancelled] {
    timer_.cancel();
    cancelled->set_value();
  });
  std::vector<std::future<void>> done;
  for (auto& sb : all) {
    auto p = std::make_shared<std::promise<void>>();
    done.push_back(p->get_future());
    if (opts_.stop_on_exit)
      request_stop(sb, EndReason::kDaemonShutdown, [p](Result<SandboxRecord>) { p->set_value(); });
    else
      request_release(sb, [p] { p->set_value(); });
  }
  for (auto& f : done) f.wait();
  timer_done.wait_for(std::chrono::seconds(5));
}

// ---- create ------------------------------------------------------------------

void SandboxManager::create(CreateParams p, RecordCb cb) {
  auto reject = [&](Error e) { asio::post(io_, [cb, e] { cb(std::unexpected(e)); }); };
  runtime::Backend* backend = registry_.find(p.tier);
  if (!backend)
    return reject(
        Error{Code::kInvalidArgument, 0, "tier '" + p.tier + "' is not available on this node"});
  if (p.image.empty())
    return reject(Error{Code::kInvalidArgument, 0, "field 'image' must not be empty"});
  if (p.image != "host" && !resolver_)
    return reject(Error{Code::kNotFound, 0, "image '" + p.image + "' not found"});
  SandboxRecord r;
  r.id = opts_.new_id ? opts_.new_id() : ids::new_sandbox_id(opts_.node_name);
  r.tier = p.tier;
  r.image = p.image;
  r.node = opts_.node_name;
  r.memory_mb = p.memory_mb;
  r.cpus = p.cpus;
  r.pids = p.pids;
  r.disk_mb = p.disk_mb;
  r.ttl_seconds = p.ttl_seconds;
  r.idle_timeout_seconds = p.idle_timeout_seconds;
  r.labels = p.labels;
  r.env = p.env;
  r.priority = p.priority;
  r.template_name = p.template_name;
  r.job = p.job;
  r.step = p.step;
  r.pooled = p.pooled;
  r.created_at_ms = now_ms();
  // A pooled sandbox has no TTL (nor idle timeout) until it is handed out.
  r.expires_at_ms = p.pooled ? 0 : r.created_at_ms + static_cast<int64_t>(p.ttl_seconds) * 1000;
  if (p.pooled) r.idle_timeout_seconds = 0;
  auto sb = std::make_shared<Sandbox>(std::move(r), State::kCreating);
  sb->backend = backend;
  sb->disk_bytes = p.disk_mb << 20;
  {
    std::unique_lock lk(mu_);
    std::optional<Error> refused;
    if (stopping_) {
      refused = Error{Code::kUnavailable, 0, "daemon is shutting down"};
    } else if (!p.job.empty()) {
      // Quotas: checked and the sandbox counted in one step, so that concurrent
      // creates of one job cannot both pass.
      if (!admission_)
        refused = Error{Code::kNotFound, 0, "job '" + p.job + "' not found"};
      else if (auto a = admission_(p, job_use_locked(p.job)); !a)
        refused = a.error();
    }
    if (refused) {
      lk.unlock();
      if (opts_.drop_id) opts_.drop_id(sb->id(), true);
      return reject(*refused);
    }
    add_live_locked(sb);  // visible as "creating"
  }
  int64_t start_us = mono_us();
  sb->enqueue([this, sb, cb, start_us](Sandbox::Done done) {
    asio::post(blocking_, [this, sb, cb, done, start_us] { create_op(sb, cb, done, start_us); });
  });
}

void SandboxManager::create_op(std::shared_ptr<Sandbox> sb, RecordCb cb, Sandbox::Done done,
                               int64_t start_us) {
  auto answer = [this, cb](Result<SandboxRecord> r) { asio::post(io_, [cb, r] { cb(r); }); };
  // The image first: its layer digests are part of the record (a restarted
  // daemon pins exactly those). A failure is stored with the record below.
  ResolvedImage img;
  std::optional<Error> unresolved;
  {
    std::string image;
    {
      std::lock_guard lk(sb->mu);
      image = sb->rec.image;
    }
    if (image != "host") {
      auto r = resolver_(image);
      if (r)
        img = std::move(*r);
      else
        unresolved = r.error();
    }
  }
  // Its record is stored once it runs (agent_ready), or once it ended (store_final):
  // until then it lives in memory only. A daemon that crashes meanwhile leaves no
  // record of it; its leftovers go with the restarted daemon's orphan cleanup, and its
  // uid range stays held while any process of it runs (recover()).
  std::optional<Error> no_range;
  if (opts_.uid_ranges) {
    auto base = opts_.uid_ranges->allocate(sb->id());
    if (!base && base.error().code == Code::kUnavailable && opts_.uid_ranges->held_in_use() > 0) {
      // Some ranges are held only because a host process ran in them: they may
      // be free by now (the tick checks them only every uid_recheck).
      recheck_ranges();
      base = opts_.uid_ranges->allocate(sb->id());
    }
    if (base) {
      std::lock_guard lk(sb->mu);
      sb->rec.uid_base = *base;
    } else {
      no_range = base.error();
    }
  }
  SandboxRecord snap;
  {
    std::lock_guard lk(sb->mu);
    sb->rec.layers = img.layers;
    snap = sb->rec;
  }
  if (no_range) {
    // Nothing was created or stored: it never existed.
    TP_SB_ERROR(sb->id(), "create: {}", no_range->message());
    metrics_.creation_failures++;
    std::vector<RecordCb> waiters;
    {
      std::lock_guard lk(sb->mu);
      sb->apply(Event::kCreateFailed);
      sb->rec.ended_at_ms = now_ms();
      sb->rec.end_reason = std::string(to_string(EndReason::kFailed));
      waiters.swap(sb->stop_waiters);
      sb->settled = true;
    }
    {
      std::lock_guard lk(mu_);
      erase_live_locked(sb);
    }
    if (opts_.drop_id) opts_.drop_id(sb->id(), false);  // listed as creating meanwhile
    Error e = *no_range;
    for (auto& w : waiters) asio::post(io_, [w, e] { w(std::unexpected(e)); });
    answer(std::unexpected(e));
    return done();
  }
  auto stop_requested = [&] {
    std::lock_guard lk(sb->mu);
    return sb->stop_reason;
  };
  if (EndReason why = stop_requested(); why != EndReason::kNone) {
    answer(std::unexpected(ended_while_creating(sb->id(), why)));
    return done();  // the stop op follows
  }
  Result<std::unique_ptr<runtime::SandboxInstance>> inst = fail(Code::kInternal, "not created");
  if (unresolved) inst = std::unexpected(*unresolved);
  if (!unresolved) {
    runtime::SandboxSpec spec = spec_of(snap, img);
    spec.disk_bytes = sb->disk_bytes;
    inst = sb->backend->create(spec);
  }
  {
    std::lock_guard lk(sb->mu);
    sb->image = std::move(img);
  }
  if (!inst) {
    TP_SB_ERROR(sb->id(), "create failed: {}", inst.error().message());
    release_range(sb);  // a failed create leaves nothing of the sandbox
    metrics_.creation_failures++;
    {
      std::lock_guard lk(sb->mu);
      sb->apply(Event::kCreateFailed);
      sb->rec.ended_at_ms = now_ms();
      sb->rec.end_reason = std::string(to_string(EndReason::kFailed));
      sb->image.pin.reset();
    }
    store_final(sb, std::nullopt);
    answer(std::unexpected(inst.error()));
    return done();
  }
  sb->inst = std::move(*inst);
  if (EndReason why = stop_requested(); why != EndReason::kNone) {
    answer(std::unexpected(ended_while_creating(sb->id(), why)));
    return done();  // the stop op destroys the instance
  }
  sb->agent = opts_.agent_from_fd(io_, sb->inst->agent_fd(), sb->id());
  sb->inst->close_agent_fd();  // the client holds its own duplicate
  auto timer = std::make_shared<asio::steady_timer>(io_, opts_.agent_ready_timeout);
  auto once = std::make_shared<std::once_flag>();
  auto finish = [this, sb, cb, done, start_us, timer, once, gate = gate_](Result<void> ready) {
    std::call_once(*once, [&] {
      timer->cancel();
      std::lock_guard lk(gate->mu);
      if (!gate->open) return;  // the manager is going away
      asio::post(blocking_, [this, sb, cb, done, start_us, ready] {
        agent_ready(sb, cb, done, start_us, ready);
      });
    });
  };
  timer->async_wait([finish](boost::system::error_code ec) {
    if (!ec) finish(fail(Code::kDeadlineExceeded, "agent did not report ready in time"));
  });
  watch_agent(sb);
  sb->agent->start(finish);
}

void SandboxManager::agent_ready(std::shared_ptr<Sandbox> sb, RecordCb cb, Sandbox::Done done,
                                 int64_t start_us, Result<void> ready) {
  auto answer = [this, cb](Result<SandboxRecord> r) { asio::post(io_, [cb, r] { cb(r); }); };
  std::optional<Error> failed;
  SandboxRecord snap;
  {
    std::lock_guard lk(sb->mu);
    if (sb->stop_reason != EndReason::kNone) {
      answer(std::unexpected(ended_while_creating(sb->id(), sb->stop_reason)));
      return done();  // the stop op follows
    }
    if (!ready || sb->agent_lost) {
      std::string why = ready ? "its agent's connection closed" : ready.error().message();
      failed = Error{Code::kInternal, 0, "sandbox failed to start: " + why};
      TP_SB_ERROR(sb->id(), "agent not ready: {}", why);
    } else {
      sb->apply(Event::kCreated);
      sb->last_active_ms = now_ms();
      snap = sb->rec;
    }
  }
  if (!failed) {
    auto v = put_record(snap);
    if (v) {
      {
        std::lock_guard lk(sb->mu);
        sb->rec.version = *v;
      }
      metrics_.creations++;
      metrics_.create_seconds.observe(static_cast<double>(mono_us() - start_us) / 1e6);
      TP_SB_INFO(snap.id, "running (pid {})", sb->inst->pid());
      if (opts_.on_created) opts_.on_created(snap);
      answer(snap);
      return done();
    }
    failed =
        Error{v.error().code, v.error().sys_errno, "cannot record sandbox: " + v.error().message()};
    TP_SB_ERROR(sb->id(), "{}", failed->message());
  }
  metrics_.creation_failures++;
  Error e = *failed;
  request_stop(sb, EndReason::kFailed, [cb, e](Result<SandboxRecord>) { cb(std::unexpected(e)); });
  done();
}

// ---- stop / release ------------------------------------------------------------

void SandboxManager::watch_agent(const std::shared_ptr<Sandbox>& sb) {
  std::weak_ptr<Sandbox> weak = sb;
  sb->agent->set_on_closed([this, weak](const Error& e) {
    auto s = weak.lock();
    if (!s) return;
    {
      std::lock_guard lk(s->mu);
      if (s->stop_reason != EndReason::kNone || s->release_requested) return;
      // Between the agent's ready and agent_ready(): that fails the create.
      if (s->state == State::kCreating) {
        s->agent_lost = true;
        return;
      }
      // A paused sandbox's agent can die too (cgroup v2 delivers SIGKILL to frozen tasks).
      if (s->state != State::kRunning && s->state != State::kPaused) return;
    }
    TP_SB_WARN(s->id(), "agent connection lost ({}): sandbox failed", e.message());
    request_stop(s, EndReason::kFailed, nullptr);
  });
}

void SandboxManager::request_stop(std::shared_ptr<Sandbox> sb, EndReason reason, RecordCb cb,
                                  bool nowait) {
  {
    std::unique_lock lk(sb->mu);
    if (sb->state == State::kReleased ||
        (sb->release_requested && sb->stop_reason == EndReason::kNone)) {
      // Handed over to the next daemon run: stopping it now would record it
      // stopped while it keeps running.
      if (cb) asio::post(io_, [cb] { cb(fail(Code::kUnavailable, "daemon is shutting down")); });
      return;
    }
    if (is_final(sb->state)) {
      if (!sb->settled) {
        if (cb) sb->stop_waiters.push_back(std::move(cb));  // answered once stored
      } else if (cb) {
        asio::post(io_, [cb, r = sb->rec] { cb(r); });
      }
      return;
    }
    const bool waits = static_cast<bool>(cb);
    if (cb && nowait && sb->stop_reason == EndReason::kNone &&
        (sb->state == State::kRunning || sb->state == State::kPaused))
      sb->accept_waiters.push_back(std::move(cb));  // its stop op (queued below) answers
    else if (cb)
      sb->stop_waiters.push_back(std::move(cb));
    if (sb->stop_reason != EndReason::kNone) {  // its stop op is queued already
      // Someone waits for its end: a teardown left for later runs now (reclaim()
      // finds it among the deferred ones, or does nothing).
      if (waits) {
        lk.unlock();
        reclaim(sb);
      }
      return;
    }
    sb->stop_reason = reason;
    // From now on exec and file calls are refused; a creating sandbox leaves
    // creating on the strand, after its create op.
    if (sb->state != State::kCreating) sb->apply(Event::kStop);
  }
  sb->enqueue([this, sb](Sandbox::Done done) {
    asio::post(blocking_, [this, sb, done] {
      stop_now(sb);
      done();
    });
  });
}

void SandboxManager::stop_now(const std::shared_ptr<Sandbox>& sb) {
  EndReason reason;
  std::vector<RecordCb> accepted;
  SandboxRecord intent;
  bool answered_ahead = false;
  {
    std::lock_guard lk(sb->mu);
    if (is_final(sb->state)) {
      // Ended on its own meanwhile (a failed create, settled on the strand
      // before this op): answer what it ended as.
      std::vector<RecordCb> waiters;
      waiters.swap(sb->stop_waiters);
      for (auto& w : sb->accept_waiters) waiters.push_back(std::move(w));
      sb->accept_waiters.clear();
      for (auto& w : waiters) asio::post(io_, [w, r = sb->rec] { w(r); });
      return;
    }
    if (sb->state == State::kCreating) sb->apply(Event::kStop);
    reason = sb->stop_reason;
    accepted.swap(sb->accept_waiters);
    if (!accepted.empty()) intent = sb->rec;
  }
  if (!accepted.empty()) {
    // destroy_nowait: the intent is stored (still running, with its end reason) before
    // they hear of it, so that a daemon that dies during the teardown finishes it
    // after its restart (adopt_one) instead of adopting the sandbox again.
    intent.end_reason = std::string(to_string(reason));
    auto v = store_.update(intent);
    std::lock_guard lk(sb->mu);
    if (v) {
      sb->rec.version = *v;
      intent.version = *v;
      intent.state = "stopping";
      for (auto& w : accepted) asio::post(io_, [w, intent] { w(intent); });
      answered_ahead = true;
    } else {
      TP_SB_WARN(sb->id(), "cannot store its stop ahead: {}; answered when stopped",
                 v.error().message());
      for (auto& w : accepted) sb->stop_waiters.push_back(std::move(w));
    }
  }
  if (answered_ahead && defer_teardown(sb)) return;
  teardown(sb);
}

// ---- teardown pacing (see the header) ------------------------------------------

void SandboxManager::set_clients_busy(std::function<double()> busy_for_s) {
  std::lock_guard lk(mu_);
  clients_busy_ = std::move(busy_for_s);
}

bool SandboxManager::defer_teardown(const std::shared_ptr<Sandbox>& sb) {
  std::function<double()> busy;
  {
    std::lock_guard lk(mu_);
    if (stopping_ || !clients_busy_ || deferred_.size() >= opts_.max_deferred_teardowns)
      return false;
    busy = clients_busy_;
  }
  // A job's quotas count its sandboxes until they are gone: a deferred one would
  // refuse the job's next create. Someone waiting for its end (a delete that waits,
  // here before this op) has it at once.
  auto at_once = [&] {
    std::lock_guard lk(sb->mu);
    return !sb->rec.job.empty() || !sb->stop_waiters.empty();
  };
  if (at_once() || busy() <= 0 || !sb->inst) return false;
  {
    // Serialised with a request's resume (resume_now): that one, once it holds the lock,
    // sees the stop and leaves the sandbox frozen.
    std::lock_guard fz(sb->freeze_mu);
    if (auto f = sb->inst->freeze_for_destroy(); !f) {
      TP_SB_DEBUG(sb->id(), "torn down at once: {}", f.error().message());
      return false;
    }
  }
  if (sb->agent) sb->agent->close();
  std::lock_guard lk(mu_);
  // shutdown() began meanwhile: it waits for this stop, which goes on now. So does
  // a waiter that came meanwhile: it pushed itself under sb->mu and then looks in
  // deferred_ under mu_ (request_stop), so it sees either this check or the entry.
  if (stopping_ || at_once()) return false;
  deferred_.push_back({sb, std::chrono::steady_clock::now()});
  metrics_.teardowns_deferred++;
  if (!reclaim_armed_ && !reclaiming_) {
    auto b = std::chrono::duration<double>(std::max(0.0, busy()));
    arm_reclaim_locked(
        std::min(opts_.max_teardown_delay, std::chrono::ceil<std::chrono::milliseconds>(b)));
  }
  return true;
}

void SandboxManager::arm_reclaim_locked(std::chrono::milliseconds delay) {
  reclaim_armed_ = true;
  auto t = std::make_shared<asio::steady_timer>(io_, std::max(delay, std::chrono::milliseconds(1)));
  t->async_wait([this, t, gate = gate_](boost::system::error_code ec) {
    if (ec) return;
    std::lock_guard g(gate->mu);
    if (!gate->open) return;  // the manager is going away
    {
      std::lock_guard lk(mu_);
      reclaim_armed_ = false;
    }
    reclaim_tick();
  });
}

void SandboxManager::reclaim_tick() {
  std::shared_ptr<Sandbox> due;
  {
    std::lock_guard lk(mu_);
    if (reclaiming_ || deferred_.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    const double busy_for = clients_busy_ ? clients_busy_() : 0;
    const auto waited = now - deferred_.front().since;
    if (busy_for <= 0 || waited >= opts_.max_teardown_delay) {
      due = deferred_.front().sb;
      deferred_.pop_front();
      reclaiming_ = true;
    } else if (!reclaim_armed_) {
      auto b =
          std::chrono::ceil<std::chrono::milliseconds>(std::chrono::duration<double>(busy_for));
      auto left = std::chrono::ceil<std::chrono::milliseconds>(opts_.max_teardown_delay - waited);
      arm_reclaim_locked(std::min(b, left));
    }
  }
  if (!due) return;
  // One at a time: the next once this one is done.
  teardown_op(due, [this] {
    {
      std::lock_guard lk(mu_);
      reclaiming_ = false;
    }
    reclaim_tick();
  });
}

void SandboxManager::teardown_op(std::shared_ptr<Sandbox> sb, std::function<void()> then) {
  sb->enqueue([this, sb, then](Sandbox::Done done) {
    asio::post(blocking_, [this, sb, then, done] {
      teardown(sb);
      if (then) then();  // before done(): while an op of this manager is in flight
      done();
    });
  });
}

void SandboxManager::reclaim(const std::shared_ptr<Sandbox>& sb) {
  {
    std::lock_guard lk(mu_);
    auto it = std::find_if(deferred_.begin(), deferred_.end(),
                           [&](const Deferred& d) { return d.sb == sb; });
    if (it == deferred_.end()) return;  // its teardown runs already
    deferred_.erase(it);
  }
  teardown_op(sb, nullptr);
}

void SandboxManager::teardown(const std::shared_ptr<Sandbox>& sb) {
  EndReason reason;
  std::vector<std::shared_ptr<BgProc>> procs;
  {
    std::lock_guard lk(sb->mu);
    reason = sb->stop_reason;
    for (auto& [h, bg] : sb->procs) procs.push_back(bg);
  }
  if (sb->agent) sb->agent->close();
  Result<void> d = sb->inst ? sb->inst->destroy() : Result<void>{};
  if (d)
    release_range(sb);  // nothing of it is left: its ids may serve another sandbox
  else
    TP_SB_ERROR(sb->id(), "destroy: {}; its uid range stays held", d.error().message());
  for (auto& bg : procs) {
    std::lock_guard lk(bg->mu);
    bg->close_files();
  }
  if (std::string dir = sandbox_dir(sb->id()); !dir.empty()) remove_process_files(dir);
  {
    std::lock_guard lk(sb->mu);
    sb->image.pin.reset();
    sb->apply(Event::kStopped);
    sb->rec.ended_at_ms = now_ms();
    sb->rec.end_reason = std::string(to_string(reason));
  }
  metrics_.destructions++;
  TP_SB_INFO(sb->id(), "stopped ({})", to_string(reason));
  store_final(sb, d ? std::nullopt : std::optional<Error>(d.error()));
}

void SandboxManager::store_final(const std::shared_ptr<Sandbox>& sb, std::optional<Error> err) {
  SandboxRecord snap;
  {
    std::lock_guard lk(sb->mu);
    snap = sb->rec;
  }
  auto v = put_record(snap);
  if (!v) {
    TP_SB_ERROR(snap.id, "store: {}; kept in memory until it can be stored", v.error().message());
    std::lock_guard lk(sb->mu);
    sb->unrecorded = true;
  } else {
    {
      std::lock_guard lk(sb->mu);
      sb->rec.version = *v;
      snap.version = *v;
    }
    std::lock_guard lk(mu_);
    erase_live_locked(sb);
  }
  if (opts_.on_ended) opts_.on_ended(snap);
  std::vector<RecordCb> waiters;
  {
    std::lock_guard lk(sb->mu);
    waiters.swap(sb->stop_waiters);
    sb->settled = true;
  }
  for (auto& w : waiters)
    asio::post(io_, [w, snap, err] {
      if (err)
        w(std::unexpected(*err));
      else
        w(snap);
    });
}

Result<uint64_t> SandboxManager::put_record(const SandboxRecord& snap) {
  return snap.version == 0 ? store_.insert(snap) : store_.update(snap);
}

void SandboxManager::release_range(const std::shared_ptr<Sandbox>& sb) {
  if (!opts_.uid_ranges) return;
  uint32_t base;
  {
    std::lock_guard lk(sb->mu);
    base = sb->rec.uid_base;
  }
  if (base) opts_.uid_ranges->release(base, sb->id());
}

void SandboxManager::recheck_ranges() {
  for (uint32_t base : opts_.uid_ranges->recheck_in_use(opts_.host_ids_in_use))
    spdlog::info("uid range {} serves again: no host process uses its ids any more", base);
}

void SandboxManager::request_release(std::shared_ptr<Sandbox> sb, std::function<void()> done_cb) {
  auto via_stop = [done_cb](Result<SandboxRecord>) { done_cb(); };
  bool release;
  {
    std::lock_guard lk(sb->mu);
    if (is_final(sb->state) && sb->settled) {
      asio::post(io_, done_cb);
      return;
    }
    if (is_final(sb->state) || sb->stop_reason != EndReason::kNone) {
      sb->stop_waiters.push_back(via_stop);
      return;
    }
    if (sb->release_requested) {  // asked twice
      asio::post(io_, done_cb);
      return;
    }
    release = sb->state != State::kCreating;
    if (release) sb->release_requested = true;
  }
  if (!release) {  // half created: nothing to hand over
    request_stop(sb, EndReason::kDaemonShutdown, via_stop);
    return;
  }
  sb->enqueue([this, sb, done_cb, via_stop](Sandbox::Done done) {
    asio::post(blocking_, [this, sb, done_cb, via_stop, done] {
      bool can;
      {
        std::lock_guard lk(sb->mu);
        if (is_final(sb->state)) {  // settled: ops before this one ended it
          asio::post(io_, done_cb);
          return done();
        }
        if (sb->stop_reason != EndReason::kNone) {  // a stop came first; its op follows
          sb->stop_waiters.push_back(via_stop);
          return done();
        }
        can = sb->inst && !sb->inst->agent_address().empty();
        if (!can) {
          sb->stop_reason = EndReason::kDaemonShutdown;
          sb->stop_waiters.push_back(via_stop);
          sb->apply(Event::kStop);
        }
      }
      if (!can) {
        stop_now(sb);
        return done();
      }
      sb->agent->close();
      sb->inst->release();
      {
        std::lock_guard lk(sb->mu);
        for (auto& [h, bg] : sb->procs) {
          std::lock_guard lk2(bg->mu);
          bg->close_files();
        }
        sb->apply(Event::kRelease);
        sb->settled = true;
      }
      {
        std::lock_guard lk(mu_);
        erase_live_locked(sb);
      }
      TP_SB_INFO(sb->id(), "released: it keeps running for the next daemon");
      asio::post(io_, done_cb);
      done();
    });
  });
}

// ---- queries -------------------------------------------------------------------

void SandboxManager::add_live_locked(const std::shared_ptr<Sandbox>& sb) {
  live_[sb->id()] = sb;
  std::string job;
  {
    std::lock_guard lk(sb->mu);
    job = sb->rec.job;
  }
  if (!job.empty()) by_job_[job].insert(sb);
}

void SandboxManager::erase_live_locked(const std::shared_ptr<Sandbox>& sb) {
  auto it = live_.find(sb->id());
  if (it == live_.end() || it->second != sb) return;
  live_.erase(it);
  std::string job;
  {
    std::lock_guard lk(sb->mu);
    job = sb->rec.job;
  }
  if (auto j = by_job_.find(job); j != by_job_.end()) {
    j->second.erase(sb);
    if (j->second.empty()) by_job_.erase(j);
  }
}

JobUse SandboxManager::job_use_locked(const std::string& job) {
  JobUse u;
  auto j = by_job_.find(job);
  if (j == by_job_.end()) return u;
  for (const auto& sb : j->second) {
    std::lock_guard lk(sb->mu);
    u.sandboxes++;
    u.memory_mb += sb->rec.memory_mb;
    u.cpus += sb->rec.cpus;
    if (sb->rec.state == "paused") u.paused++;
  }
  return u;
}

JobUse SandboxManager::job_use(const std::string& job) {
  std::lock_guard lk(mu_);
  return job_use_locked(job);
}

std::shared_ptr<Sandbox> SandboxManager::find_live(const std::string& id) {
  std::lock_guard lk(mu_);
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : it->second;
}

std::shared_ptr<Sandbox> SandboxManager::find_for_request(const std::string& id) {
  auto sb = find_live(id);
  if (!sb) return nullptr;
  bool paused;
  {
    std::lock_guard lk(sb->mu);
    if (sb->rec.pooled) return nullptr;
    paused = sb->state == State::kPaused;
  }
  if (paused && resume_now(sb)) TP_SB_INFO(id, "resumed by a request");
  return sb;
}

bool SandboxManager::resume_now(const std::shared_ptr<Sandbox>& sb) {
  std::lock_guard fz(sb->freeze_mu);
  {
    std::lock_guard lk(sb->mu);
    if (sb->state != State::kPaused || sb->stop_reason != EndReason::kNone) return false;
  }
  auto r = sb->inst->thaw();
  if (!r) {
    TP_SB_ERROR(sb->id(), "resume: {}", r.error().message());
    return false;
  }
  {
    std::lock_guard lk(sb->mu);
    sb->apply(Event::kResume);
    sb->last_active_ms = now_ms();
  }
  metrics_.resumes++;
  store_on_strand(sb);
  return true;
}

void SandboxManager::store_on_strand(const std::shared_ptr<Sandbox>& sb) {
  sb->enqueue([this, sb](Sandbox::Done done) {
    asio::post(blocking_, [this, sb, done] {
      SandboxRecord snap;
      {
        std::lock_guard lk(sb->mu);
        if (is_final(sb->state) || sb->state == State::kStopping) return done();
        snap = sb->rec;
      }
      auto v = store_.update(snap);
      if (v) {
        std::lock_guard lk(sb->mu);
        sb->rec.version = *v;
      } else {
        TP_SB_WARN(sb->id(), "store: {}", v.error().message());
      }
      done();
    });
  });
}

void SandboxManager::pause(const std::string& id, RecordCb cb) {
  auto sb = find_live(id);
  if (sb && is_pooled(*sb)) sb = nullptr;
  if (!sb) {
    auto e = not_live_error(id);
    asio::post(io_, [cb, e] { cb(std::unexpected(e)); });
    return;
  }
  sb->enqueue([this, sb, cb](Sandbox::Done done) {
    asio::post(blocking_, [this, sb, cb, done] {
      auto r = pause_now(sb);
      asio::post(io_, [cb, r] { cb(r); });
      done();  // after freeze_mu is released: the next op may resume it
    });
  });
}

Result<SandboxRecord> SandboxManager::pause_now(const std::shared_ptr<Sandbox>& sb) {
  std::lock_guard fz(sb->freeze_mu);
  {
    std::lock_guard lk(sb->mu);
    if (sb->state == State::kPaused) return sb->rec;
    if (sb->state != State::kRunning || sb->stop_reason != EndReason::kNone ||
        sb->release_requested)
      return fail(Code::kConflict, "sandbox " + sb->id() + " is " + std::string(name(sb->state)));
  }
  int64_t t0 = mono_us();
  auto r = sb->inst->freeze();
  if (!r) {
    TP_SB_ERROR(sb->id(), "pause: {}", r.error().message());
    return std::unexpected(r.error());
  }
  SandboxRecord snap;
  {
    std::lock_guard lk(sb->mu);
    // A stop came in while it froze: the stop wins (its teardown thaws what it must),
    // and the pause is refused rather than answered with a state it does not have.
    if (!sb->apply(Event::kPause))
      return fail(Code::kConflict, "sandbox " + sb->id() + " is " + std::string(name(sb->state)));
    snap = sb->rec;
  }
  metrics_.pauses++;
  metrics_.pause_seconds.observe(static_cast<double>(mono_us() - t0) / 1e6);
  auto v = store_.update(snap);
  if (v) {
    std::lock_guard lk(sb->mu);
    sb->rec.version = *v;
    snap.version = *v;
  }
  TP_SB_INFO(sb->id(), "paused");
  return snap;
}

void SandboxManager::resume(const std::string& id, RecordCb cb) {
  auto sb = find_for_request(id);  // resumes it
  if (!sb) {
    auto e = not_live_error(id);
    asio::post(io_, [cb, e] { cb(std::unexpected(e)); });
    return;
  }
  // Answered after the strand's ops before it (a pause in flight, the record).
  // Posted, like every op: the Done that starts it may run under a lock.
  sb->enqueue([this, sb, cb](Sandbox::Done done) {
    asio::post(io_, [this, sb, cb, done] {
      if (resume_now(sb)) TP_SB_INFO(sb->id(), "resumed");
      SandboxRecord snap;
      {
        std::lock_guard lk(sb->mu);
        snap = sb->rec;
      }
      cb(snap);
      done();
    });
  });
}

void SandboxManager::claim(const std::string& id, CreateParams p, RecordCb cb) {
  auto reject = [&](Error e) { asio::post(io_, [cb, e] { cb(std::unexpected(e)); }); };
  auto sb = find_live(id);
  if (!sb) return reject(Error{Code::kNotFound, 0, "pooled sandbox " + id + " is gone"});
  {
    std::lock_guard lk(mu_);
    if (!p.job.empty()) {
      if (!admission_) return reject(Error{Code::kNotFound, 0, "job '" + p.job + "' not found"});
      if (auto a = admission_(p, job_use_locked(p.job)); !a) return reject(a.error());
    }
    std::lock_guard lk2(sb->mu);
    if (!claimable_locked(*sb))
      return reject(Error{Code::kNotFound, 0, "pooled sandbox " + id + " is not available"});
    // The client's from now on: nobody else can claim it, its job counts it.
    sb->rec.pooled = false;
    sb->rec.job = p.job;
    sb->rec.step = p.step;
    if (!p.job.empty()) by_job_[p.job].insert(sb);
    sb->rec.labels = p.labels;
    sb->rec.env = p.env;
    sb->rec.ttl_seconds = p.ttl_seconds;
    sb->rec.idle_timeout_seconds = p.idle_timeout_seconds;
    sb->rec.created_at_ms = now_ms();
    sb->rec.expires_at_ms = sb->rec.created_at_ms + static_cast<int64_t>(p.ttl_seconds) * 1000;
    sb->last_active_ms = sb->rec.created_at_ms;
  }
  // Stored before it is answered, on its strand: a restarted daemon must never
  // see a handed-out sandbox as pooled (it would hand it out again).
  sb->enqueue([this, sb, cb](Sandbox::Done done) {
    asio::post(blocking_, [this, sb, cb, done] {
      SandboxRecord snap;
      {
        std::lock_guard lk(sb->mu);
        snap = sb->rec;
      }
      auto v = store_.update_with_labels(snap);
      if (!v) {
        TP_SB_ERROR(sb->id(), "cannot record the hand-out: {}", v.error().message());
        Error e{v.error().code, v.error().sys_errno,
                "cannot record sandbox: " + v.error().message()};
        request_stop(sb, EndReason::kFailed, [this, cb, e](Result<SandboxRecord>) {
          asio::post(io_, [cb, e] { cb(std::unexpected(e)); });
        });
        return done();
      }
      {
        std::lock_guard lk(sb->mu);
        sb->rec.version = *v;
        snap.version = *v;
      }
      TP_SB_INFO(sb->id(), "handed out from the pool of {}", snap.template_name);
      asio::post(io_, [cb, snap] { cb(snap); });
      done();
    });
  });
}

std::vector<SandboxRecord> SandboxManager::pooled() {
  std::vector<SandboxRecord> out;
  std::lock_guard lk(mu_);
  for (auto& [id, sb] : live_) {
    std::lock_guard lk2(sb->mu);
    if (claimable_locked(*sb)) out.push_back(sb->rec);
  }
  return out;
}

bool SandboxManager::claimable(const std::string& id) {
  auto sb = find_live(id);
  if (!sb) return false;
  std::lock_guard lk(sb->mu);
  return claimable_locked(*sb);
}

void SandboxManager::set_admission(Admission a) {
  std::lock_guard lk(mu_);
  admission_ = std::move(a);
}

size_t SandboxManager::live_count() {
  std::lock_guard lk(mu_);
  return live_.size();
}

Error SandboxManager::not_live_error(const std::string& id) {
  auto rec = store_.get(id);
  if (rec && *rec && !(*rec)->pooled)
    return Error{Code::kConflict, 0, "sandbox " + id + " is " + (*rec)->state};
  return Error{Code::kNotFound, 0, "sandbox " + id + " not found"};
}

// The state a live sandbox is shown in, in answers and refusals: "stopping" once its
// stop is under way (the stored record stays running with its end reason), else
// `otherwise`. Under sb.mu.
static std::string_view shown_state(const Sandbox& sb, std::string_view otherwise) {
  return sb.stop_reason != EndReason::kNone && !is_final(sb.state) ? "stopping" : otherwise;
}

// What the API shows of a live sandbox (see Service::get). Under sb.mu.
static SandboxRecord shown(const Sandbox& sb) {
  SandboxRecord r = sb.rec;
  r.state = std::string(shown_state(sb, sb.rec.state));
  return r;
}

Result<SandboxRecord> SandboxManager::get(const std::string& id) {
  if (auto sb = find_live(id)) {
    std::lock_guard lk(sb->mu);
    if (sb->rec.pooled) return fail(Code::kNotFound, "sandbox " + id + " not found");
    return shown(*sb);
  }
  auto rec = store_.get(id);
  if (!rec) return std::unexpected(rec.error());
  if (!*rec || (*rec)->pooled) return fail(Code::kNotFound, "sandbox " + id + " not found");
  return **rec;
}

Result<std::vector<SandboxRecord>> SandboxManager::list(const ListFilter& f) {
  const auto& labels = f.labels;
  const auto& state = f.state;
  bool ended_too = f.all || state == "stopped" || state == "lost";
  control::SandboxQuery q;
  q.state = state;
  q.labels = labels;
  q.live_only = !ended_too;
  q.job = f.job;
  q.step = f.step;
  auto matches = [&](const SandboxRecord& r) {
    bool match = (state.empty() || r.state == state) && (ended_too || r.ended_at_ms == 0) &&
                 !r.pooled && (f.job.empty() || r.job == f.job) &&
                 (f.step.empty() || r.step == f.step);
    for (const auto& [k, v] : labels) {
      auto l = r.labels.find(k);
      match = match && l != r.labels.end() && l->second == v;
    }
    return match;
  };
  // Snapshot the live ones first: a sandbox that ends between the two reads is
  // then reported by its stored final record, not by a stale live one. Only the
  // matching ones are copied; of the others only the id is kept, to drop a stored
  // record that no longer matches (its state changed since it was written). With
  // a job, only that job's sandboxes are looked at: a sandbox's job never changes
  // once set, so no other live one can have a stored record of that job.
  std::vector<SandboxRecord> live;
  std::vector<std::string> unmatched;
  {
    std::lock_guard lk(mu_);
    auto look = [&](const std::shared_ptr<Sandbox>& sb) {
      std::lock_guard lk2(sb->mu);
      SandboxRecord r = shown(*sb);
      if (matches(r))
        live.push_back(std::move(r));
      else
        unmatched.push_back(sb->rec.id);
    };
    if (f.job.empty()) {
      for (const auto& [id, sb] : live_) look(sb);
    } else if (auto j = by_job_.find(f.job); j != by_job_.end()) {
      for (const auto& sb : j->second) look(sb);
    }
  }
  auto recs = store_.list(q);
  if (!recs) return std::unexpected(recs.error());
  std::map<std::string, SandboxRecord> merged;
  for (auto& r : *recs) merged[r.id] = std::move(r);
  for (const auto& id : unmatched) {
    auto it = merged.find(id);
    if (it != merged.end() && it->second.ended_at_ms == 0) merged.erase(it);
  }
  for (auto& r : live) {
    auto it = merged.find(r.id);
    if (it != merged.end() && it->second.ended_at_ms != 0) continue;  // ended since the snapshot
    merged[r.id] = std::move(r);
  }
  std::vector<SandboxRecord> out;
  for (auto& [id, r] : merged) out.push_back(std::move(r));
  std::sort(out.begin(), out.end(), [](const SandboxRecord& a, const SandboxRecord& b) {
    return a.created_at_ms != b.created_at_ms ? a.created_at_ms < b.created_at_ms : a.id < b.id;
  });
  return out;
}

void SandboxManager::destroy(const std::string& id, EndReason reason, RecordCb cb) {
  auto sb = find_live(id);
  if (sb && reason == EndReason::kDeleted && is_pooled(*sb)) sb = nullptr;  // a pool's own
  if (!sb) {
    auto rec = store_.get(id);
    if (rec && *rec && !(*rec)->pooled) {
      // Already ended: deleting again is not an error; answer the record.
      SandboxRecord r = **rec;
      asio::post(io_, [cb, r] { cb(r); });
    } else {
      asio::post(io_, [cb, id] { cb(fail(Code::kNotFound, "sandbox " + id + " not found")); });
    }
    return;
  }
  request_stop(sb, reason, std::move(cb));
}

void SandboxManager::destroy_nowait(const std::string& id, EndReason reason, RecordCb cb) {
  auto sb = find_live(id);
  if (sb && reason == EndReason::kDeleted && is_pooled(*sb)) sb = nullptr;
  if (!sb) return destroy(id, reason, std::move(cb));  // ended or unknown: as destroy()
  request_stop(sb, reason, std::move(cb), /*nowait=*/true);
}

// ---- exec ------------------------------------------------------------------------

Result<uint32_t> SandboxManager::exec(const std::string& id, ExecParams p, ExecCallbacks cb) {
  auto sb = find_for_request(id);
  if (!sb) return std::unexpected(not_live_error(id));
  std::string meta = exec_meta(p.step_tag);
  return start_exec(sb, std::move(p), std::move(cb), std::move(meta));
}

Result<uint32_t> SandboxManager::start_exec(const std::shared_ptr<Sandbox>& sb, ExecParams p,
                                            ExecCallbacks cb, std::string meta) {
  const std::string& id = sb->id();
  std::map<std::string, std::string> env;
  uint32_t uid, gid;
  {
    std::lock_guard lk(sb->mu);
    if (sb->state != State::kRunning || sb->stop_reason != EndReason::kNone ||
        sb->release_requested)
      return fail(Code::kConflict,
                  "sandbox " + id + " is " + std::string(shown_state(*sb, name(sb->state))));
    uid = p.uid.value_or(sb->image.uid);
    gid = p.uid ? *p.uid : sb->image.gid;
    env = {
        {"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
        {"HOME", uid == 0 ? "/root" : "/"},
        {"LANG", "C.UTF-8"},
        {"TERM", "xterm"},
        {"HOSTNAME", id},
    };
    for (const auto& [k, v] : sb->image.env) env[k] = v;
    for (const auto& [k, v] : sb->rec.env) env[k] = v;
    if (p.cwd.empty()) p.cwd = sb->image.workdir.empty() ? "/" : sb->image.workdir;
    sb->running_execs++;
    sb->last_active_ms = now_ms();
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
  req.window = p.window;
  req.meta = std::move(meta);
  // The sandbox's OOM-kill count before the command, read once the exec is on
  // its way (a cgroup file read, off the exec's critical path: the command
  // cannot be OOM-killed before it even started).
  struct OomBefore {
    std::mutex mu;
    bool read = false;
    uint64_t kills = 0;
  };
  auto oom = std::make_shared<OomBefore>();
  metrics_.exec_total++;
  ExecHandlers h;
  h.on_started = cb.on_started;
  h.on_output = cb.on_output;
  h.on_done = [this, sb, oom, done = std::move(cb.on_done),
               on_output = cb.on_output](Result<ExecResult> r) {
    {
      std::lock_guard lk(sb->mu);
      sb->running_execs--;
      sb->last_active_ms = now_ms();
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
      std::lock_guard lk(oom->mu);
      if (auto k = sb->inst->oom_kills(); k && oom->read) o.oom_killed = *k > oom->kills;
    }
    done(o);
  };
  uint32_t eid = sb->agent->exec(req, std::move(h));
  // Queued behind the exec's write to the agent (the client runs its strand on io_):
  // read inline, on a request thread that is also io_'s, it delayed that write.
  // A command killed before this ran (its exit is queued behind it on one io
  // thread) is not reported OOM-killed: its count is unknown.
  asio::post(io_, [sb, oom] {
    auto k = sb->inst->oom_kills();
    std::lock_guard lk(oom->mu);
    if (k) oom->kills = *k;
    oom->read = k.has_value();
  });
  return eid;
}

void SandboxManager::signal_exec(const std::string& id, uint32_t exec_id, int signo) {
  auto sb = find_for_request(id);
  if (!sb) return;
  {
    std::lock_guard lk(sb->mu);
    if (sb->state != State::kRunning && sb->state != State::kStopping) return;
  }
  if (sb->agent) sb->agent->signal(exec_id, signo);
}

void SandboxManager::credit_exec(const std::string& id, uint32_t exec_id, uint64_t bytes) {
  auto sb = find_for_request(id);
  if (!sb) return;
  {
    std::lock_guard lk(sb->mu);
    if (sb->state != State::kRunning && sb->state != State::kStopping) return;
  }
  if (sb->agent) sb->agent->credit(exec_id, bytes);
}

// ---- background processes ----------------------------------------------------------

void SandboxManager::start_process(const std::string& id, ExecParams p,
                                   std::function<void(Result<ProcessInfo>)> cb) {
  auto sb = find_for_request(id);
  if (!sb) return cb(std::unexpected(not_live_error(id)));
  auto bg = std::make_shared<BgProc>();
  {
    std::lock_guard lk(sb->mu);
    if (sb->state != State::kRunning || sb->stop_reason != EndReason::kNone ||
        sb->release_requested)
      return cb(fail(Code::kConflict,
                     "sandbox " + id + " is " + std::string(shown_state(*sb, name(sb->state)))));
    bg->info.pid = sb->next_proc++;
  }
  bg->info.argv = p.argv;
  bg->info.started_ms = now_ms();
  bg->limit = p.output_limit;
  if (std::string dir = sandbox_dir(id); !dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    std::string base = dir + "/proc-" + std::to_string(bg->info.pid);
    bg->out_path = base + ".out";
    bg->err_path = base + ".err";
    bg->out_fd = open_append(bg->out_path);
    bg->err_fd = open_append(bg->err_path);
    if (bg->out_fd < 0 || bg->err_fd < 0)
      TP_SB_WARN(id, "process output files: {}", strerror(errno));
  }
  // Answered once both hold: it is registered below (so that the next request finds
  // it), and the agent said it runs or that it ended without running. The answer is
  // the process as it was at that word ("running" with its os_pid, or "exited"), not
  // whatever it is by the time both hold, so that it is the same on every run (replay).
  struct Answer {
    std::mutex mu;
    int pending = 2;  // the agent's word, the registration
    Result<ProcessInfo> info = ProcessInfo{};
    std::function<void(Result<ProcessInfo>)> cb;
    // One of the two happened (`at_word`: the agent's, with the process as it then was;
    // an error: the start failed, answered at once).
    void step(std::optional<Result<ProcessInfo>> at_word) {
      std::function<void(Result<ProcessInfo>)> fire;
      Result<ProcessInfo> out = ProcessInfo{};
      {
        std::lock_guard lk(mu);
        if (pending <= 0) return;
        if (at_word) info = std::move(*at_word);
        pending = info ? pending - 1 : 0;
        if (pending > 0) return;
        fire = std::move(cb);
        out = info;
      }
      fire(std::move(out));
    }
  };
  auto answer = std::make_shared<Answer>();
  answer->cb = std::move(cb);
  ExecCallbacks handlers;
  handlers.on_started = [bg, answer](uint32_t os_pid) {
    ProcessInfo now;
    {
      std::lock_guard lk(bg->mu);
      bg->info.os_pid = os_pid;
      now = bg->info;
    }
    answer->step(now);
  };
  handlers.on_output = [bg](int stream, std::string_view data) { proc_output(bg, stream, data); };
  handlers.on_done = [bg, id, answer, hook = opts_.on_process_exit](Result<ExecOutcome> r) {
    proc_done(bg, std::move(r), id, hook);
    ProcessInfo now;
    {
      std::lock_guard lk(bg->mu);
      if (bg->info.os_pid != 0) return;  // answered at its start
      now = bg->info;
    }
    answer->step(now);
  };
  std::string meta = process_meta(bg->info, bg->limit, p.step_tag);
  auto eid = start_exec(sb, std::move(p), std::move(handlers), std::move(meta));
  if (!eid) {
    {
      std::lock_guard lk(bg->mu);
      bg->close_files();
      std::error_code ec;
      std::filesystem::remove(bg->out_path, ec);
      std::filesystem::remove(bg->err_path, ec);
    }
    answer->step(std::unexpected(eid.error()));
    return;
  }
  {
    std::lock_guard lk(bg->mu);
    bg->exec_id = *eid;
  }
  {
    std::lock_guard lk(sb->mu);
    if (sb->procs.size() >= kMaxProcs) {
      for (auto it = sb->procs.begin(); it != sb->procs.end(); ++it) {
        std::lock_guard lk2(it->second->mu);
        if (it->second->info.exited) {
          std::error_code ec;
          std::filesystem::remove(it->second->out_path, ec);
          std::filesystem::remove(it->second->err_path, ec);
          sb->procs.erase(it);
          break;
        }
      }
    }
    sb->procs[bg->info.pid] = bg;
  }
  answer->step(std::nullopt);
}

Result<std::shared_ptr<BgProc>> SandboxManager::find_proc(const std::string& id, uint32_t pid) {
  auto sb = find_for_request(id);
  if (!sb) return std::unexpected(not_live_error(id));
  std::lock_guard lk(sb->mu);
  sb->last_active_ms = now_ms();
  auto it = sb->procs.find(pid);
  if (it == sb->procs.end())
    return fail(Code::kNotFound, "process " + std::to_string(pid) + " not found in sandbox " + id);
  return it->second;
}

Result<std::vector<ProcessInfo>> SandboxManager::list_processes(const std::string& id) {
  auto sb = find_for_request(id);
  if (!sb) return std::unexpected(not_live_error(id));
  std::vector<std::shared_ptr<BgProc>> procs;
  {
    std::lock_guard lk(sb->mu);
    for (auto& [pid, bg] : sb->procs) procs.push_back(bg);
  }
  std::vector<ProcessInfo> out;
  for (auto& bg : procs) {
    std::lock_guard lk(bg->mu);
    out.push_back(bg->info);
  }
  return out;
}

Result<ProcessInfo> SandboxManager::get_process(const std::string& id, uint32_t pid) {
  auto bg = find_proc(id, pid);
  if (!bg) return std::unexpected(bg.error());
  std::lock_guard lk((*bg)->mu);
  return (*bg)->info;
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
      std::string out_path, err_path;
      {
        std::lock_guard lk(bg->mu);
        i = bg->info;
        out_path = bg->out_path;
        err_path = bg->err_path;
      }
      i.out = read_file_or_empty(out_path);
      i.err = read_file_or_empty(err_path);
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
  uint32_t eid;
  {
    std::lock_guard lk((*bg)->mu);
    if ((*bg)->info.exited)
      return fail(Code::kConflict, "process " + std::to_string(pid) + " has exited");
    eid = (*bg)->exec_id;
  }
  auto sb = find_for_request(id);
  if (!sb) return std::unexpected(not_live_error(id));
  {
    std::lock_guard lk(sb->mu);
    if (sb->state != State::kRunning)
      return fail(Code::kConflict, "sandbox " + id + " is " + std::string(name(sb->state)));
  }
  sb->agent->send_stdin(eid, std::move(data), eof);
  return {};
}

void SandboxManager::write_exec_stdin(const std::string& id, uint32_t exec_id, std::string data,
                                      bool eof, std::function<void(Result<void>)> cb) {
  auto sb = find_for_request(id);
  Error err{Code::kOk, 0, ""};
  if (!sb) {
    err = not_live_error(id);
  } else {
    std::lock_guard lk(sb->mu);
    if (sb->state != State::kRunning || sb->stop_reason != EndReason::kNone)
      err = Error{Code::kConflict, 0, "sandbox " + id + " is not running"};
  }
  if (err.code != Code::kOk) {
    boost::asio::post(io_, [cb = std::move(cb), err] { cb(std::unexpected(err)); });
    return;
  }
  sb->agent->write_stdin(exec_id, std::move(data), eof, std::move(cb));
}

void SandboxManager::write_process_stdin(const std::string& id, uint32_t pid, std::string data,
                                         bool eof, std::function<void(Result<void>)> cb) {
  auto bg = find_proc(id, pid);
  Error err{Code::kOk, 0, ""};
  uint32_t eid = 0;
  if (!bg) {
    err = bg.error();
  } else {
    std::lock_guard lk((*bg)->mu);
    if ((*bg)->info.exited)
      err = Error{Code::kConflict, 0, "process " + std::to_string(pid) + " has exited"};
    eid = (*bg)->exec_id;
  }
  if (err.code != Code::kOk) {
    boost::asio::post(io_, [cb = std::move(cb), err] { cb(std::unexpected(err)); });
    return;
  }
  write_exec_stdin(id, eid, std::move(data), eof, std::move(cb));
}

Result<void> SandboxManager::signal_process(const std::string& id, uint32_t pid, int signo) {
  auto bg = find_proc(id, pid);
  if (!bg) return std::unexpected(bg.error());
  uint32_t eid;
  {
    std::lock_guard lk((*bg)->mu);
    if ((*bg)->info.exited)
      return fail(Code::kConflict, "process " + std::to_string(pid) + " has exited");
    eid = (*bg)->exec_id;
  }
  signal_exec(id, eid, signo);
  return {};
}

Result<SandboxRef> SandboxManager::ref(const std::string& id) {
  auto sb = find_for_request(id);
  if (!sb) return std::unexpected(not_live_error(id));
  std::lock_guard lk(sb->mu);
  if (sb->state != State::kRunning || sb->stop_reason != EndReason::kNone || sb->release_requested)
    return fail(Code::kConflict,
                "sandbox " + id + " is " + std::string(shown_state(*sb, name(sb->state))));
  sb->last_active_ms = now_ms();
  return SandboxRef{sb->agent, sb->disk_bytes};
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
  for (auto& [id, sb] : live_) {
    std::lock_guard lk2(sb->mu);
    out[sb->rec.state]++;
  }
  return out;
}

}  // namespace tp::node
