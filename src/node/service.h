// Service: what a node offers to the API (create, adopt-on-restart is the
// daemon's business, get, list, destroy, exec, files, background processes).
// SandboxManager implements it; the HTTP routes call only this interface.
//
// Answers to a sandbox that ended: get/list report its stored record; exec,
// ref and process calls fail with kConflict ("sandbox X is stopped"); an id
// never seen fails with kNotFound.
//
// Thread rules: every method may be called from any thread; callbacks run on
// the node's io threads, never inline from the caller.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "control/sandbox_store.h"
#include "node/agent_client.h"
#include "node/state.h"

namespace tp::node {

struct CreateParams {
  std::string image = "host";
  std::string tier = "container";
  uint64_t memory_mb = 512;
  double cpus = 1.0;
  uint64_t pids = 512;
  uint64_t disk_mb = 1024;
  uint64_t ttl_seconds = 3600;
  uint64_t idle_timeout_seconds = 0;
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> env;
  std::string priority = "normal";  // or "best-effort": the lowest CPU weight and SCHED_IDLE
  std::string template_name;        // made from this template ("" = none)
  std::string job;                  // belongs to this job ("" = none): its quotas apply
  std::string step;                 // tagged with this step of its job
  // Internal: made for a warm pool (hidden, no TTL until handed out by claim()).
  bool pooled = false;
  // The request fields the client set (JSON names); a template fills in the rest.
  std::set<std::string> given;
};

// Which sandboxes list() answers.
struct ListFilter {
  std::map<std::string, std::string> labels;  // all must match
  std::string state;                          // "" = any
  bool all = false;                           // ended ones too
  std::string job;                            // "" = any
  std::string step;                           // "" = any
};

// Checks a create against its job's quotas. `use` is what the job's live
// sandboxes (creating ones included) hold now, taken atomically with the
// create, so that concurrent creates cannot both pass. kNotFound / kConflict for
// a job that does not exist or has ended, kResourceExhausted naming the quota.
struct JobUse {
  uint64_t sandboxes = 0;
  uint64_t memory_mb = 0;
  double cpus = 0;
  uint64_t paused = 0;  // of those sandboxes
};
using Admission = std::function<Result<void>(const CreateParams& p, const JobUse& use)>;

struct ExecParams {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  std::string cwd;              // "" = the image's workdir, else /
  std::optional<uint32_t> uid;  // none = the image's user, else root
  uint64_t timeout_ms = 0;
  uint64_t output_limit = 16ull << 20;
  std::string stdin_data;
  bool stdin_open = false;  // background processes: keep stdin open for process_stdin()
  // > 0: output is paced by credit_exec() (ExecRequest::window).
  uint64_t window = 0;
  // Opaque note of the keyed call this command answers (the trajectory log's), kept
  // with the command by the agent: a restarted daemon that finds the command still
  // there hands it to ManagerOptions::on_step_lost. Empty for calls without a key.
  std::string step_tag;
};

// What an exec reports at its end (agent result plus what the node adds).
struct ExecOutcome {
  ExecResult result;
  bool oom_killed = false;
};

struct ExecCallbacks {
  std::function<void(uint32_t pid)> on_started;
  std::function<void(int stream, std::string_view data)> on_output;
  std::function<void(Result<ExecOutcome>)> on_done;
};

// A background process (started with start_process). pid is its handle within
// the sandbox (not a Linux pid); it stays the same across a daemon restart.
struct ProcessInfo {
  uint32_t pid = 0;
  uint32_t os_pid = 0;  // its pid inside the sandbox (as `ps` there shows it); 0: not started
  std::vector<std::string> argv;
  int64_t started_ms = 0;
  bool exited = false;
  std::optional<ExecOutcome> outcome;  // set once exited normally
  std::optional<Error> error;          // set once it failed (e.g. the sandbox ended)
  std::string out, err;                // output so far (wait_process only)
};

// A live sandbox as the API sees it for file operations.
struct SandboxRef {
  std::shared_ptr<AgentClient> agent;
  uint64_t disk_bytes = 0;
};

class Service {
 public:
  virtual ~Service() = default;

  // Answers the running record, or an error. A sandbox deleted (or stopped by
  // ttl or shutdown) while it was being created answers kConflict "sandbox X was
  // deleted while creating"; its record is then stopped with that end reason.
  virtual void create(CreateParams p, std::function<void(Result<control::SandboxRecord>)> cb) = 0;
  // get() and list() show a live sandbox whose stop is under way (its teardown may
  // wait for a quiet moment, up to a second) as "stopping", as destroy_nowait() answers
  // it; its stored record stays "running" with its end reason until it has stopped.
  virtual Result<control::SandboxRecord> get(const std::string& id) = 0;
  // Warm-pool sandboxes not handed out are never listed (nor found by get()).
  virtual Result<std::vector<control::SandboxRecord>> list(const ListFilter& f) = 0;
  // Stops it; answers the final (stopped) record. Deleting an ended sandbox
  // answers its record; a second destroy while one runs answers the same record
  // with the first request's end reason.
  virtual void destroy(const std::string& id, EndReason reason,
                       std::function<void(Result<control::SandboxRecord>)> cb) = 0;
  // As destroy(), but answers as soon as the stop is durable, before the teardown:
  // its record is stored still running with `reason` as its end reason (a restarted
  // daemon finishes the stop instead of adopting it), and the answer is that record
  // with state "stopping". A sandbox already ended, or still being created, is
  // answered as destroy() answers (its final record).
  virtual void destroy_nowait(const std::string& id, EndReason reason,
                              std::function<void(Result<control::SandboxRecord>)> cb) = 0;

