// SandboxManager: the node's owner of live sandboxes.
//
// It creates sandboxes through a runtime Backend, connects an AgentClient to
// each, records every sandbox in the Store, enforces TTL and idle timeouts,
// and destroys sandboxes so that nothing of them remains.
//
// Restart policy: sandboxes are NOT re-adopted after a daemon restart (the
// agent's control channel is a socketpair that dies with the daemon). recover()
// marks every record a previous run left live as stopped (end_reason
// "daemon_restart") and has the backend kill and remove everything of them.
//
// Thread rules: every method may be called from any thread. Callbacks run on
// the io_context's threads. Blocking work (clone, destroy) runs on an internal
// thread pool, never on the io threads.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "common/result.h"
#include "control/store.h"
#include "node/agent_client.h"
#include "runtime/backend.h"

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
};

struct ExecParams {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  std::string cwd;  // "" = the image's workdir, else /
  std::optional<uint32_t> uid;  // none = the image's user, else root
  uint64_t timeout_ms = 0;
  uint64_t output_limit = 16ull << 20;
  std::string stdin_data;
  bool stdin_open = false;  // background processes: keep stdin open for process_stdin()
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
// the sandbox (not a Linux pid).
struct ProcessInfo {
  uint32_t pid = 0;
  std::vector<std::string> argv;
  int64_t started_ms = 0;
  bool exited = false;
  std::optional<ExecOutcome> outcome;  // set once exited normally
  std::optional<Error> error;          // set once it failed (e.g. the sandbox ended)
  std::string out, err;                // output so far (wait_process only)
};

// An image resolved to what the runtime needs. `pin` keeps the image's layers
// from being garbage-collected while a sandbox uses them (released at its end).
struct ResolvedImage {
  std::vector<std::string> layers;  // lower directories, top first
  std::map<std::string, std::string> env;  // image defaults, under the sandbox's env
  std::string workdir;                     // default cwd of commands ("" = /)
  std::shared_ptr<void> pin;
  uint32_t uid = 0;                        // default user of commands
  uint32_t gid = 0;
};
// Resolves an image reference ("name:version", ...). Called on a blocking thread.
using ImageResolver = std::function<Result<ResolvedImage>(const std::string& image)>;

// A live sandbox as the API sees it for file operations.
struct SandboxRef {
  std::shared_ptr<AgentClient> agent;
  uint64_t disk_bytes = 0;
};

class SandboxManager {
 public:
  SandboxManager(boost::asio::io_context& io, std::unique_ptr<runtime::Backend> backend,
                 control::Store& store, Metrics& metrics, std::string node_name);
  ~SandboxManager();

  // Cleans up what a previous run left behind; call once before serving.
  Result<void> recover();
  // Starts the TTL / idle timer.
  void start();
  // Destroys every live sandbox (end_reason "daemon_shutdown") and stops the timer. Blocks.
  void shutdown();

  void create(CreateParams p, std::function<void(Result<control::SandboxRecord>)> cb);
  Result<control::SandboxRecord> get(const std::string& id);
  // labels: all must match; state: empty = any; all: include ended sandboxes.
  Result<std::vector<control::SandboxRecord>> list(const std::map<std::string, std::string>& labels,
                                                   const std::string& state, bool all);
  void destroy(const std::string& id, std::string reason,
               std::function<void(Result<control::SandboxRecord>)> cb);

  // Starts a command. Fails at once with kNotFound / kConflict (not running).
  // Returns the exec id, usable with signal_exec().
  Result<uint32_t> exec(const std::string& id, ExecParams p, ExecCallbacks cb);
  void signal_exec(const std::string& id, uint32_t exec_id, int signo);
  // Background processes: they outlive the request that started them and keep
  // their output (capped per stream by output_limit) until the sandbox ends.
  Result<ProcessInfo> start_process(const std::string& id, ExecParams p);
  Result<std::vector<ProcessInfo>> list_processes(const std::string& id);
  Result<ProcessInfo> get_process(const std::string& id, uint32_t pid);
  // Answers once the process exited or after timeout_ms (< 0: no timeout), with its output.
  void wait_process(const std::string& id, uint32_t pid, int64_t timeout_ms,
                    std::function<void(Result<ProcessInfo>)> cb);
  Result<void> process_stdin(const std::string& id, uint32_t pid, std::string data, bool eof);
  Result<void> signal_process(const std::string& id, uint32_t pid, int signo);

  // Agent of a running sandbox for file operations; marks the sandbox active.
  Result<SandboxRef> ref(const std::string& id);

  std::map<std::string, uint64_t> count_by_state();
  // Runs fn on the io threads after a delay.
  void after(std::chrono::milliseconds delay, std::function<void()> fn);
  // Images other than "host" are resolved through this; set before serving.
  void set_image_resolver(ImageResolver r) { resolver_ = std::move(r); }
  const std::string& node_name() const { return node_; }

 private:
  struct Live;
  struct BgProc;
  std::shared_ptr<Live> find_live(const std::string& id);
  Result<std::shared_ptr<BgProc>> find_proc(const std::string& id, uint32_t pid);
  Error not_live_error(const std::string& id);
  void finish_create(std::shared_ptr<Live> live, std::function<void(Result<control::SandboxRecord>)> cb,
                     int64_t start_us);
  void teardown(std::shared_ptr<Live> live, std::string reason,
                std::function<void(Result<control::SandboxRecord>)> cb);
  void on_tick();
  void persist(const control::SandboxRecord& r);

  boost::asio::io_context& io_;
  ImageResolver resolver_;
  std::unique_ptr<runtime::Backend> backend_;
  control::Store& store_;
  Metrics& metrics_;
  std::string node_;
  boost::asio::thread_pool blocking_{2};
  boost::asio::steady_timer timer_;

  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Live>> live_;
  bool stopping_ = false;
};

// Milliseconds since the Unix epoch.
int64_t now_ms();

}  // namespace tp::node
