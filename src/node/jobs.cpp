#include "node/jobs.h"

#include <fmt/format.h>

#include <atomic>
#include <random>

#include "common/log.h"

namespace tp::node {

using control::JobRecord;
using control::SandboxRecord;

namespace {

std::string new_job_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("job-{:012x}", rng() & 0xffffffffffffull);
}

std::string quota_text(double v) {
  if (v == static_cast<double>(static_cast<uint64_t>(v)))
    return std::to_string(static_cast<uint64_t>(v));
  return fmt::format("{:.2f}", v);
}

}  // namespace

JobManager::JobManager(Service& svc, control::JobStore& store, Metrics& metrics, Options opts)
    : svc_(svc), store_(store), metrics_(metrics), opts_(std::move(opts)) {
  if (!opts_.now_ms)
    opts_.now_ms = [] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
          .count();
    };
  metrics_.add_source([this, alive = std::weak_ptr<bool>(alive_)](std::string* out) {
    if (alive.lock()) render(out);
  });
}

JobManager::~JobManager() {
  shutdown();
  alive_.reset();
}

Result<void> JobManager::start() {
  auto all = store_.list(true);
  if (!all) return std::unexpected(all.error());
  {
    std::lock_guard lk(mu_);
    for (auto& j : *all) live_[j.id] = j;
  }
  svc_.set_admission([this](const CreateParams& p, const JobUse& use) { return admit(p, use); });
  tick();  // what came due while the daemon was down
  schedule();
  return {};
}

void JobManager::shutdown() {
  std::lock_guard lk(mu_);
  stopped_ = true;
}

void JobManager::schedule() {
  svc_.after(opts_.tick, [this, alive = std::weak_ptr<bool>(alive_)] {
    if (!alive.lock()) return;
    {
      std::lock_guard lk(mu_);
      if (stopped_) return;
    }
    tick();
    schedule();
  });
}

Result<JobRecord> JobManager::store_job(JobRecord j) {
  auto v = store_.put(j);
  if (!v) return std::unexpected(v.error());
  j.version = *v;
  return j;
}

Result<JobRecord> JobManager::create(JobRecord spec) {
  if (spec.lease_seconds == 0 || spec.lease_seconds > opts_.max_lease_seconds)
    return fail(Code::kInvalidArgument,
                "lease_seconds must be between 1 and " + std::to_string(opts_.max_lease_seconds));
  if (spec.grace_seconds > opts_.max_grace_seconds)
    return fail(Code::kInvalidArgument,
                "grace_seconds is at most " + std::to_string(opts_.max_grace_seconds));
  if (spec.quota.cpus < 0) return fail(Code::kInvalidArgument, "quota cpus must not be negative");
  if (spec.name.size() > 128) return fail(Code::kInvalidArgument, "name is at most 128 bytes");
  JobRecord j = std::move(spec);
  j.id = new_job_id();
  j.state = "active";
  j.created_ms = now();
  j.lease_expires_ms = j.created_ms + static_cast<int64_t>(j.lease_seconds) * 1000;
  j.lapsed_at_ms = 0;
  j.ended_ms = 0;
  j.end_reason.clear();
  j.version = 0;
  auto stored = store_job(std::move(j));
  if (!stored) return stored;
  std::lock_guard lk(mu_);
  live_[stored->id] = *stored;
  return stored;
}

Result<JobView> JobManager::get(const std::string& id) {
  JobView v;
  {
    std::lock_guard lk(mu_);
    auto it = live_.find(id);
    if (it != live_.end()) v.job = it->second;
  }
  if (v.job.id.empty()) {
    auto r = store_.get(id);
    if (!r) return std::unexpected(r.error());
    if (!*r) return fail(Code::kNotFound, "job " + id + " not found");
    v.job = **r;
  }
  if (v.job.state != "ended") {
    v.use = svc_.job_use(id);
    v.paused = v.use.paused;
  }
  return v;
}

Result<std::vector<JobView>> JobManager::list(bool all) {
  auto jobs = store_.list(!all);
  if (!jobs) return std::unexpected(jobs.error());
  std::vector<JobView> out;
  for (auto& j : *jobs) {
    auto v = get(j.id);
    if (v) out.push_back(std::move(*v));
  }
  return out;
}

std::vector<SandboxRecord> JobManager::sandboxes_of(const std::string& job,
                                                    const std::string& step) {
  ListFilter f;
  f.job = job;
  f.step = step;
  auto r = svc_.list(f);
  if (!r) return {};
  std::vector<SandboxRecord> out;
  for (auto& s : *r)
    if (s.state == "creating" || s.state == "running" || s.state == "paused")
      out.push_back(std::move(s));
  return out;
}

