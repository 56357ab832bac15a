#include "function/function_service.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <cmath>
#include <mutex>
#include <set>
#include <unordered_map>

#include "common/log.h"
#include "common/metrics.h"
#include "function/zygote_codec.h"

namespace tp::function {

using Clock = std::chrono::steady_clock;
using Deferred = std::vector<std::function<void()>>;

namespace {

uint64_t us_since(Clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t).count());
}

// A path inside the call's scratch directory: relative (or under /tmp/), no "..".
Result<std::string> scratch_path(const std::string& p, const char* what) {
  std::string s = p.starts_with("/tmp/") ? p.substr(5) : p;
  bool ok = !s.empty() && s[0] != '/' && s.find('\0') == std::string::npos && s.size() <= 1024;
  size_t start = 0;
  while (ok && start <= s.size()) {
    size_t end = s.find('/', start);
    std::string part = s.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (part == "..") ok = false;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (!ok)
    return fail(Code::kInvalidArgument, std::string(what) + " '" + p +
                                            "' must be a relative path inside the scratch "
                                            "directory (no '..')");
  return s;
}

std::vector<std::string> substitute(const std::vector<std::string>& argv, const std::string& file) {
  std::vector<std::string> out;
  for (const auto& a : argv) {
    std::string s = a;
    for (size_t at; (at = s.find("{file}")) != std::string::npos;) s.replace(at, 6, file);
    out.push_back(std::move(s));
  }
  return out;
}

std::map<std::string, std::string> base_env(const LanguageDef& lang,
                                            const std::map<std::string, std::string>& extra) {
  std::map<std::string, std::string> env = {
      {"PATH", "/usr/local/bin:/usr/bin:/bin"},
      {"HOME", "/tmp"},
      {"TMPDIR", "/tmp"},
      {"LANG", "C.UTF-8"},
  };
  for (const auto& [k, v] : lang.env) env[k] = v;
  for (const auto& [k, v] : extra) env[k] = v;
  return env;
}

}  // namespace

struct FunctionService::Job {
  // Guarded by the service's mutex.
  std::set<FairQueue::Id> items;
  bool cancelled = false;
};

namespace detail {

using Job = FunctionService::Job;

struct ServiceCore : std::enable_shared_from_this<ServiceCore> {
  struct WorkerSlot {
    std::shared_ptr<Worker> worker;
    size_t in_flight = 0;
  };
  struct Pool {
    explicit Pool(const FairQueue::Options& o) : queue(o) {}
    FairQueue queue;
    std::vector<WorkerSlot> workers;
    size_t starting = 0;
    size_t failures = 0;
    Clock::time_point retry_at{};
    std::string last_error;
  };
  struct Item {
    std::string client;
    std::string image;
    zygote::CallMeta meta;
    std::string payload;
    Worker::Done done;
    std::shared_ptr<Job> job;
    Clock::time_point queued_at;
    Worker* worker = nullptr;  // set while running
    uint32_t call = 0;
    uint64_t waited_us = 0;  // queued until it started
  };

  ServiceCore(std::shared_ptr<const LanguageSet> l, WorkerFactory f, ServiceOptions o)
      : langs(std::move(l)), factory(std::move(f)), opts(std::move(o)), cache(opts.cache_bytes) {
    if (!opts.run_blocking) {
      own_pool = std::make_unique<boost::asio::thread_pool>(2);
      opts.run_blocking = [p = own_pool.get()](std::function<void()> fn) {
        boost::asio::post(*p, std::move(fn));
      };
    }
  }

  std::shared_ptr<const LanguageSet> langs;
  WorkerFactory factory;
  ServiceOptions opts;
  std::unique_ptr<boost::asio::thread_pool> own_pool;
  CompileCache cache;

  mutable std::mutex mu;
  std::map<std::string, std::unique_ptr<Pool>> pools;
  std::unordered_map<FairQueue::Id, Item> items;
  FairQueue::Id next_id = 1;
  bool shut_down = false;

