// Sandbox: one live sandbox as the node holds it: its record, its runtime
// instance, its agent session and its background processes, plus the strand
// that serialises its transitions.
//
// The strand: enqueue(op) runs ops one at a time, in order; an op may finish
// asynchronously (it calls its Done once, from any thread) and the next op
// starts only after that. Create, stop, release and adopt are ops, so two
// requests never race on the instance: a delete that arrives while the create
// op runs records its reason at once (stop_reason, so that exec and file
// calls are refused from then on) and its stop op runs after the create op.
//
// State changes go through apply(), which uses the pure transition function
// of node/state.h and keeps rec.state equal to the stored string of the state.
//
// Thread rules: `mu` guards every field below it except `inst`, `agent` and
// `backend`, which are written only by ops on the strand before the sandbox is
// published as running (under mu) and never reset afterwards, so code that saw
// state running under mu may use them without the lock.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "control/sandbox_store.h"
#include "node/agent_client.h"
#include "node/service.h"
#include "node/state.h"
#include "runtime/backend.h"

namespace tp::node {

// An image resolved to what the runtime needs. `pin` keeps the image's layers
// from being garbage-collected while a sandbox uses them (released at its end).
struct ResolvedImage {
  std::vector<std::string> layers;         // layer digests "sha256:<hex>", top first
  std::map<std::string, std::string> env;  // image defaults, under the sandbox's env
  std::string workdir;                     // default cwd of commands ("" = /)
  std::shared_ptr<void> pin;
  uint32_t uid = 0;  // default user of commands
  uint32_t gid = 0;
};

// A background process. Its output goes to two files (out_path, err_path)
// under the sandbox's data directory, not to memory.
struct BgProc {
  std::mutex mu;
  ProcessInfo info;      // out/err stay empty here: read from the files
  uint32_t exec_id = 0;  // the agent's id of the command (changes on a restart)
  std::string out_path, err_path;
  int out_fd = -1, err_fd = -1;  // open while it runs
  uint64_t limit = 0;            // bytes kept per stream
  uint64_t out_bytes = 0, err_bytes = 0;
  std::vector<std::function<void()>> waiters;  // run once when it exits
  ~BgProc();
  void close_files();
};

class Sandbox : public std::enable_shared_from_this<Sandbox> {
 public:
  using Done = std::function<void()>;
  using Op = std::function<void(Done)>;
  using RecordCb = std::function<void(Result<control::SandboxRecord>)>;

  Sandbox(control::SandboxRecord rec, State state);
  const std::string& id() const { return id_; }

  // Runs op once every op enqueued before it has called its Done. The op starts
  // on the enqueuing thread when the strand is idle, else on the thread that
  // calls the previous Done, which may hold `mu` or `freeze_mu`: an op posts its
  // work elsewhere rather than taking those locks inline.
  void enqueue(Op op);
  // Ops enqueued on any sandbox of this process whose Done has not run yet: zero when
  // no op can still post work to its manager (tests wait for it before destroying one
  // while their io threads run).
  static int64_t ops_in_flight() { return ops_in_flight_.load(); }

  // Applies `e` (caller holds mu): false, changing nothing, if not allowed.
  bool apply(Event e);

  std::mutex mu;
  // Serialises freeze and thaw of the instance (a pause op on the strand, and a
  // request that resumes the sandbox on its way in). Taken before `mu`.
  std::mutex freeze_mu;
  control::SandboxRecord rec;  // rec.state follows `state` (see stored_name())
  State state;
  // Set by the first stop request (delete, ttl, idle, shutdown, agent loss);
  // later requests wait for the same end.
  EndReason stop_reason = EndReason::kNone;
  bool release_requested = false;  // the daemon exits and leaves it running
  // Its agent's connection closed while it was still being created (after the agent
  // reported ready): the create fails instead of answering a sandbox nobody can reach.
  bool agent_lost = false;
  // Final and its end handled: the final record stored (or kept as unrecorded)
  // and stop_waiters answered. Between a final state and this, new waiters queue
  // (so that nobody hears of an end before it is stored).
  bool settled = false;
  std::vector<RecordCb> stop_waiters;
  // destroy_nowait() callers: answered once the stop's intent is stored (its
  // record still running, with the end reason), before the teardown.
  std::vector<RecordCb> accept_waiters;
  ResolvedImage image;
  uint64_t disk_bytes = 0;
  int64_t last_active_ms = 0;
  int running_execs = 0;
  // Ended, but its final record could not be stored (e.g. a full disk): kept
  // until the manager's timer stores it.
  bool unrecorded = false;
  std::map<uint32_t, std::shared_ptr<BgProc>> procs;  // by handle
  uint32_t next_proc = 1;

  runtime::Backend* backend = nullptr;
  std::unique_ptr<runtime::SandboxInstance> inst;
  std::shared_ptr<AgentClient> agent;

 private:
  void drain();
  const std::string id_;
  std::mutex qmu_;
  std::deque<Op> queue_;
  bool busy_ = false;
  static inline std::atomic<int64_t> ops_in_flight_{0};
};

}  // namespace tp::node
