// JobManager: jobs (the sandboxes of one training run), their leases, steps
// and quotas, over the node's Service and a JobStore.
//
// Lease: a job lives while its trainer renews its lease (heartbeat()). When
// the lease lapses (the trainer was preempted), the job's running sandboxes are
// paused, once, at the lapse; any later request to one of them resumes it
// (Service::pause/resume). After grace_seconds more the job expires: its
// sandboxes are reclaimed (end reason lease_expired). A heartbeat before that
// makes the job active again (its paused sandboxes resume on their next
// request). A create for a lapsed job is refused until the lease is renewed.
//
// Steps: a sandbox created with a step is tagged with it; end_step() reclaims
// the step's sandboxes in one call (step_ended). end() ends the job and
// reclaims all of its sandboxes (job_ended).
//
// Quotas (sandboxes, memory_mb, cpus; 0 = none) are checked by admit(), which
// the node calls atomically with every create or pool hand-out that names the
// job (Service::set_admission): a refusal names the quota, its use and its
// limit.
//
// Jobs are stored, so a restarted daemon keeps them, their leases (absolute
// times) and quotas; tick() then catches up.
//
// Thread rules: every method may be called from any thread; one mutex inside
// (never held while calling into the Service, except admit(), which takes only
// its own lock).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "common/result.h"
#include "control/job_store.h"
#include "node/service.h"

namespace tp::node {

struct JobView {
  control::JobRecord job;
  JobUse use;
  uint64_t paused = 0;
};

class JobManager {
 public:
  struct Options {
    std::chrono::milliseconds tick{500};
    uint64_t max_lease_seconds = 24 * 3600;
    uint64_t max_grace_seconds = 7 * 24 * 3600;
    // Wall-clock milliseconds since the epoch (a seam for tests).
    std::function<int64_t()> now_ms;
  };

  JobManager(Service& svc, control::JobStore& store, Metrics& metrics, Options opts);
  ~JobManager();
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Loads the live jobs, registers admit() with the Service and ticks on a timer.
  Result<void> start();
  void shutdown();

  // A new job: id assigned ("job-" + 12 hex), lease started now.
  Result<control::JobRecord> create(control::JobRecord spec);
  Result<JobView> get(const std::string& id);
  Result<std::vector<JobView>> list(bool all);
  // Renews the lease (a lapsed job becomes active again). kConflict for an ended job.
  Result<control::JobRecord> heartbeat(const std::string& id);
  // Ends the job and reclaims its sandboxes; cb gets the ended job.
  void end(const std::string& id, std::function<void(Result<control::JobRecord>)> cb);
  // Reclaims the sandboxes of one step; cb gets how many.
  void end_step(const std::string& id, const std::string& step,
                std::function<void(Result<uint64_t>)> cb);

  // The Service's Admission.
  Result<void> admit(const CreateParams& p, const JobUse& use);
  // Lapses and expiries due now (the timer calls it; tests call it).
  void tick();

 private:
  int64_t now() const { return opts_.now_ms(); }
  Result<control::JobRecord> store_job(control::JobRecord j);  // under no lock
  std::vector<control::SandboxRecord> sandboxes_of(const std::string& job, const std::string& step);
  // Reclaims (destroys) sandboxes; `done` gets how many were asked to stop.
  void reclaim(const std::vector<control::SandboxRecord>& sbs, EndReason why,
               std::function<void(uint64_t)> done);
  void schedule();
  void render(std::string* out);

  Service& svc_;
  control::JobStore& store_;
  Metrics& metrics_;
  Options opts_;
  std::mutex mu_;
  std::map<std::string, control::JobRecord> live_;  // by id: active and lapsed jobs
  bool stopped_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace tp::node