  // Metrics (under mu).
  uint64_t runs_total = 0;
  uint64_t run_errors = 0;
  std::map<std::string, uint64_t> verdicts;
  std::map<std::string, uint64_t> by_language;
  std::array<uint64_t, 64> per_second{};
  std::array<int64_t, 64> second_of{};
  Histogram run_seconds;

  Pool& pool_locked(const std::string& image) {
    auto& p = pools[image];
    if (!p) p = std::make_unique<Pool>(opts.queue);
    return *p;
  }

  // Queues one step; `done` runs exactly once.
  void submit(const std::string& client, const std::string& image, zygote::CallMeta meta,
              std::string payload, std::shared_ptr<Job> job, Worker::Done done) {
    Deferred later;
    {
      std::lock_guard lock(mu);
      if (shut_down || job->cancelled) {
        later.push_back([done = std::move(done), cancelled = job->cancelled] {
          done(fail(Code::kUnavailable,
                    cancelled ? "the run was cancelled" : "the function tier is shutting down"));
        });
      } else {
        Pool& pool = pool_locked(image);
        FairQueue::Id id = next_id++;
        if (auto r = pool.queue.push(client, id); !r) {
          later.push_back([done = std::move(done), e = r.error()] { done(std::unexpected(e)); });
        } else {
          Item it;
          it.client = client;
          it.image = image;
          it.meta = std::move(meta);
          it.payload = std::move(payload);
          it.done = std::move(done);
          it.job = job;
          it.queued_at = Clock::now();
          items.emplace(id, std::move(it));
          job->items.insert(id);
          ensure_workers_locked(image, pool, &later);
          dispatch_locked(pool, &later);
        }
      }
    }
    for (auto& f : later) f();
  }

  void ensure_workers_locked(const std::string& image, Pool& pool, Deferred* later) {
    if (shut_down || Clock::now() < pool.retry_at) return;
    while (pool.workers.size() + pool.starting < opts.workers) {
      ++pool.starting;
      std::weak_ptr<ServiceCore> weak = shared_from_this();
      later->push_back([this, weak, image] {
        opts.run_blocking([weak, image] {
          auto self = weak.lock();
          if (!self) return;
          auto w = self->factory(image);
          self->on_worker_made(image, std::move(w));
        });
      });
    }
  }

  void on_worker_made(const std::string& image, Result<std::shared_ptr<Worker>> r) {
    Deferred later;
    std::shared_ptr<Worker> discard;
    {
      std::lock_guard lock(mu);
      Pool& pool = pool_locked(image);
      --pool.starting;
      if (shut_down) {
        if (r) discard = *r;
      } else if (r) {
        pool.failures = 0;
        pool.last_error.clear();
        pool.workers.push_back(WorkerSlot{*r, 0});
        std::weak_ptr<ServiceCore> weak = shared_from_this();
        Worker* raw = r->get();
        (*r)->set_on_lost([weak, image, raw](const Error& e) {
          if (auto self = weak.lock()) self->on_worker_lost(image, raw, e);
        });
        dispatch_locked(pool, &later);
      } else {
        ++pool.failures;
        pool.last_error = r.error().message();
        auto backoff = opts.retry_backoff * (1 << std::min<size_t>(pool.failures - 1, 5));
        pool.retry_at = Clock::now() + backoff;
        spdlog::warn("function tier: a worker for image {} did not start ({}); next try in {} ms",
                     image, pool.last_error,
                     std::chrono::duration_cast<std::chrono::milliseconds>(backoff).count());
        if (pool.workers.empty() && pool.starting == 0) fail_queued_locked(pool, r.error(), &later);
      }
    }
    if (discard) discard->destroy();
    for (auto& f : later) f();
  }

