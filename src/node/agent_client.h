// AgentClient: the node's side of the tp-agent protocol (src/protocol/wire.h).
//
// One AgentClient per sandbox, over the stream fd the backend returned. It
// multiplexes any number of concurrent requests (execs and file operations) on
// that one connection, matching answers to requests by id.
//
// Thread rules: all methods may be called from any thread; internally every
// operation runs on a strand of the given io_context, and every callback is
// invoked on that strand (never inline from the calling thread), exactly once
// for the final callbacks (on_done / result callbacks). When the connection
// closes or fails, every pending request completes with Code::kUnavailable.
// The process must ignore SIGPIPE (tidepoold does): a write to an agent that
// is gone then fails the connection instead of ending the process.
//
// Sessions (src/protocol/README.md): start() sends kHello; every answer of a
// command is acknowledged (kAck) once its handler has returned, so the agent
// keeps what the node has not handled yet and its back-pressure reaches the
// handlers. A session made by connect() lists what the agent still holds
// (resumed()); the answers of those commands wait in the client for attach()
// (up to 10 s after on_ready; then they are dropped and acknowledged). Request
// ids continue above the highest id the agent reported, so issue requests
// only after on_ready on a resumed session.
#pragma once

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace tp::node {

struct ExecRequest {
  std::vector<std::string> argv;  // argv[0] looked up in PATH when it has no '/'
  std::vector<std::string> env;   // "K=V"; empty = the agent's default environment
  std::string cwd = "/";
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint64_t timeout_ms = 0;              // 0 = none
  uint64_t output_limit = 16ull << 20;  // per stream
  std::string stdin_data;               // written to stdin first
  bool stdin_open = false;              // keep stdin open for send_stdin()
  // Opaque to the agent: kept with the command and handed back when a new
  // session resumes (the node's note of what the command is for).
  std::string meta;
  // > 0: the agent reads at most this many output bytes (stdout and stderr
  // together) until credit() grants more, so a consumer that forwards output
  // to a slow client holds a bounded amount. Ignored by an agent that does not
  // announce flow control (kFeatureCredit); a new session lifts it.
  uint64_t window = 0;
  // No kStarted answer (ExecHandlers::on_started unset): exec() sets it.
  bool quiet_start = false;
};

// Bytes to upload, read one piece at a time (a request body spooled to a file).
struct ByteSource {
  uint64_t size = 0;
  // Up to n bytes at off (fewer only at the end). Called on the client's strand.
  std::function<Result<std::string>(uint64_t off, size_t n)> read;
};

// One piece of a file (read_chunk).
struct FileChunk {
  std::string data;
  uint64_t size = 0;  // the file's size (st_size: apparent, holes included) when read
};

// A command the agent still held when a session resumed: running, or ended
// with output or an exit not yet delivered. attach() handlers to it.
struct ResumedCommand {
  uint32_t id = 0;
  std::string meta;
  bool running = true;
  uint32_t pid = 0;  // in the sandbox's pid namespace; 0: it never started (or an older agent)
};

struct ExecResult {
  int64_t exit_code = -1;  // -1 when killed by a signal
  int signal = 0;          // terminating signal, 0 if exited
  uint64_t wall_us = 0;
  uint64_t max_rss_kb = 0;
  bool timed_out = false;
  bool stdout_truncated = false;
  bool stderr_truncated = false;
  uint32_t pid = 0;  // the command's pid in the sandbox (0 if the agent did not say)
};

struct FileEntry {
  std::string name;  // base name
  std::string path;  // absolute path inside the sandbox
  std::string type;  // "file", "dir", "symlink", "other"
  uint64_t size = 0;
  uint32_t mode = 0;  // permission bits
  uint64_t mtime_ns = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::string link_target;  // for symlinks
};

struct ExecHandlers {
  std::function<void(uint32_t pid)> on_started;                      // optional
  std::function<void(int stream, std::string_view data)> on_output;  // 1 stdout, 2 stderr; optional
  std::function<void(Result<ExecResult>)> on_done;                   // required, called once
};

class AgentClient : public std::enable_shared_from_this<AgentClient> {
 public:
  // Takes ownership of a dup() of `fd` (the caller keeps its own fd).
  static std::shared_ptr<AgentClient> create(boost::asio::io_context& io, int fd,
                                             std::string sandbox_id);
  // A new session with the agent of a sandbox a previous daemon run left
  // running, through its per-sandbox socket (runtime SandboxInstance::agent_address).
  // After start()'s on_ready, resumed() lists what the agent still holds.
  static Result<std::shared_ptr<AgentClient>> connect(boost::asio::io_context& io,
                                                      const std::string& address,
                                                      std::string sandbox_id);
  virtual ~AgentClient() = default;

  // Starts reading; on_ready gets Ok once the agent's kReady arrived, or an error
  // (agent died, protocol error). Call once.
  virtual void start(std::function<void(Result<void>)> on_ready) = 0;
  // Called once when the connection ends (after pending requests were failed).
  virtual void set_on_closed(std::function<void(const Error&)> cb) = 0;

  // Starts a command; returns its request id for send_stdin/signal.
  virtual uint32_t exec(const ExecRequest& req, ExecHandlers handlers) = 0;
  virtual void send_stdin(uint32_t exec_id, std::string data, bool eof) = 0;
  virtual void signal(uint32_t exec_id, int signo) = 0;
  // Lets a command started with a window read `bytes` more of its output (the
  // consumer has passed that much on). Ignored for other ids, and when the
  // agent has no flow control.
  virtual void credit(uint32_t exec_id, uint64_t bytes) = 0;

  // Files. Paths are absolute inside the sandbox. write_file moves data in
  // chunks of kMaxChunk (first truncates, then appends) and answers the final size.
  virtual void write_file(std::string path, std::string data, uint32_t mode, bool parents,
                          std::function<void(Result<uint64_t>)> cb) = 0;
  // The same from a source read a chunk at a time: a chunk is read only once the
  // one before it is written, so one chunk is held whatever the size.
  virtual void write_file_from(std::string path, ByteSource src, uint32_t mode, bool parents,
                               std::function<void(Result<uint64_t>)> cb) = 0;
  // Stdin for a running command (started with stdin_open), paced: `cb` runs
  // once the agent wrote `data` into the command's stdin, so a caller that
  // sends the next piece only then holds one piece (at most kMaxChunk each).
  // kConflict when the command's stdin is closed. An agent without
  // kFeatureStdinWrite gets it as send_stdin() and `cb` runs once it is sent.
  virtual void write_stdin(uint32_t exec_id, std::string data, bool eof,
                           std::function<void(Result<void>)> cb) = 0;
  // Reads a whole file, failing with kPayloadTooLarge beyond max_bytes.
  virtual void read_file(std::string path, uint64_t max_bytes,
                         std::function<void(Result<std::string>)> cb) = 0;
  // Reads up to `length` bytes (at most kMaxChunk) at `offset`; fewer at the
  // end of the file. Each call opens the file anew (a streaming reader pulls
  // the next piece only when it has room for it).
  virtual void read_chunk(std::string path, uint64_t offset, uint64_t length,
                          std::function<void(Result<FileChunk>)> cb) = 0;
  virtual void stat(std::string path, std::function<void(Result<FileEntry>)> cb) = 0;
  virtual void list(std::string path, std::function<void(Result<std::vector<FileEntry>>)> cb) = 0;
  virtual void remove(std::string path, bool recursive, std::function<void(Result<void>)> cb) = 0;
  virtual void mkdir(std::string path, uint32_t mode, bool parents,
                     std::function<void(Result<void>)> cb) = 0;
  virtual void ping(std::function<void(Result<void>)> cb) = 0;

  // Commands the agent reported when this session resumed (empty for a new sandbox).
  virtual std::vector<ResumedCommand> resumed() const { return {}; }
  // Handlers for a resumed command: its undelivered output, then its exit, go
  // to them. kNotFound when the id is not a resumed command.
  virtual Result<void> attach(uint32_t exec_id, ExecHandlers handlers) {
    (void)handlers;
    return fail(Code::kNotFound, "command " + std::to_string(exec_id) + " was not resumed");
  }

  // Closes the connection; pending requests complete with kUnavailable. No
  // answer is handed to a handler after close() (nor acknowledged: a command's
  // output and exit not handled yet go to the agent's next session). Called from
  // another thread while a handler of this client runs, close() waits for it to
  // return; called from a handler, the answers read with that one are skipped.
  virtual void close() = 0;
  // Number of requests awaiting an answer (for idle detection and metrics).
  virtual size_t pending() const = 0;
};

}  // namespace tp::node