Result<JobRecord> JobManager::heartbeat(const std::string& id) {
  JobRecord j;
  {
    std::lock_guard lk(mu_);
    auto it = live_.find(id);
    if (it == live_.end()) {
      auto r = store_.get(id);
      if (!r) return std::unexpected(r.error());
      if (!*r) return fail(Code::kNotFound, "job " + id + " not found");
      return fail(Code::kConflict, "job " + id + " has ended (" + (*r)->end_reason + ")");
    }
    j = it->second;
  }
  j.state = "active";
  j.lapsed_at_ms = 0;
  j.lease_expires_ms = now() + static_cast<int64_t>(j.lease_seconds) * 1000;
  auto stored = store_job(j);
  if (!stored) {
    // Someone else wrote it first (an end, a lapse): answer from what is stored now.
    if (stored.error().code == Code::kConflict) {
      auto cur = store_.get(id);
      if (cur && *cur && (*cur)->state != "ended") {
        std::lock_guard lk(mu_);
        live_[id] = **cur;
        return heartbeat(id);
      }
      return fail(Code::kConflict, "job " + id + " has ended");
    }
    return stored;
  }
  std::lock_guard lk(mu_);
  if (live_.count(id)) live_[id] = *stored;
  return stored;
}

void JobManager::end(const std::string& id, std::function<void(Result<JobRecord>)> cb) {
  JobRecord j;
  bool found = false;
  {
    std::lock_guard lk(mu_);
    auto it = live_.find(id);
    if (it != live_.end()) {
      j = it->second;
      found = true;
    }
  }
  if (!found) {
    auto r = store_.get(id);
    Result<JobRecord> out = !r    ? Result<JobRecord>(std::unexpected(r.error()))
                            : !*r ? fail(Code::kNotFound, "job " + id + " not found")
                                  : Result<JobRecord>(**r);
    return svc_.after(std::chrono::milliseconds(0), [cb, out] { cb(out); });
  }
  j.state = "ended";
  j.ended_ms = now();
  j.end_reason = "deleted";
  auto stored = store_job(j);
  if (!stored) return svc_.after(std::chrono::milliseconds(0), [cb, stored] { cb(stored); });
  {
    std::lock_guard lk(mu_);
    live_.erase(id);
  }
  JobRecord done = *stored;
  reclaim(sandboxes_of(id, ""), EndReason::kJobEnded, [cb, done](uint64_t) { cb(done); });
}

void JobManager::end_step(const std::string& id, const std::string& step,
                          std::function<void(Result<uint64_t>)> cb) {
  {
    std::lock_guard lk(mu_);
    if (!live_.count(id)) {
      auto r = store_.get(id);
      Result<uint64_t> out = !r    ? Result<uint64_t>(std::unexpected(r.error()))
                             : !*r ? fail(Code::kNotFound, "job " + id + " not found")
                                   : fail(Code::kConflict, "job " + id + " has ended");
      return svc_.after(std::chrono::milliseconds(0), [cb, out] { cb(out); });
    }
  }
  if (step.empty())
    return svc_.after(std::chrono::milliseconds(0),
                      [cb] { cb(fail(Code::kInvalidArgument, "step must not be empty")); });
  reclaim(sandboxes_of(id, step), EndReason::kStepEnded, [cb](uint64_t n) { cb(n); });
}

void JobManager::reclaim(const std::vector<SandboxRecord>& sbs, EndReason why,
                         std::function<void(uint64_t)> done) {
  if (sbs.empty()) return svc_.after(std::chrono::milliseconds(0), [done] { done(0); });
  auto left = std::make_shared<std::atomic<size_t>>(sbs.size());
  const uint64_t n = sbs.size();
  for (const auto& s : sbs)
    svc_.destroy(s.id, why, [left, done, n, id = s.id](Result<SandboxRecord> r) {
      if (!r) TP_SB_WARN(id, "reclaiming: {}", r.error().message());
      if (left->fetch_sub(1) == 1) done(n);
    });
}

