// SandboxManager: the node's owner of live sandboxes; implements node::Service.
//
// It creates sandboxes through the runtime Registry's backends, connects an
// AgentClient to each, records every sandbox in the SandboxStore, enforces TTL
// and idle timeouts, and destroys sandboxes so that nothing of them remains.
// Every transition of a sandbox runs on that sandbox's strand (node/sandbox.h).
//
// Outcomes of concurrent requests (each one well defined, stored and answered
// alike):
//   - delete (or ttl, idle, shutdown) during create: the create answers
//     kConflict "sandbox X was deleted while creating" (the reason named), the
//     delete answers the final record, stored as stopped with that end reason.
//   - exec or file call during a delete: refused with kConflict from the moment
//     the delete was requested; commands already running fail with
//     kUnavailable when the agent is closed.
//   - a second delete, or ttl expiry while a delete runs: answers the same
//     final record; the first request's end reason wins.
//
// Records: a sandbox is first stored once it runs (its create answered after that)
// or once it ended without running; while it is created it exists in memory only
// (get and list see it as creating), so a crash mid-create leaves no record and
// recover()'s orphan cleanup removes what the create had made.
//
// Restart policy (live restore): shutdown() releases sandboxes (they keep
// running; their records stay running) unless stop_on_exit is set or the
// sandbox's tier cannot hand it over (no agent_address()); those are stopped
// with end reason daemon_shutdown. recover() adopts every record a previous
// run left live (warm-pool sandboxes included) through its tier's backend,
// reconnects to its agent and re-attaches its background processes; one that
// cannot be adopted is stored stopped with end reason daemon_restart (gone) or
// agent_lost (its agent does not answer), and cleanup_orphans removes what is
// left of it. What no live record names (the function tier's workers) is removed
// by cleanup_orphans on another thread while the records are adopted. TTLs and
// records stay as they were. Uid ranges: recover() holds the range of every
// live record, frees those of sandboxes it did not keep once cleanup_orphans
// removed what was left of them, and holds (never hands out) any range that
// a process on the host still runs in (UidRanges::kInUseOnHost; e.g. a killed
// agent's init, dead but not yet reaped by host PID 1). Those are checked
// again every uid_recheck on the tick, and at once by a create that finds no
// free range; each is freed once a scan finds no process with its ids.
//
// Images: a record keeps the layer digests its sandbox was created with
// (resolved before the record is first stored), and the backend gets those
// digests in the spec. An adopted sandbox pins exactly its recorded layers, so
// gc cannot remove them even when its image reference names other layers by
// now (a new version, a replaced part) or is gone; its defaults (env, workdir,
// user) are then the reference's current ones, or none. Records of older
// daemons have no layers: their image is resolved by reference, as before.
//
// Background process output: files under <data_dir>/sandboxes/<id>/ (bounded
// by output_limit per stream), removed when the sandbox ends. A process that
// ended and was reported before a restart is not listed after it.
//
// Teardown pacing: a stop answered before its teardown (destroy_nowait: DELETE
// ?wait=false, an exec with "remove") leaves the teardown for later while clients
// are busy (set_clients_busy): the sandbox is frozen at once (nothing of it runs
// any more; its stop is stored, so a restarted daemon finishes it),
// and destroyed once clients are quiet, one at a time, or once it has waited
// max_teardown_delay, or at once when max_deferred_teardowns wait already. A
// sandbox's teardown (its processes' exit, its namespaces' and cgroups' release,
// much of it in kernel workers) takes a core for milliseconds; on a small node the
// requests that follow it, a client's next `tidepool run` say, would pay for it.
// A caller that waits for the final record (destroy(), shutdown()) has the
// teardown run at once; so do a job's sandboxes (its quotas count them until they
// are gone) and those of a tier that cannot freeze.
//
// Thread rules: every method may be called from any thread. Callbacks run on
// the io_context's threads. Blocking work (clone, destroy, store writes of a
// transition) runs on an internal thread pool, never on the io threads.
// Destroy the manager after the io_context's threads have stopped (the daemon
// joins them first) or once Sandbox::ops_in_flight() is back to what it was:
// the tail of an op on an io thread may still post to the internal pool.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "common/result.h"
#include "control/sandbox_store.h"
#include "node/agent_client.h"
#include "node/sandbox.h"
#include "node/service.h"
#include "node/uid_ranges.h"
#include "runtime/registry.h"

