// tp-agent wire protocol, shared by the agent (inside the sandbox) and the node.
//
// Transport: a byte stream (a unix socketpair for containers; virtio-serial or
// vsock for VMs). The stream carries frames; every frame is:
//
//   u32  length   little-endian: number of bytes after this field (8 + payload)
//   u8   type     MsgType
//   u8   flags    reserved, 0
//   u16  reserved 0
//   u32  id       request id, chosen by the node; every answer echoes it.
//                 0 is used only by the agent's unsolicited kReady.
//   payload       zero or more fields, each: u16 tag, u32 len, len bytes.
//
// Fields are binary-safe (any bytes, including NUL). A tag may repeat (lists:
// argv entries, env entries, directory entries). Unknown tags are ignored by
// both sides, so fields can be added without breaking older peers. Integers in
// fields are u64/i64 little-endian (8 bytes). A frame larger than kMaxFrame is
// a protocol error that closes the connection; bulk data moves in chunks of at
// most kMaxChunk bytes.
//
// Conversations (node -> agent request, agent -> node answers, same id):
//   kExec      -> kStarted, then kOutput* (stdout/stderr chunks in the order the
//                 agent read them), then exactly one kExit; or one kError.
//                 While running, the node may send kStdin (same id) and kSignal.
//   kStdin     -> no answer (DATA; EOF=1 closes the command's stdin)
//   kSignal    -> no answer (SIGNO; delivered to every process of the command)
//   kFileWrite -> kOk (SIZE = bytes now in the file) or kError
//   kFileRead  -> kOk (DATA = up to LENGTH bytes from OFFSET, SIZE = file size) or kError
//   kFileStat  -> kOk (one entry's fields, see below) or kError
//   kFileList  -> kOk (ENTRY repeated; each ENTRY's value is itself a field list) or kError
//   kFileRemove-> kOk or kError
//   kMkdir     -> kOk or kError
//   kPing      -> kOk
//   kCredit    -> no answer (LENGTH more output bytes for a kExec with WINDOW)
//   kConfigure -> no answer (NAME, REALTIME_NS, DATA: a VM clone's own hostname, clock, seed)
// The agent sends kReady (id 0, VERSION, PID, HIGH_ID, SESSION, FEATURES) at the start
// of every session, when it is ready to serve.
// Sessions (README.md): the node's first frame is kHello (EPOCH). Answers of
// kExec carry SEQ and are kept by the agent until kAck (SEQ, cumulative); a
// new connection on the agent's listening socket starts a new session:
// kResumed* (held commands), kReady, then every unacknowledged frame again.
//
// Settled details (README.md in this folder has the full description):
//  - kStarted comes only after execve succeeded; a failure before it (chdir,
//    setresuid, execve ENOENT...) is one kError and no kExit. PID is the
//    command's pid in the agent's pid namespace, which every command shares.
//  - kExit is sent after all of the command's output and after every process
//    of the command is gone: each command has a cgroup of its own (or, where
//    the agent has none, a process group under a subreaper), and when its main
//    process exits (or times out, or gets SIGKILL) the rest of it is killed.
//    Background work must be its own exec.
//  - kStdin/kSignal for an unknown or finished id are ignored. A running id
//    reused by kExec answers kError conflict. An unknown message type answers
//    kError invalid_argument; only a malformed frame closes the connection.
//  - kError MESSAGE names the call and argument without the strerror text
//    ("openat2 /x"); ERRNO carries the errno.
//  - File paths must be absolute (else invalid_argument) and resolve inside
//    the sandbox root; magic links are refused (ELOOP -> invalid_argument).
//    Read/write accept regular files only. kFileRead LENGTH <= kMaxChunk
//    (default kMaxChunk). kFileWrite MODE is also applied to an existing file
//    when given. kFileList entries are sorted by name and carry PATH; a listing
//    that would exceed kMaxFrame fails with payload_too_large.
//
// Thread rules: Encoder, Message and FrameReader are plain values; use one per thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tp::proto {