  void on_worker_lost(const std::string& image, Worker* raw, const Error& e) {
    Deferred later;
    std::shared_ptr<Worker> gone;
    {
      std::lock_guard lock(mu);
      auto pit = pools.find(image);
      if (pit == pools.end()) return;
      Pool& pool = *pit->second;
      auto it = std::find_if(pool.workers.begin(), pool.workers.end(),
                             [raw](const WorkerSlot& s) { return s.worker.get() == raw; });
      if (it == pool.workers.end()) return;
      gone = it->worker;
      pool.workers.erase(it);
      pool.last_error = e.message();
      if (!shut_down) {
        // A lost worker's running calls fail on their own; queued ones wait for the new
        // one, unless none can be started now (a back-off after failed starts).
        ensure_workers_locked(image, pool, &later);
        if (pool.workers.empty() && pool.starting == 0) fail_queued_locked(pool, e, &later);
      }
    }
    if (gone) opts.run_blocking([gone] { gone->destroy(); });
    for (auto& f : later) f();
  }

  void fail_queued_locked(Pool& pool, const Error& e, Deferred* later) {
    std::vector<FairQueue::Id> ids;
    for (auto& [id, it] : items)
      if (it.worker == nullptr && pools[it.image].get() == &pool) ids.push_back(id);
    for (auto id : ids) {
      if (!pool.queue.remove(id)) continue;
      auto node = items.extract(id);
      node.mapped().job->items.erase(id);
      later->push_back([done = std::move(node.mapped().done), e] { done(std::unexpected(e)); });
    }
  }

  void dispatch_locked(Pool& pool, Deferred* later) {
    (void)later;
    for (;;) {
      WorkerSlot* best = nullptr;
      for (auto& s : pool.workers)
        if (s.in_flight < opts.slots && s.worker->alive() &&
            (!best || s.in_flight < best->in_flight))
          best = &s;
      if (!best) return;
      auto id = pool.queue.pop();
      if (!id) return;
      Item& it = items.at(*id);
      it.worker = best->worker.get();
      it.waited_us = us_since(it.queued_at);
      ++best->in_flight;
      std::weak_ptr<ServiceCore> weak = shared_from_this();
      FairQueue::Id iid = *id;
      it.meta.flavor = it.meta.flavor.empty() ? "generic" : it.meta.flavor;
      it.call =
          best->worker->start(it.meta, std::move(it.payload), [weak, iid](Result<StepResult> r) {
            if (auto self = weak.lock()) self->on_step_done(iid, std::move(r));
          });
      it.payload.clear();
    }
  }

  void on_step_done(FairQueue::Id id, Result<StepResult> r) {
    Deferred later;
    Worker::Done done;
    {
      std::lock_guard lock(mu);
      auto node = items.extract(id);
      if (node.empty()) return;
      Item& it = node.mapped();
      it.job->items.erase(id);
      Pool& pool = pool_locked(it.image);
      pool.queue.done(it.client);
      for (auto& s : pool.workers)
        if (s.worker.get() == it.worker && s.in_flight) --s.in_flight;
      dispatch_locked(pool, &later);
      done = std::move(it.done);
      if (r) r->queue_us = it.waited_us;
    }
    done(std::move(r));
    for (auto& f : later) f();
  }

  void cancel(const std::shared_ptr<Job>& job) {
    Deferred later;
    {
      std::lock_guard lock(mu);
      job->cancelled = true;
      std::vector<FairQueue::Id> ids(job->items.begin(), job->items.end());
      for (auto id : ids) {
        auto it = items.find(id);
        if (it == items.end()) continue;
        if (it->second.worker) {
          it->second.worker->cancel(it->second.call);
          continue;
        }
        Pool& pool = pool_locked(it->second.image);
        if (!pool.queue.remove(id)) continue;
        auto node = items.extract(it);
        job->items.erase(id);
        later.push_back([done = std::move(node.mapped().done)] {
          done(fail(Code::kUnavailable, "the run was cancelled"));
        });
      }
    }
    for (auto& f : later) f();
  }