namespace tp::node {

// Resolves an image reference ("name:version", ...). Called on a blocking thread.
using ImageResolver = std::function<Result<ResolvedImage>(const std::string& image)>;
// A background process of sandbox `id` ended (info.outcome or info.error is set).
using ProcessExitHook = std::function<void(const std::string& id, const ProcessInfo& info)>;

struct ManagerOptions {
  std::string node_name = "n0";
  // Parent of the per-sandbox directories (background process output); "" =
  // no files (process output is then dropped).
  std::string data_dir;
  // shutdown() stops every sandbox instead of releasing it (tests, development).
  bool stop_on_exit = false;
  // Opens an agent session over a backend's fd (a new sandbox).
  std::function<std::shared_ptr<AgentClient>(boost::asio::io_context&, int fd, std::string id)>
      agent_from_fd;
  // Opens a new session with the agent of an adopted sandbox (its
  // agent_address()); unset = adopted sandboxes count as agent_lost.
  std::function<Result<std::shared_ptr<AgentClient>>(boost::asio::io_context&,
                                                     const std::string& address, std::string id)>
      agent_connect;
  // Called once a sandbox's final record is stored, with that record (the step log
  // starts its retention clock then). Any thread.
  std::function<void(const control::SandboxRecord& final_record)> on_ended;
  // Called once a sandbox runs and its record is stored, before its create is
  // answered, on a blocking thread; it may block briefly (the trajectory log makes
  // the creation durable then).
  std::function<void(const control::SandboxRecord& rec)> on_created;
  // Makes a new sandbox's id (the trajectory log hands out ids whose logs it made
  // ahead, StepLog::new_sandbox_id); unset = ids::new_sandbox_id(node_name). Any thread.
  std::function<std::string()> new_id;
  // An id from new_id that no sandbox got: its create was refused before anything of
  // it existed (`unseen`: before it was listed anywhere, so it may be handed out
  // again). Any thread.
  std::function<void(const std::string& id, bool unseen)> drop_id;
  // Called when a background process ends, after its waiters were answered. Any thread.
  ProcessExitHook on_process_exit;
  // Called by recover() for a command of a keyed call (ExecParams::step_tag) that a
  // previous run started and never answered: a request's command, stopped now (pid
  // 0), or a background process, adopted (its handle). The trajectory log records
  // the call's outcome then, so that its retry is not run again. Before serving.
  std::function<void(const std::string& id, const std::string& step_tag, uint32_t pid)>
      on_step_lost;
  // One host uid range per sandbox (node/uid_ranges.h): allocated before the
  // record is stored, recorded in it, held again for adopted sandboxes, freed
  // once the sandbox is destroyed. Unset = every sandbox gets the backend's
  // shared range (SandboxSpec::uid_base 0).
  std::shared_ptr<UidRanges> uid_ranges;
  // Host ids in use, for the ranges held for UidRanges::kInUseOnHost (see above);
  // unset = host_uids_in_use (reads /proc). Called on blocking threads.
  UidRanges::Scan host_ids_in_use;
  // How often the tick re-checks ranges held for kInUseOnHost (a scan of /proc
  // while there are any; never when there are none).
  std::chrono::milliseconds uid_recheck{2000};
  std::chrono::milliseconds agent_ready_timeout{15000};
  std::chrono::milliseconds tick{500};
  // Teardowns left for a quiet moment (see "Teardown pacing"): at most this many
  // at once, none older than max_teardown_delay.
  size_t max_deferred_teardowns = 64;
  std::chrono::milliseconds max_teardown_delay{1000};
  size_t blocking_threads = 2;
};

class SandboxManager : public Service {
 public:
  SandboxManager(boost::asio::io_context& io, runtime::Registry& registry,
                 control::SandboxStore& store, Metrics& metrics, ManagerOptions opts);
  ~SandboxManager() override;

  // Adopts or cleans up what a previous run left behind, kAdoptersAtOnce
  // sandboxes at a time; call once before serving, before the io_context runs
  // (it runs it on helper threads meanwhile).
  Result<void> recover();
  static constexpr size_t kAdoptersAtOnce = 8;
  // Starts the TTL / idle timer.
  void start();
  // Releases (or stops, see above) every live sandbox and stops the timer;
  // refuses new creates. Blocks; call it off the io threads, which must run.
  void shutdown();

