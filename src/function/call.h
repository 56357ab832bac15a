// What the function tier runs and what it answers (docs/function-tier.md).
//
// A RunRequest is one program (a language, its source, stdin, extra files, arguments,
// limits). Compiled languages take two steps, compile then run; every step runs in a
// child of its own and ends in a StepResult, the facts the zygote and the child
// reported. The verdict is derived from those facts (verdict_of), never reported by the
// program itself.
//
// Thread rules: plain values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tp::function {

enum class Verdict {
  kOk,            // exited with status 0
  kRuntimeError,  // exited non-zero, killed by a signal, or could not be started
  kTimeLimit,     // still running at its time limit (wall clock)
  kMemoryLimit,   // killed by the out-of-memory killer of its own cgroup
  kOutputLimit,   // wrote more than its stdout, stderr or fetched-files limit
  kCompileError,  // the compile step did not end with ok
};
std::string_view verdict_name(Verdict v);

struct Limits {
  uint64_t timeout_ms = 10'000;          // wall clock
  uint64_t memory_bytes = 512ull << 20;  // the call's own cgroup, no swap
  uint64_t output_bytes = 16ull << 20;   // per stream (stdout, stderr)
  uint32_t pids = 256;                   // tasks (threads count) in the call's cgroup
  uint64_t files_bytes = 64ull << 20;    // fetched files, all together
};

struct File {
  std::string path;  // relative to the call's scratch directory (/tmp)
  std::string data;
  uint32_t mode = 0644;
};

struct RunRequest {
  std::string language;
  std::string source;
  std::string stdin_data;
  std::vector<File> files;
  std::vector<std::string> args;  // after the program's own argv
  std::map<std::string, std::string> env;
  std::vector<std::string> fetch;  // files to return after the run
  Limits limits;
  uint64_t compile_timeout_ms = 10'000;
};

struct StepResult {
  Verdict verdict = Verdict::kOk;
  std::string stdout_data;
  std::string stderr_data;
  std::optional<int64_t> exit_code;  // none when killed by a signal
  int signal = 0;
  uint64_t wall_us = 0;
  uint64_t cpu_us = 0;
  uint64_t peak_memory_bytes = 0;
  bool timed_out = false;
  bool oom_killed = false;
  bool output_limit = false;
  bool stdout_truncated = false;
  bool stderr_truncated = false;
  std::vector<File> files;           // fetched
  std::vector<std::string> missing;  // asked for, not there (or not a regular file)
  std::string error;                 // the child could not start the program (execve ...)
  uint64_t queue_us = 0;             // waiting for a worker slot (the service fills it in)
};

struct RunResult {
  Verdict verdict = Verdict::kOk;
  std::optional<StepResult> compile;  // compiled languages
  bool compile_cached = false;
  std::optional<StepResult> run;  // absent when the compile failed
  uint64_t queue_us = 0;          // waiting for a worker, all steps together
  uint64_t server_us = 0;         // from the request's arrival to its result
};

// The verdict of one step from its facts: time limit, then memory, then output limit,
// then the exit status.
Verdict verdict_of(const StepResult& s);

}  // namespace tp::function
