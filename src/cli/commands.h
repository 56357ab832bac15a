// Internal to the CLI: what the subcommand files share.
//
// Each cmd_*.cpp registers one subcommand on the root CLI11 app and returns the action
// to run when that subcommand was chosen. Flags are parsed by CLI11 first; an action
// then validates values (usage errors, exit 2) before it talks to the daemon.
// Thread rules: everything here runs on the main thread.
#pragma once

#include <CLI/CLI.hpp>
#include <boost/json/object.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/http_client.h"
#include "common/result.h"

namespace tp::cli {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitTimedOut = 124;  // as coreutils timeout(1)
constexpr int kExitSignalBase = 128;
constexpr const char* kDefaultUrl = "http://127.0.0.1:7070";
constexpr const char* kDefaultSocket = "/run/tidepool/tidepool.sock";

// Where the daemon is and a lazily opened connection to it.
class Context {
 public:
  std::string url_flag;      // --url, empty when not given
  std::string api_key_flag;  // --api-key, empty when not given

  // --url, else TIDEPOOL_URL, else the unix socket ($TIDEPOOL_SOCKET or the default
  // path) when it exists, else the default TCP URL.
  std::string url_text() const;
  // --api-key, else TIDEPOOL_API_KEY, else "".
  std::string api_key() const;
  // The shared client (one keep-alive connection for the whole command).
  Result<HttpClient*> client();
  // A client of its own (a second connection), e.g. for a stream that may be cut.
  Result<std::unique_ptr<HttpClient>> new_client() const;

 private:
  std::unique_ptr<HttpClient> client_;
};

// Prints "tidepool: <message>" on stderr; returns kExitError.
int report(const Error& e);
// Prints "tidepool: <message>" on stderr; returns kExitUsage.
int usage_error(const std::string& message);

// Writes all bytes to fd (retrying short writes and EINTR). False on failure (EPIPE...).
bool write_all(int fd, std::string_view data);

// A string field of a JSON object ("" when absent or not a string).
std::string json_string(const boost::json::object& o, std::string_view key);
// A number field of a JSON object as an integer (nullopt when absent or not a number).
std::optional<int64_t> json_int(const boost::json::object& o, std::string_view key);

// Prints rows as columns two spaces apart, each as wide as its widest cell.
void print_table(const std::vector<std::vector<std::string>>& rows);
// The same as text, one '\n'-terminated line per row.
std::string format_table(const std::vector<std::vector<std::string>>& rows);

// Reads a whole fd (stdin, a file) into memory.
Result<std::string> read_all(int fd, const std::string& what);
// Reads a whole file; the error names the path.
Result<std::string> read_file(const std::string& path);
// A string field of a JSON object, "" when absent or not a string.
std::string str_of(const boost::json::object& o, std::string_view key);

using Action = std::function<int()>;

Action add_create(CLI::App& root, Context& ctx);
Action add_run(CLI::App& root, Context& ctx);
Action add_exec(CLI::App& root, Context& ctx);
Action add_cp(CLI::App& root, Context& ctx);
Action add_ls(CLI::App& root, Context& ctx);
Action add_rm(CLI::App& root, Context& ctx);
Action add_version(CLI::App& root, Context& ctx);
Action add_image(CLI::App& root, Context& ctx);      // cmd_image.cpp
Action add_log(CLI::App& root, Context& ctx);        // cmd_log.cpp
Action add_replay(CLI::App& root, Context& ctx);     // cmd_replay.cpp
Action add_image(CLI::App& root, Context& ctx);      // cmd_image.cpp
Action add_fn(CLI::App& root, Context& ctx);         // cmd_fn.cpp
Action add_templates(CLI::App& root, Context& ctx);  // cmd_templates.cpp
Action add_pools(CLI::App& root, Context& ctx);      // cmd_templates.cpp
Action add_jobs(CLI::App& root, Context& ctx);       // cmd_jobs.cpp
Action add_pause(CLI::App& root, Context& ctx);      // cmd_pause.cpp
Action add_resume(CLI::App& root, Context& ctx);     // cmd_pause.cpp
Action add_top(CLI::App& root, Context& ctx);        // cmd_top.cpp

// Flags that describe a new sandbox, shared by `create` and `run` (and, without the
// placement flags --template/--job/--step, by `templates create|replace`).
struct CreateFlags {
  std::string image;
  std::string tier;
  std::string memory;
  std::string cpus;
  std::string disk;
  std::string ttl;
  std::string idle_timeout;
  std::optional<int64_t> pids;
  std::vector<std::string> labels;
  std::vector<std::string> env;
  std::string priority;       // normal | best-effort
  std::string template_name;  // --template: its fields fill in what is not given
  std::string job;            // --job: the job it belongs to (its quotas apply)
  std::string step;           // --step: a tag within the job (needs --job)

  // placement: also --template, --job and --step (not for a template itself).
  void add_to(CLI::App* app, bool placement = true);
  // The CreateSandbox body; only the fields the user gave (the daemon fills defaults).
  // Errors are invalid_argument with a message naming the flag.
  Result<boost::json::object> to_request() const;
};

// Flags of one command execution, shared by `exec` and `run`.
struct ExecFlags {
  std::string timeout;
  std::vector<std::string> env;  // `run` passes the sandbox's --env here too
  std::string cwd;
  std::optional<int64_t> user;
  bool forward_stdin = false;
  std::vector<std::string> cmd;

  // with_env: false for `run`, whose --env is registered by CreateFlags.
  void add_to(CLI::App* app, bool with_env);
  // The ExecRequest body with "stream": true (stdin is read here when -i was given).
  Result<boost::json::object> to_request() const;
};

// Runs a command with a streamed answer, copying its stdout and stderr to this process's
// fds 1 and 2 as the pieces arrive. Returns the exit code this process should use
// (see exit_status_for), or an error (daemon unreachable, exec refused, stream broken).
// `removed`, when given, is set when an exec that asked for "remove" ends with a
// "removed" event that reports the sandbox's stop made (not an error).
Result<int> stream_exec(HttpClient& client, const std::string& id,
                        const boost::json::object& request, bool* removed = nullptr);

// Maps a command's end to this process's exit code: 124 when timed out, 128+signal when
// killed by a signal, else the exit code (1 if it is out of range).
int exit_status_for(int64_t exit_code, int64_t signal, bool timed_out);

// Target path of a sandbox, e.g. "/v1/sandboxes/<id>" (the id is URL-encoded).
std::string sandbox_path(const std::string& id);

}  // namespace tp::cli