inline constexpr uint32_t kMaxFrame = 4u << 20;  // 4 MiB, header included
inline constexpr uint32_t kMaxChunk = 1u << 20;  // data per kOutput/kFileWrite/kFileRead frame
inline constexpr size_t kHeaderSize = 12;        // length + type + flags + reserved + id
inline constexpr uint32_t kVersion = 1;

enum class MsgType : uint8_t {
  // node -> agent
  kExec = 1,
  kStdin = 2,
  kSignal = 3,
  kHello = 4,       // first frame of a node's session: EPOCH. No answer.
  kAck = 5,         // SEQ: every held frame up to SEQ was handled. No answer.
  kCredit = 6,      // id = a kExec with WINDOW: LENGTH more output bytes may be read. No answer.
  kStdinWrite = 7,  // EXEC_ID, DATA, EOF: stdin for a command, answered (kOk) once written
                    // into its pipe: a node pacing an upload holds one piece at a time
  // Per-sandbox settings of an agent started from a shared VM template (the microvm
  // tier sends it first on a clone's first session): NAME = hostname, REALTIME_NS =
  // the host's wall clock, DATA = seed for the kernel's random pool. No answer.
  kConfigure = 8,
  kFileWrite = 10,
  kFileRead = 11,
  kFileStat = 12,
  kFileList = 13,
  kFileRemove = 14,
  kMkdir = 15,
  kPing = 20,
  // agent -> node
  kReady = 100,
  kResumed = 104,  // before kReady of a new session, one per held command (id = its id)
  kStarted = 101,
  kOutput = 102,
  kExit = 103,
  kOk = 110,
  kError = 111,
};

enum class Tag : uint16_t {
  // kExec
  kArg = 1,          // repeated, argv[i] (argv[0] is looked up in PATH when it has no '/')
  kEnv = 2,          // repeated, "KEY=VALUE"; replaces the default environment when present
  kCwd = 3,          // string; default "/"
  kUid = 4,          // u64; default 0 (root of the sandbox's user namespace)
  kGid = 5,          // u64; default = uid
  kTimeoutMs = 6,    // u64; 0 = none. On expiry every process of the command is killed.
  kOutputLimit = 7,  // u64; per stream, default 16 MiB. Beyond it output is dropped and
                     //      STDOUT_TRUNCATED / STDERR_TRUNCATED is set in kExit.
  kStdinOpen = 8,    // u64 bool; 1 = stdin stays open for kStdin frames, else it is
                     //      closed right after the initial DATA (if any)
  kMeta = 9,         // bytes, at most kMaxMeta; opaque to the agent, listed back in kResumed
  kWindow = 10,      // u64; >0: at most this many output bytes are read before kCredit
                     //      grants more (flow control to the node's consumer). 0 = none.
  kQuietStart = 11,  // u64 bool; 1 = no kStarted (PID comes with kExit): the node has no
                     //      use for it, and it costs the node a wakeup per command
  // generic
  kData = 20,     // bytes
  kEof = 21,      // u64 bool
  kStream = 22,   // u64: 1 stdout, 2 stderr
  kSigno = 23,    // u64
  kPid = 24,      // u64
  kVersion = 25,  // u64
  kExecId = 26,   // u64: kStdinWrite, the command whose stdin it is
  // kExit
  kExitCode = 30,         // i64; -1 when killed by a signal
  kTermSignal = 31,       // u64; 0 when exited normally
  kWallUs = 32,           // u64 microseconds from start to exit
  kMaxRssKb = 33,         // u64 peak resident set of the command's processes
  kTimedOut = 34,         // u64 bool
  kStdoutTruncated = 35,  // u64 bool
  kStderrTruncated = 36,  // u64 bool
  // files
  kPath = 40,        // string, absolute, resolved inside the sandbox root
  kMode = 41,        // u64 permission bits (default 0644 files, 0755 dirs)
  kOffset = 42,      // u64
  kLength = 43,      // u64
  kAppend = 44,      // u64 bool: append instead of truncate (chunked uploads)
  kParents = 45,     // u64 bool: create missing parent directories (write, mkdir)
  kRecursive = 46,   // u64 bool: remove a directory tree
  kSize = 47,        // u64
  kEntry = 48,       // nested field list (repeated in kFileList answers)
  kName = 49,        // string
  kFileType = 50,    // string: "file", "dir", "symlink", "other"
  kMtimeNs = 51,     // u64 nanoseconds since the epoch
  kLinkTarget = 52,  // string (symlinks)
  kFileUid = 53,     // u64
  kFileGid = 54,     // u64
  // kError
  kErrCode = 60,  // string, a tp::code_name ("not_found", ...)
  kErrno = 61,    // u64
  kMessage = 62,  // string
  // sessions (README.md, "Sessions")
  kSeq = 80,           // u64: on every held frame (answers of kExec); in kAck, cumulative
  kEpoch = 81,         // u64: kHello, the node's session epoch
  kHighId = 82,        // u64: kReady, the highest kExec id the agent has seen
  kRunning = 83,       // u64 bool: kResumed, the command still runs
  kSession = 84,       // u64: kReady, 1 for the agent's first session, then 2, 3...
  kPrevEpoch = 85,     // u64: kReady, EPOCH of the last kHello of an earlier session (0: none)
  kResumedCount = 86,  // u64: kReady, how many kResumed frames preceded it
  kFeatures = 87,      // u64: kReady, bit set of kFeature* this agent understands
  kRealtimeNs = 88,    // u64: kConfigure, CLOCK_REALTIME in nanoseconds since the epoch
};