  void record(const std::string& language, const Result<RunResult>& r) {
    std::lock_guard lock(mu);
    ++runs_total;
    ++by_language[language];
    if (r) {
      ++verdicts[std::string(verdict_name(r->verdict))];
      run_seconds.observe(static_cast<double>(r->server_us) / 1e6);
    } else {
      ++run_errors;
    }
    int64_t sec =
        std::chrono::duration_cast<std::chrono::seconds>(Clock::now().time_since_epoch()).count();
    size_t slot = static_cast<size_t>(sec) % per_second.size();
    if (second_of[slot] != sec) {
      second_of[slot] = sec;
      per_second[slot] = 0;
    }
    ++per_second[slot];
  }

  // Runs finished per second over the 10 whole seconds before this one.
  double rate_locked() const {
    int64_t now =
        std::chrono::duration_cast<std::chrono::seconds>(Clock::now().time_since_epoch()).count();
    uint64_t n = 0;
    for (int64_t s = now - 10; s < now; ++s) {
      size_t slot = static_cast<size_t>(s) % per_second.size();
      if (second_of[slot] == s) n += per_second[slot];
    }
    return static_cast<double>(n) / 10.0;
  }

  void shutdown() {
    Deferred later;
    std::vector<std::shared_ptr<Worker>> all;
    {
      std::lock_guard lock(mu);
      if (shut_down) return;
      shut_down = true;
      for (auto& [_, p] : pools) {
        fail_queued_locked(*p, Error{Code::kUnavailable, 0, "the function tier is shutting down"},
                           &later);
        for (auto& s : p->workers) all.push_back(s.worker);
        p->workers.clear();
      }
    }
    for (auto& f : later) f();
    for (auto& w : all) w->destroy();
  }
};

}  // namespace detail

using detail::ServiceCore;

// One run of one request: its steps, in order.
struct RunState {
  std::string client;
  RunRequest req;
  const LanguageDef* lang = nullptr;
  std::shared_ptr<FunctionService::Job> job;
  FunctionService::RunDone done;
  Clock::time_point t0;
  RunResult result;
  std::string cache_key;
  int compile_attempts = 0;
};

