// The frames between the daemon and a function zygote (zygote/zygote.py), relayed by
// tp-agent as the zygote's stdin and stdout (docs/function-tier.md).
//
// Daemon -> zygote:  u32 type, u32 call, u64 payload_len, u32 meta_len (little-endian),
//                    then meta_len bytes of JSON the zygote reads (limits, never call
//                    data), then payload_len bytes the zygote does not read: it splices
//                    them into a sealed memfd that only the call's child maps.
//   kInit  meta = the zygote's configuration (InitConfig), no payload; first frame
//   kCall  meta = CallMeta; payload = encode_payload(ChildRequest)
//   kKill  stops a call (queued or running); no meta, no payload
//   kQuit  the zygote kills its children and exits
// Zygote -> daemon:  u32 type, u32 call, u64 len, then len bytes.
//   kReady   JSON {pid, cgroup, python}: the zygote is serving (call 0)
//   kStdout, kStderr  bytes the call's child wrote, as they came
//   kFiles   bytes of the call's files stream (parse_files once the call ended)
//   kExit    JSON ExitInfo: the call ended; its last frame
//   kFailed  JSON {message}: the call never ran (cancelled, no worker could start)
//   kLog     JSON {level, message}: the zygote's own diagnostics (call 0)
// The files stream, written by the call's child on its fd 3: records of u8 kind, u32
// name_len, u64 data_len, name, data. kFile (a fetched file), kMissing (name only),
// kStatus (JSON {exit_code, signal, cpu_us}: the program's status, from pid 1, which
// supervises the program, pid 2),
// kError (text: the child could not start the program). It comes from the call's own
// world, so it is parsed strictly and bounded, and can speak only for its own call.
//
// Thread rules: pure functions; a FrameDecoder is used by one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "function/call.h"

namespace tp::function::zygote {

enum class In : uint32_t { kInit = 1, kCall = 2, kKill = 3, kQuit = 4 };
enum class Out : uint32_t {
  kReady = 1,
  kStdout = 2,
  kStderr = 3,
  kFiles = 4,
  kExit = 5,
  kFailed = 6,
  kLog = 7
};

constexpr size_t kInHeader = 20;
constexpr size_t kOutHeader = 16;
// Largest zygote frame the daemon accepts (the zygote splices at most 64 KiB at a time).
constexpr uint64_t kMaxOutFrame = 16ull << 20;

std::string encode_frame(In type, uint32_t call, std::string_view meta, std::string_view payload);

// Limits of one call, the part of a call the zygote reads.
struct CallMeta {
  std::string flavor = "generic";  // "generic" or a prestarted language's name
  uint64_t timeout_ms = 0;
  uint64_t memory_bytes = 0;
  uint64_t pids = 0;
  uint64_t output_bytes = 0;
  uint64_t files_bytes = 0;
};
std::string encode_meta(const CallMeta& m);

// What the call's child reads (its own data: source, files, stdin, argv, env).
struct ChildRequest {
  std::string mode = "exec";  // "exec" or "python"
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  std::string cwd = "/tmp";
  std::vector<File> files;
  std::string stdin_data;
  std::vector<std::string> fetch;
  uint64_t fetch_bytes = 0;
  uint64_t cpu_seconds = 0;  // RLIMIT_CPU backstop; 0 = none
  uint64_t nofile = 1024;
};
// u32 length, JSON {mode, argv, env, cwd, files: [{path, size, mode}], fetch, ...}, the
// files' bytes in order, then stdin (last: the child reads stdin up to the end).
std::string encode_payload(const ChildRequest& r);

// The zygote's configuration (kInit meta).
struct InitConfig {
  std::string seccomp_bpf;  // the classic-BPF program every call runs under
  uint32_t uid_base = 20000;
  uint32_t max_children = 32;
  std::map<std::string, uint32_t> warm;  // flavor -> children kept ready
  uint64_t scratch_bytes = 128ull << 20;
  uint64_t scratch_inodes = 16384;
  uint64_t shm_bytes = 64ull << 20;
  std::string private_dir = "/tmp/.tp-fn";
  std::vector<std::string> preload;
  struct Prestart {
    std::vector<std::string> argv;
    std::map<std::string, std::string> env;
  };
  std::map<std::string, Prestart> prestart;  // flavor -> runtime started before its call
};
std::string encode_init(const InitConfig& c);

// Splits the zygote's stdout into frames. Bytes may arrive in any pieces.
class FrameDecoder {
 public:
  using Sink = std::function<void(Out type, uint32_t call, std::string_view data)>;
  // Feeds bytes; calls sink for every complete frame. An unknown type or an oversized
  // frame is a protocol error: returned, and every later feed fails too.
  Result<void> feed(std::string_view bytes, const Sink& sink);

 private:
  std::string buf_;
  std::optional<Error> broken_;
};

struct ExitInfo {
  std::optional<int64_t> exit_code;
  int signal = 0;
  uint64_t wall_us = 0;
  uint64_t cpu_us = 0;
  uint64_t peak_bytes = 0;
  uint64_t oom_kills = 0;
  bool timed_out = false;
  bool output_limit = false;
};
Result<ExitInfo> parse_exit(std::string_view json);

struct FilesStream {
  std::vector<File> files;
  std::vector<std::string> missing;
  std::optional<int64_t> status_exit_code;  // set with has_status
  int status_signal = 0;
  std::optional<uint64_t> status_cpu_us;  // the program's own CPU time (not pid 1's set-up)
  bool has_status = false;
  std::string error;
};
// Parses a call's files stream; a malformed stream is kInvalidArgument (what came
// before the fault is kept in *partial when given).
Result<FilesStream> parse_files(std::string_view data, FilesStream* partial = nullptr);

// Fills a step's facts from a call's exit, output and files stream.
StepResult step_result(const ExitInfo& exit, std::string out, std::string err, bool out_cut,
                       bool err_cut, const FilesStream& files);

}  // namespace tp::function::zygote