  // Starts a command. Fails at once with kNotFound / kConflict (not running).
  // Returns the exec id, usable with signal_exec().
  virtual Result<uint32_t> exec(const std::string& id, ExecParams p, ExecCallbacks cb) = 0;
  virtual void signal_exec(const std::string& id, uint32_t exec_id, int signo) = 0;
  // An exec started with a window may read `bytes` more of its output.
  virtual void credit_exec(const std::string& id, uint32_t exec_id, uint64_t bytes) = 0;
  // Background processes: they outlive the request that started them (and a
  // restart of the daemon) and keep their output (capped per stream by
  // output_limit) in files until the sandbox ends.
  // start_process answers once the process runs (os_pid set) or has ended without
  // running (e.g. its command was not found), so that the next request finds it in the
  // sandbox; an error (kNotFound, kConflict) at once when it cannot start at all.
  virtual void start_process(const std::string& id, ExecParams p,
                             std::function<void(Result<ProcessInfo>)> cb) = 0;
  virtual Result<std::vector<ProcessInfo>> list_processes(const std::string& id) = 0;
  virtual Result<ProcessInfo> get_process(const std::string& id, uint32_t pid) = 0;
  // Answers once the process exited or after timeout_ms (< 0: no timeout), with its output.
  virtual void wait_process(const std::string& id, uint32_t pid, int64_t timeout_ms,
                            std::function<void(Result<ProcessInfo>)> cb) = 0;
  virtual Result<void> process_stdin(const std::string& id, uint32_t pid, std::string data,
                                     bool eof) = 0;
  // Stdin, paced (AgentClient::write_stdin): `cb` once `data` (at most 1 MiB) is
  // in the stdin of exec `exec_id` (started with stdin_open) or of background
  // process `pid`, so an upload fed piece by piece holds one piece at a time.
  virtual void write_exec_stdin(const std::string& id, uint32_t exec_id, std::string data, bool eof,
                                std::function<void(Result<void>)> cb) = 0;
  virtual void write_process_stdin(const std::string& id, uint32_t pid, std::string data, bool eof,
                                   std::function<void(Result<void>)> cb) = 0;
  virtual Result<void> signal_process(const std::string& id, uint32_t pid, int signo) = 0;

  // Agent of a running sandbox for file operations; marks the sandbox active.
  virtual Result<SandboxRef> ref(const std::string& id) = 0;

  // Pause: every process frozen (its memory pushed out where the host allows);
  // the record says paused. Any request to a paused sandbox (exec, files,
  // processes) resumes it first, transparently. Pausing a paused sandbox, or
  // resuming a running one, answers its record.
  virtual void pause(const std::string& id,
                     std::function<void(Result<control::SandboxRecord>)> cb) = 0;
  virtual void resume(const std::string& id,
                      std::function<void(Result<control::SandboxRecord>)> cb) = 0;
  // Hands out a warm-pool sandbox (made with CreateParams::pooled): from now on it
  // is the client's, with p's labels, env, ttl, idle timeout, job and step.
  // kNotFound when it is no longer in a pool (taken, or gone).
  virtual void claim(const std::string& id, CreateParams p,
                     std::function<void(Result<control::SandboxRecord>)> cb) = 0;
  // Quotas of jobs, asked for every create that names a job. Set before serving.
  virtual void set_admission(Admission a) = 0;
  // The running warm-pool sandboxes not handed out (after a restart: the ones re-adopted).
  virtual std::vector<control::SandboxRecord> pooled() = 0;
  // Whether `id` is one of those: still claimable (a claim refused by the job's
  // admission leaves it so).
  virtual bool claimable(const std::string& id) = 0;

  virtual std::map<std::string, uint64_t> count_by_state() = 0;
  // What a job's live sandboxes hold now (the ones still being created, and the
  // ones being stopped, included), from the node's index by job: O(its sandboxes).
  virtual JobUse job_use(const std::string& job) = 0;
  // Runs fn on the io threads after a delay.
  virtual void after(std::chrono::milliseconds delay, std::function<void()> fn) = 0;
  virtual const std::string& node_name() const = 0;
};

}  // namespace tp::node
