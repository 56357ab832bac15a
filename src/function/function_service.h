// FunctionService: the function tier (docs/function-tier.md). Stateless code execution:
// a program, its input, its limits in; its output, exit status, time, memory and
// verdict out.
//
// Workers (worker.h) are kept per image: `workers` zygote workers of `slots` calls each,
// started on the first call for that image and replaced when lost (with a back-off
// while they keep failing to start). Every step of a run (compile, run) is one call on
// one worker. When every slot is busy, calls wait in a FairQueue per image: round robin
// over clients, at most `per_client_in_flight` running per client. Compiled languages
// go through the CompileCache: one compile per program, however many runs want it.
//
// Requests are checked first (normalize): an unknown language, a limit out of range or
// a file path outside the scratch directory is kInvalidArgument, before anything runs.
// A run that cannot complete (no worker can start, the worker was lost, the daemon is
// stopping, the run was cancelled) ends with an error (kUnavailable); a program that
// fails is a RunResult with its verdict.
//
// Thread rules: every method may be called from any thread. A run's `done` runs exactly
// once, on a worker's io thread, a service thread or, when the run fails at once (a full
// queue), inline from run(). Workers' start/cancel are called under the service's mutex
// (they never call back inline); everything else the service calls out to (the worker
// factory, `done`) runs outside it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "function/call.h"
#include "function/compile_cache.h"
#include "function/fair_queue.h"
#include "function/language.h"
#include "function/worker.h"

namespace tp::function {

namespace detail {
struct ServiceCore;
}

struct ServiceOptions {
  size_t workers = 2;  // per image
  size_t slots = 8;    // concurrent calls per worker
  FairQueue::Options queue;
  Limits defaults;
  Limits max{.timeout_ms = 300'000,
             .memory_bytes = 4ull << 30,
             .output_bytes = 64ull << 20,
             .pids = 4096,
             .files_bytes = 256ull << 20};
  uint64_t compile_timeout_ms = 10'000;
  uint64_t max_compile_timeout_ms = 300'000;
  uint64_t cache_bytes = 256ull << 20;
  size_t max_batch = 10'000;
  std::chrono::milliseconds retry_backoff{500};  // first retry of a failed worker start
  std::map<std::string, uint32_t> warm;          // what each worker keeps ready (status only)
  // Runs blocking work (worker creation and removal); default: two threads of its own.
  std::function<void(std::function<void()>)> run_blocking;
};

class FunctionService {
 public:
  struct Job;  // a run or batch in progress (cancel())
  using RunDone = std::function<void(Result<RunResult>)>;
  using BatchDone = std::function<void(std::vector<Result<RunResult>>)>;

  FunctionService(std::shared_ptr<const LanguageSet> languages, WorkerFactory factory,
                  ServiceOptions opts);
  ~FunctionService();  // shutdown()
  FunctionService(const FunctionService&) = delete;
  FunctionService& operator=(const FunctionService&) = delete;

  // Checks a request and fills in defaults; what run() does first.
  Result<void> normalize(RunRequest* req) const;
  // Starts one run for `client` (fair queueing and per-client limits are per client).
  Result<std::shared_ptr<Job>> run(const std::string& client, RunRequest req, RunDone done);
  // Starts many runs; `done` gets every result in request order. Checked as a whole:
  // one bad request fails the batch (its index in the message) before anything runs.
  Result<std::shared_ptr<Job>> run_batch(const std::string& client, std::vector<RunRequest> reqs,
                                         BatchDone done);
  // Stops what is left of a job: queued calls fail, running ones are killed.
  void cancel(const std::shared_ptr<Job>& job);
  // Starts an image's workers now instead of at its first call.
  void warm_up(const std::string& image);

  const LanguageSet& languages() const { return *langs_; }
  // Children each worker keeps ready, by flavor (what the tier was configured with;
  // informational, for status and the tests' leak checks).
  std::map<std::string, uint32_t> warm_per_worker() const { return opts_.warm; }
  const ServiceOptions& options() const { return opts_; }

  struct WorkerStatus {
    std::string id;
    size_t in_flight = 0;
  };
  struct PoolStatus {
    std::string image;
    std::vector<WorkerStatus> workers;
    size_t starting = 0;
    size_t queued = 0;
    size_t in_flight = 0;
    std::string last_error;
  };
  struct Status {
    std::vector<PoolStatus> pools;
    size_t queued = 0;
    size_t in_flight = 0;
    uint64_t runs_total = 0;
    double runs_per_second = 0;  // over the last 10 s
    std::map<std::string, uint64_t> verdicts;
    CompileCache::Stats cache;
  };
  Status status() const;
  // Prometheus lines of the tier (queue depth, calls per second, verdict counts, ...).
  void render_metrics(std::string* out) const;
  // Fails what is queued, removes every worker (blocking); later runs fail. Idempotent.
  void shutdown();

 private:
  std::shared_ptr<const LanguageSet> langs_;
  ServiceOptions opts_;
  std::shared_ptr<detail::ServiceCore> core_;
};

}  // namespace tp::function