Result<void> JobManager::admit(const CreateParams& p, const JobUse& use) {
  std::lock_guard lk(mu_);
  auto it = live_.find(p.job);
  if (it == live_.end())
    return fail(Code::kNotFound, "job " + p.job + " not found (or it has ended)");
  const JobRecord& j = it->second;
  if (j.state == "lapsed")
    return fail(Code::kConflict, "job " + p.job +
                                     " has a lapsed lease (its sandboxes are paused): renew it "
                                     "with a heartbeat first");
  const auto& q = j.quota;
  auto over = [&](const char* what, const std::string& u, const std::string& ask,
                  const std::string& lim) {
    return fail(Code::kResourceExhausted,
                fmt::format("job {} is over its {} quota: {} in use + {} asked > limit {}", p.job,
                            what, u, ask, lim));
  };
  if (q.sandboxes && use.sandboxes + 1 > q.sandboxes)
    return over("sandboxes", std::to_string(use.sandboxes), "1", std::to_string(q.sandboxes));
  if (q.memory_mb && use.memory_mb + p.memory_mb > q.memory_mb)
    return over("memory_mb", std::to_string(use.memory_mb), std::to_string(p.memory_mb),
                std::to_string(q.memory_mb));
  if (q.cpus > 0 && use.cpus + p.cpus > q.cpus + 1e-9)
    return over("cpus", quota_text(use.cpus), quota_text(p.cpus), quota_text(q.cpus));
  return {};
}

void JobManager::tick() {
  const int64_t t = now();
  std::vector<JobRecord> lapse, expire;
  {
    std::lock_guard lk(mu_);
    if (stopped_) return;
    for (auto& [id, j] : live_) {
      if (j.state == "active" && t >= j.lease_expires_ms)
        lapse.push_back(j);
      else if (j.state == "lapsed" &&
               t >= j.lapsed_at_ms + static_cast<int64_t>(j.grace_seconds) * 1000)
        expire.push_back(j);
    }
  }
  for (auto j : lapse) {
    j.state = "lapsed";
    j.lapsed_at_ms = t;
    auto stored = store_job(j);
    if (!stored) continue;  // a heartbeat won the race: the job stays active
    {
      std::lock_guard lk(mu_);
      if (live_.count(j.id)) live_[j.id] = *stored;
    }
    spdlog::info("job {}: lease lapsed; pausing its sandboxes for {} s", j.id, j.grace_seconds);
    for (const auto& s : sandboxes_of(j.id, ""))
      if (s.state == "running")
        svc_.pause(s.id, [id = s.id](Result<SandboxRecord> r) {
          if (!r) TP_SB_WARN(id, "pausing for a lapsed lease: {}", r.error().message());
        });
  }
  for (auto j : expire) {
    j.state = "ended";
    j.ended_ms = t;
    j.end_reason = "expired";
    auto stored = store_job(j);
    if (!stored) continue;
    {
      std::lock_guard lk(mu_);
      live_.erase(j.id);
    }
    spdlog::info("job {}: grace period over; reclaiming its sandboxes", j.id);
    reclaim(sandboxes_of(j.id, ""), EndReason::kLeaseExpired, [](uint64_t) {});
  }
}

void JobManager::render(std::string* out) {
  std::vector<JobRecord> jobs;
  {
    std::lock_guard lk(mu_);
    for (const auto& [id, j] : live_) jobs.push_back(j);
  }
  uint64_t active = 0, lapsed = 0;
  for (const auto& j : jobs) (j.state == "lapsed" ? lapsed : active)++;
  *out += fmt::format(
      "# HELP tidepool_jobs Live jobs by state.\n# TYPE tidepool_jobs gauge\n"
      "tidepool_jobs{{state=\"active\"}} {}\ntidepool_jobs{{state=\"lapsed\"}} {}\n",
      active, lapsed);
  *out +=
      "# HELP tidepool_job_sandboxes Sandboxes a live job holds (from their create until they are "
      "removed).\n"
      "# TYPE tidepool_job_sandboxes gauge\n";
  std::string mem =
      "# HELP tidepool_job_memory_mb Memory limits a live job's sandboxes hold, in MiB.\n"
      "# TYPE tidepool_job_memory_mb gauge\n";
  std::string quota =
      "# HELP tidepool_job_quota A live job's quotas (0 = none).\n"
      "# TYPE tidepool_job_quota gauge\n";
  for (const auto& j : jobs) {
    JobUse use = svc_.job_use(j.id);
    *out += fmt::format("tidepool_job_sandboxes{{job=\"{}\"}} {}\n", j.id, use.sandboxes);
    mem += fmt::format("tidepool_job_memory_mb{{job=\"{}\"}} {}\n", j.id, use.memory_mb);
    quota += fmt::format("tidepool_job_quota{{job=\"{}\",quota=\"sandboxes\"}} {}\n", j.id,
                         j.quota.sandboxes);
    quota += fmt::format("tidepool_job_quota{{job=\"{}\",quota=\"memory_mb\"}} {}\n", j.id,
                         j.quota.memory_mb);
    quota +=
        fmt::format("tidepool_job_quota{{job=\"{}\",quota=\"cpus\"}} {}\n", j.id, j.quota.cpus);
  }
  *out += mem + quota;
}

}  // namespace tp::node