namespace {

void finish(ServiceCore& core, const std::shared_ptr<RunState>& st, Result<RunResult> r) {
  if (r) r->server_us = us_since(st->t0);
  core.record(st->lang->name, r);
  st->done(std::move(r));
}

zygote::CallMeta meta_for(const LanguageDef& lang, const Limits& l, uint64_t timeout_ms,
                          bool generic) {
  zygote::CallMeta m;
  m.flavor = (lang.prestarted() && !generic) ? lang.name : "generic";
  m.timeout_ms = timeout_ms;
  m.memory_bytes = l.memory_bytes;
  m.pids = l.pids;
  m.output_bytes = l.output_bytes;
  m.files_bytes = l.files_bytes;
  return m;
}

void submit_run(ServiceCore& core, const std::shared_ptr<RunState>& st,
                const CompileCache::EntryPtr& built);

void on_compiled(ServiceCore& core, const std::shared_ptr<RunState>& st,
                 Result<CompileCache::EntryPtr> r, bool cached);

void start_compile(ServiceCore& core, const std::shared_ptr<RunState>& st) {
  std::weak_ptr<ServiceCore> weak = core.shared_from_this();
  CompileCache::EntryPtr hit;
  auto waiter = [weak, st](Result<CompileCache::EntryPtr> r, bool cached) {
    if (auto c = weak.lock()) on_compiled(*c, st, std::move(r), cached);
  };
  ++st->compile_attempts;
  switch (core.cache.lookup(st->cache_key, waiter, &hit)) {
    case CompileCache::Lookup::kHit:
      on_compiled(core, st, hit, true);
      return;
    case CompileCache::Lookup::kWait:
      return;
    case CompileCache::Lookup::kLead:
      break;
  }
  const LanguageDef& lang = *st->lang;
  zygote::ChildRequest c;
  c.mode = "exec";
  c.argv = substitute(lang.compile, lang.file);
  c.env = base_env(lang, {});
  c.files.push_back(File{lang.file, st->req.source, 0644});
  for (const auto& f : st->req.files) c.files.push_back(f);
  c.fetch = {lang.binary};
  c.fetch_bytes = core.opts.max.files_bytes;
  c.cpu_seconds = st->req.compile_timeout_ms / 1000 + 2;
  Limits l = core.opts.max;  // the compiler gets the largest limits (it is ours to bound)
  l.memory_bytes = std::max(st->req.limits.memory_bytes, core.opts.defaults.memory_bytes);
  l.memory_bytes =
      std::min(std::max<uint64_t>(l.memory_bytes, 1ull << 30), core.opts.max.memory_bytes);
  l.output_bytes = core.opts.defaults.output_bytes;
  auto meta = meta_for(lang, l, st->req.compile_timeout_ms, /*generic=*/true);
  std::string key = st->cache_key;
  core.submit(st->client, lang.image, meta, zygote::encode_payload(c), st->job,
              [weak, key, bin = lang.binary, job = st->job](Result<StepResult> step) {
                auto cp = weak.lock();
                if (!cp) return;
                bool cancelled;
                {
                  std::lock_guard lock(cp->mu);
                  cancelled = job->cancelled;
                }
                Result<CompileCache::EntryPtr> entry = std::unexpected(Error{});
                if (!step) {
                  entry = std::unexpected(step.error());
                } else if (cancelled) {
                  // Killed because its caller went away: no verdict for the others who
                  // wait for the same program (they compile it again themselves).
                  entry = fail(Code::kUnavailable, "the compile was cancelled");
                } else {
                  auto e = std::make_shared<CompileCache::Entry>();
                  e->compile = std::move(*step);
                  for (auto& f : e->compile.files)
                    if (f.path == bin) e->binary = std::move(f.data);
                  e->compile.files.clear();
                  if (e->compile.verdict == Verdict::kOk && e->binary.empty()) {
                    e->compile.verdict = Verdict::kRuntimeError;
                    e->compile.error = "the compiler made no " + bin;
                  }
                  entry = CompileCache::EntryPtr(std::move(e));
                }
                for (auto& w : cp->cache.finish(key, entry)) w(entry, false);
              });
}

void on_compiled(ServiceCore& core, const std::shared_ptr<RunState>& st,
                 Result<CompileCache::EntryPtr> r, bool cached) {
  if (!r) {
    bool cancelled;
    {
      std::lock_guard lock(core.mu);
      cancelled = st->job->cancelled;
    }
    // Another caller's compile that was cancelled: compile it ourselves (once more).
    if (!cancelled && st->compile_attempts < 3 && r.error().code == Code::kUnavailable) {
      start_compile(core, st);
      return;
    }
    finish(core, st, std::unexpected(r.error()));
    return;
  }
  const CompileCache::Entry& e = **r;
  st->result.compile = e.compile;
  st->result.compile_cached = cached;
  if (!cached) st->result.queue_us += e.compile.queue_us;
  if (!e.ok()) {
    st->result.compile->verdict = Verdict::kCompileError;
    st->result.verdict = Verdict::kCompileError;
    finish(core, st, st->result);
    return;
  }
  submit_run(core, st, *r);
}

void submit_run(ServiceCore& core, const std::shared_ptr<RunState>& st,
                const CompileCache::EntryPtr& built) {
  const LanguageDef& lang = *st->lang;
  zygote::ChildRequest c;
  c.mode = lang.mode == RunMode::kPython ? "python" : "exec";
  c.argv = substitute(lang.run, "/tmp/" + lang.file);
  for (const auto& a : st->req.args) c.argv.push_back(a);
  c.env = base_env(lang, st->req.env);
  c.files.push_back(File{lang.file, st->req.source, 0644});
  if (built) c.files.push_back(File{lang.binary, built->binary, 0755});
  for (const auto& f : st->req.files) c.files.push_back(f);
  c.stdin_data = st->req.stdin_data;
  c.fetch = st->req.fetch;
  c.fetch_bytes = st->req.limits.files_bytes;
  c.cpu_seconds = (st->req.limits.timeout_ms + 999) / 1000 + 1;
  auto meta = meta_for(lang, st->req.limits, st->req.limits.timeout_ms, /*generic=*/false);
  std::weak_ptr<ServiceCore> weak = core.shared_from_this();
  core.submit(st->client, lang.image, meta, zygote::encode_payload(c), st->job,
              [weak, st](Result<StepResult> step) {
                auto cp = weak.lock();
                if (!cp) return;
                if (!step) {
                  finish(*cp, st, std::unexpected(step.error()));
                  return;
                }
                st->result.queue_us += step->queue_us;
                st->result.verdict = step->verdict;
                st->result.run = std::move(*step);
                finish(*cp, st, st->result);
              });
}

// Starts the steps of one normalized request: its compile (through the cache) or its run.
void start_run(ServiceCore& core, const LanguageSet& langs, const std::string& client,
               RunRequest req, std::shared_ptr<FunctionService::Job> job,
               FunctionService::RunDone done) {
  auto st = std::make_shared<RunState>();
  st->client = client;
  st->lang = langs.find(req.language);
  st->req = std::move(req);
  st->job = std::move(job);
  st->done = std::move(done);
  st->t0 = Clock::now();
  if (st->lang->compiled()) {
    st->cache_key = CompileCache::key(*st->lang, st->req.source, st->req.files);
    start_compile(core, st);
  } else {
    submit_run(core, st, nullptr);
  }
}

}  // namespace