  void create(CreateParams p, std::function<void(Result<control::SandboxRecord>)> cb) override;
  Result<control::SandboxRecord> get(const std::string& id) override;
  Result<std::vector<control::SandboxRecord>> list(const ListFilter& f) override;
  void destroy(const std::string& id, EndReason reason,
               std::function<void(Result<control::SandboxRecord>)> cb) override;
  void destroy_nowait(const std::string& id, EndReason reason,
                      std::function<void(Result<control::SandboxRecord>)> cb) override;
  Result<uint32_t> exec(const std::string& id, ExecParams p, ExecCallbacks cb) override;
  void signal_exec(const std::string& id, uint32_t exec_id, int signo) override;
  void credit_exec(const std::string& id, uint32_t exec_id, uint64_t bytes) override;
  void start_process(const std::string& id, ExecParams p,
                     std::function<void(Result<ProcessInfo>)> cb) override;
  Result<std::vector<ProcessInfo>> list_processes(const std::string& id) override;
  Result<ProcessInfo> get_process(const std::string& id, uint32_t pid) override;
  void wait_process(const std::string& id, uint32_t pid, int64_t timeout_ms,
                    std::function<void(Result<ProcessInfo>)> cb) override;
  Result<void> process_stdin(const std::string& id, uint32_t pid, std::string data,
                             bool eof) override;
  void write_exec_stdin(const std::string& id, uint32_t exec_id, std::string data, bool eof,
                        std::function<void(Result<void>)> cb) override;
  void write_process_stdin(const std::string& id, uint32_t pid, std::string data, bool eof,
                           std::function<void(Result<void>)> cb) override;
  Result<void> signal_process(const std::string& id, uint32_t pid, int signo) override;
  Result<SandboxRef> ref(const std::string& id) override;
  void pause(const std::string& id,
             std::function<void(Result<control::SandboxRecord>)> cb) override;
  void resume(const std::string& id,
              std::function<void(Result<control::SandboxRecord>)> cb) override;
  void claim(const std::string& id, CreateParams p,
             std::function<void(Result<control::SandboxRecord>)> cb) override;
  void set_admission(Admission a) override;
  std::vector<control::SandboxRecord> pooled() override;
  bool claimable(const std::string& id) override;
  std::map<std::string, uint64_t> count_by_state() override;
  JobUse job_use(const std::string& job) override;
  void after(std::chrono::milliseconds delay, std::function<void()> fn) override;
  const std::string& node_name() const override { return opts_.node_name; }

  // How long clients still count as busy, in seconds (<= 0: quiet); unset: always
  // quiet (no teardown waits). Set before serving.
  void set_clients_busy(std::function<double()> busy_for_s);
  // Images other than "host" are resolved through this; set before serving.
  void set_image_resolver(ImageResolver r) { resolver_ = std::move(r); }
  // Runs one TTL / idle / retry pass now (tests; the timer calls it).
  void tick();
  // Sandboxes held in memory (tests).
  size_t live_count();