// kReady FEATURES bits. A node uses a feature only when the agent announced it
// (an agent restored from an older build ignores unknown fields but answers an
// unknown message type with kError, which would end the command it names).
inline constexpr uint64_t kFeatureCredit = 1;      // kExec WINDOW and kCredit
inline constexpr uint64_t kFeatureStdinWrite = 2;  // kStdinWrite

inline constexpr size_t kMaxMeta = 16u << 10;  // kExec META; larger is invalid_argument

// A decoded frame: type, id and its fields in order.
struct Message {
  MsgType type{};
  uint32_t id = 0;
  std::vector<std::pair<Tag, std::string>> fields;

  Message() = default;
  Message(MsgType t, uint32_t i) : type(t), id(i) {}

  // Builders (chainable).
  Message& add(Tag t, std::string_view bytes);
  // Takes `bytes` without copying (bulk data: a file piece).
  Message& add_moved(Tag t, std::string bytes);
  Message& add_u64(Tag t, uint64_t v);
  Message& add_i64(Tag t, int64_t v);
  Message& add_bool(Tag t, bool v) { return add_u64(t, v ? 1 : 0); }

  // Accessors: first occurrence of a tag.
  bool has(Tag t) const;
  std::optional<std::string_view> get(Tag t) const;
  std::string str(Tag t, std::string_view dflt = {}) const;
  uint64_t u64(Tag t, uint64_t dflt = 0) const;
  int64_t i64(Tag t, int64_t dflt = 0) const;
  bool flag(Tag t) const { return u64(t, 0) != 0; }
  // Every occurrence of a tag, in order.
  std::vector<std::string_view> all(Tag t) const;
};

// Serialises one frame (header and payload).
std::string encode(const Message& m);
// Serialises only a field list (for nested kEntry values).
std::string encode_fields(const std::vector<std::pair<Tag, std::string>>& fields);
// Parses a field list; false on malformed input.
bool decode_fields(std::string_view payload, std::vector<std::pair<Tag, std::string>>* out);

// Incremental frame decoder for a byte stream. Feed bytes as they arrive, then
// pop complete messages. After a protocol error (oversized or malformed frame)
// the reader stays failed: the connection must be closed.
class FrameReader {
 public:
  void feed(const char* data, size_t n);
  // Next complete message, if any. Returns nullopt when more bytes are needed or on error.
  std::optional<Message> next();
  bool failed() const { return failed_; }
  const std::string& error() const { return error_; }
  size_t buffered() const { return buf_.size() - pos_; }

 private:
  std::string buf_;
  size_t pos_ = 0;
  bool failed_ = false;
  std::string error_;
};

// Helper for error answers.
Message make_error(uint32_t id, std::string_view code, int sys_errno, std::string_view message);

}  // namespace tp::proto