FunctionService::FunctionService(std::shared_ptr<const LanguageSet> languages,
                                 WorkerFactory factory, ServiceOptions opts)
    : langs_(std::move(languages)),
      opts_(opts),
      core_(std::make_shared<detail::ServiceCore>(langs_, std::move(factory), std::move(opts))) {}

FunctionService::~FunctionService() {
  shutdown();
  core_->own_pool.reset();  // joins its threads (worker removals in flight)
}

Result<void> FunctionService::normalize(RunRequest* r) const {
  const LanguageDef* lang = langs_->find(r->language);
  if (!lang) {
    std::string names;
    for (const auto& d : langs_->all()) names += (names.empty() ? "" : ", ") + d.name;
    return fail(Code::kInvalidArgument,
                "unknown language '" + r->language + "' (this node serves: " + names + ")");
  }
  r->language = lang->name;
  const Limits& d = opts_.defaults;
  const Limits& m = opts_.max;
  Limits& l = r->limits;
  auto pick = [](uint64_t* v, uint64_t dflt, uint64_t min, uint64_t max, const char* what,
                 const char* unit, uint64_t scale) -> Result<void> {
    if (*v == 0) *v = dflt;
    if (*v < min || *v > max)
      return fail(Code::kInvalidArgument, fmt::format("{} must be between {} and {} {}", what,
                                                      min / scale, max / scale, unit));
    return {};
  };
  TP_TRY(pick(&l.timeout_ms, d.timeout_ms, 1, m.timeout_ms, "timeout", "ms", 1));
  TP_TRY(
      pick(&l.memory_bytes, d.memory_bytes, 16ull << 20, m.memory_bytes, "memory", "MiB", 1 << 20));
  TP_TRY(pick(&l.output_bytes, d.output_bytes, 1024, m.output_bytes, "output limit", "KiB", 1024));
  TP_TRY(
      pick(&l.files_bytes, d.files_bytes, 1024, m.files_bytes, "fetched files limit", "KiB", 1024));
  uint64_t pids = l.pids;
  TP_TRY(pick(&pids, d.pids, 8, m.pids, "pids", "tasks", 1));
  l.pids = static_cast<uint32_t>(pids);
  TP_TRY(pick(&r->compile_timeout_ms, opts_.compile_timeout_ms, 1, opts_.max_compile_timeout_ms,
              "compile timeout", "ms", 1));
  if (r->files.size() > 1000) return fail(Code::kInvalidArgument, "at most 1000 files");
  std::set<std::string> seen = {lang->file};
  if (lang->compiled()) seen.insert(lang->binary);
  for (auto& f : r->files) {
    auto p = scratch_path(f.path, "file");
    if (!p) return std::unexpected(p.error());
    f.path = *p;
    if (!seen.insert(f.path).second)
      return fail(Code::kInvalidArgument,
                  "file '" + f.path + "' is given twice (or is the program's own)");
    f.mode &= 0777;
  }
  for (auto& name : r->fetch) {
    auto p = scratch_path(name, "fetched file");
    if (!p) return std::unexpected(p.error());
  }
  if (r->fetch.size() > 1000) return fail(Code::kInvalidArgument, "at most 1000 fetched files");
  if (r->args.size() > 10000) return fail(Code::kInvalidArgument, "at most 10000 arguments");
  for (const auto& a : r->args)
    if (a.find('\0') != std::string::npos)
      return fail(Code::kInvalidArgument, "arguments must not contain NUL");
  for (const auto& [k, v] : r->env)
    if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos ||
        v.find('\0') != std::string::npos)
      return fail(Code::kInvalidArgument, "invalid environment variable '" + k + "'");
  return {};
}