 private:
  using RecordCb = Sandbox::RecordCb;
  std::shared_ptr<Sandbox> find_live(const std::string& id);
  // live_ and by_job_ together (under mu_).
  void add_live_locked(const std::shared_ptr<Sandbox>& sb);
  void erase_live_locked(const std::shared_ptr<Sandbox>& sb);
  JobUse job_use_locked(const std::string& job);
  // find_live for a client's request: a pooled sandbox is not found, and a
  // paused one is resumed first (its record follows on its strand).
  std::shared_ptr<Sandbox> find_for_request(const std::string& id);
  // Thaws a paused sandbox now; false if it is not paused (or thawing failed).
  bool resume_now(const std::shared_ptr<Sandbox>& sb);
  // The pause op's body (on a blocking thread, on the strand).
  Result<control::SandboxRecord> pause_now(const std::shared_ptr<Sandbox>& sb);
  // Stores the sandbox's current record on its strand (a state change made off it).
  void store_on_strand(const std::shared_ptr<Sandbox>& sb);
  Result<std::shared_ptr<BgProc>> find_proc(const std::string& id, uint32_t pid);
  Error not_live_error(const std::string& id);
  std::string sandbox_dir(const std::string& id) const;
  void create_op(std::shared_ptr<Sandbox> sb, RecordCb cb, Sandbox::Done done, int64_t start_us);
  void agent_ready(std::shared_ptr<Sandbox> sb, RecordCb cb, Sandbox::Done done, int64_t start_us,
                   Result<void> ready);
  // Requests the end of a sandbox; cb (optional) gets the final record.
  // nowait: cb is answered once the stop's intent is stored (destroy_nowait), when
  // the stop had not begun yet; else with the final record.
  void request_stop(std::shared_ptr<Sandbox> sb, EndReason reason, RecordCb cb,
                    bool nowait = false);
  void request_release(std::shared_ptr<Sandbox> sb, std::function<void()> done);
  // The stop op's body (on a blocking thread, on the strand): stores a stop that
  // is answered ahead, then tears it down, now or later (defer_teardown).
  void stop_now(const std::shared_ptr<Sandbox>& sb);
  // Destroys it and stores its final record (on a blocking thread, on the strand).
  void teardown(const std::shared_ptr<Sandbox>& sb);
  // Freezes it and leaves its teardown for later when clients are busy: true if so.
  bool defer_teardown(const std::shared_ptr<Sandbox>& sb);
  // Runs the teardown of a deferred sandbox now (once, whoever calls it first).
  void reclaim(const std::shared_ptr<Sandbox>& sb);
  // Starts the next teardown that is due (at most one at a time) and re-arms the timer.
  void reclaim_tick();
  void arm_reclaim_locked(std::chrono::milliseconds delay);
  // teardown(sb) as an op of its strand, then `then` (optional) within that op.
  void teardown_op(std::shared_ptr<Sandbox> sb, std::function<void()> then);
  void watch_agent(const std::shared_ptr<Sandbox>& sb);
  Result<uint32_t> start_exec(const std::shared_ptr<Sandbox>& sb, ExecParams p, ExecCallbacks cb,
                              std::string meta);
  void attach_proc(const std::shared_ptr<Sandbox>& sb, std::shared_ptr<BgProc> bg);
  // Adopts one record a previous run left live: true if kept, false if stored stopped.
  Result<bool> adopt_one(control::SandboxRecord r);
  void repause_adopted(const std::shared_ptr<Sandbox>& sb);
  // The image of a sandbox being adopted: its recorded layers, pinned (see the header).
  Result<ResolvedImage> adopted_image(const control::SandboxRecord& r);
  // Writes a snapshot of its record: an insert if it was never stored (version 0),
  // else a compare-and-set update. A sandbox is first stored when it runs or ends.
  Result<uint64_t> put_record(const control::SandboxRecord& snap);
  // Stores its final record, forgets it (unless the store fails) and answers its stop waiters.
  void store_final(const std::shared_ptr<Sandbox>& sb, std::optional<Error> err);
  // Frees the sandbox's uid range: call only once nothing of it is left.
  void release_range(const std::shared_ptr<Sandbox>& sb);
  // Frees the ranges held for kInUseOnHost that no host process uses any more.
  // Blocks (a scan): on a blocking thread.
  void recheck_ranges();
  void on_tick();

  boost::asio::io_context& io_;
  ImageResolver resolver_;
  runtime::Registry& registry_;
  control::SandboxStore& store_;
  Metrics& metrics_;
  ManagerOptions opts_;
  boost::asio::thread_pool blocking_;
  // Agent callbacks arrive on other threads (an agent's start, its ready timer) and
  // post to blocking_: the destructor closes this gate first, so that no post races
  // the pool's destruction.
  struct PostGate {
    std::mutex mu;
    bool open = true;
  };
  std::shared_ptr<PostGate> gate_ = std::make_shared<PostGate>();
  boost::asio::steady_timer timer_;
  // A tick's re-check of the uid ranges is under way (at most one at a time), and
  // when the last one began (read and written only by whoever set rechecking_;
  // unset: none yet).
  std::atomic<bool> rechecking_{false};
  std::optional<std::chrono::steady_clock::time_point> last_recheck_;

  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Sandbox>> live_;
  bool stopping_ = false;
  Admission admission_;                   // under mu_
  std::function<double()> clients_busy_;  // set before serving
  // Teardowns left for later, oldest first (under mu_), and whether the timer
  // for them is armed or one of them runs.
  struct Deferred {
    std::shared_ptr<Sandbox> sb;
    std::chrono::steady_clock::time_point since;
  };
  std::deque<Deferred> deferred_;
  bool reclaim_armed_ = false, reclaiming_ = false;
  // Live sandboxes by job (creating and stopping ones too: they hold their resources).
  std::map<std::string, std::set<std::shared_ptr<Sandbox>>> by_job_;
};

// Milliseconds since the Unix epoch.
int64_t now_ms();

}  // namespace tp::node