Result<std::shared_ptr<FunctionService::Job>> FunctionService::run(const std::string& client,
                                                                   RunRequest req, RunDone done) {
  TP_TRY(normalize(&req));
  auto job = std::make_shared<Job>();
  start_run(*core_, *langs_, client, std::move(req), job, std::move(done));
  return job;
}

Result<std::shared_ptr<FunctionService::Job>> FunctionService::run_batch(
    const std::string& client, std::vector<RunRequest> reqs, BatchDone done) {
  if (reqs.empty()) return fail(Code::kInvalidArgument, "a batch needs at least one run");
  if (reqs.size() > opts_.max_batch)
    return fail(Code::kInvalidArgument,
                "a batch holds at most " + std::to_string(opts_.max_batch) + " runs");
  for (size_t i = 0; i < reqs.size(); ++i)
    if (auto r = normalize(&reqs[i]); !r)
      return fail(r.error().code, "run " + std::to_string(i) + ": " + r.error().message());
  struct Gather {
    std::mutex mu;
    std::vector<Result<RunResult>> results;
    size_t left;
    BatchDone done;
  };
  auto g = std::make_shared<Gather>();
  g->results.assign(reqs.size(), fail(Code::kInternal, "not run"));
  g->left = reqs.size();
  g->done = std::move(done);
  auto job = std::make_shared<Job>();
  for (size_t i = 0; i < reqs.size(); ++i)
    start_run(*core_, *langs_, client, std::move(reqs[i]), job, [g, i](Result<RunResult> r) {
      bool last;
      {
        std::lock_guard lock(g->mu);
        g->results[i] = std::move(r);
        last = --g->left == 0;
      }
      if (last) g->done(std::move(g->results));
    });
  return job;
}

void FunctionService::cancel(const std::shared_ptr<Job>& job) {
  if (job) core_->cancel(job);
}

void FunctionService::warm_up(const std::string& image) {
  Deferred later;
  {
    std::lock_guard lock(core_->mu);
    if (core_->shut_down) return;
    core_->ensure_workers_locked(image, core_->pool_locked(image), &later);
  }
  for (auto& f : later) f();
}

FunctionService::Status FunctionService::status() const {
  Status s;
  std::lock_guard lock(core_->mu);
  for (const auto& [image, p] : core_->pools) {
    PoolStatus ps;
    ps.image = image;
    for (const auto& w : p->workers) ps.workers.push_back({w.worker->id(), w.in_flight});
    ps.starting = p->starting;
    ps.queued = p->queue.queued();
    ps.in_flight = p->queue.in_flight();
    ps.last_error = p->last_error;
    s.queued += ps.queued;
    s.in_flight += ps.in_flight;
    s.pools.push_back(std::move(ps));
  }
  s.runs_total = core_->runs_total;
  s.runs_per_second = core_->rate_locked();
  s.verdicts = core_->verdicts;
  s.cache = core_->cache.stats();
  return s;
}

void FunctionService::render_metrics(std::string* out) const {
  Status s = status();
  std::string& o = *out;
  size_t ready = 0, starting = 0;
  for (const auto& p : s.pools) {
    ready += p.workers.size();
    starting += p.starting;
  }
  o += "# HELP tidepool_fn_queue_depth Function calls waiting for a worker slot.\n";
  o += "# TYPE tidepool_fn_queue_depth gauge\n";
  o += fmt::format("tidepool_fn_queue_depth {}\n", s.queued);
  o += "# HELP tidepool_fn_in_flight Function calls running.\n";
  o += "# TYPE tidepool_fn_in_flight gauge\n";
  o += fmt::format("tidepool_fn_in_flight {}\n", s.in_flight);
  o += "# HELP tidepool_fn_workers Function-tier zygote workers.\n";
  o += "# TYPE tidepool_fn_workers gauge\n";
  o += fmt::format("tidepool_fn_workers{{state=\"ready\"}} {}\n", ready);
  o += fmt::format("tidepool_fn_workers{{state=\"starting\"}} {}\n", starting);
  o += "# HELP tidepool_fn_calls_per_second Function runs finished per second (last 10 s).\n";
  o += "# TYPE tidepool_fn_calls_per_second gauge\n";
  o += fmt::format("tidepool_fn_calls_per_second {:.1f}\n", s.runs_per_second);
  std::lock_guard lock(core_->mu);
  o += "# HELP tidepool_fn_runs_total Function runs finished, by language.\n";
  o += "# TYPE tidepool_fn_runs_total counter\n";
  for (const auto& [lang, n] : core_->by_language)
    o += fmt::format("tidepool_fn_runs_total{{language=\"{}\"}} {}\n", lang, n);
  o += "# HELP tidepool_fn_verdicts_total Function runs by verdict.\n";
  o += "# TYPE tidepool_fn_verdicts_total counter\n";
  for (auto v : {Verdict::kOk, Verdict::kRuntimeError, Verdict::kTimeLimit, Verdict::kMemoryLimit,
                 Verdict::kOutputLimit, Verdict::kCompileError}) {
    auto it = core_->verdicts.find(std::string(verdict_name(v)));
    o += fmt::format("tidepool_fn_verdicts_total{{verdict=\"{}\"}} {}\n", verdict_name(v),
                     it == core_->verdicts.end() ? 0 : it->second);
  }
  o += "# HELP tidepool_fn_errors_total Function runs that could not complete (no worker, lost, "
       "cancelled).\n";
  o += "# TYPE tidepool_fn_errors_total counter\n";
  o += fmt::format("tidepool_fn_errors_total {}\n", core_->run_errors);
  o += "# HELP tidepool_fn_compile_cache_total Compile cache lookups.\n";
  o += "# TYPE tidepool_fn_compile_cache_total counter\n";
  o += fmt::format("tidepool_fn_compile_cache_total{{result=\"hit\"}} {}\n", s.cache.hits);
  o += fmt::format("tidepool_fn_compile_cache_total{{result=\"miss\"}} {}\n", s.cache.misses);
  o += "# TYPE tidepool_fn_run_seconds histogram\n";
  core_->run_seconds.render("tidepool_fn_run_seconds", out);
}

void FunctionService::shutdown() { core_->shutdown(); }

}  // namespace tp::function
