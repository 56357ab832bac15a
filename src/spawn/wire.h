// The spawner's request: one SOCK_SEQPACKET message from the daemon to the
// spawner (spawn/spawner.h), with the descriptors the sandbox child needs attached
// by SCM_RIGHTS. The message holds a header, the ops (spawn/plan.h) with their
// strings as offsets into a string table and their descriptors as slots (indexes
// into the attached descriptors), argv, envp, the seccomp program and the id maps.
// Both ends are built from the same tree (the daemon starts the spawner from its
// own agent binary); the header's magic and version still guard against a stale
// binary.
//
// encode() is the daemon's side; decode() the spawner's: it checks every count,
// offset, kind and slot against the message and the limits below and resolves the
// plan in place (pointers into the message, storage given by the caller), so that a
// malformed request is refused before anything happens. It also refuses any request
// whose clone would not make a new user namespace owned by an id other than host
// root: the spawner never starts a process that is not in a fresh user namespace.
//
// Thread rules: pure functions.
#pragma once

#include <stdint.h>

#include <string>
#include <vector>

#include "spawn/plan.h"

namespace tp::spawn {

inline constexpr uint32_t kMagic = 0x50535054;  // "TPSP"
inline constexpr uint32_t kVersion = 1;
inline constexpr size_t kMaxMessage = 4u << 20;
inline constexpr uint32_t kMaxFds = 250;  // SCM_RIGHTS takes at most 253
inline constexpr uint32_t kMaxOps = 1024;
inline constexpr uint32_t kMaxLimits = 16;
inline constexpr uint32_t kMaxArgs = 64;
inline constexpr uint32_t kMaxEnv = 8192;
inline constexpr uint32_t kMaxSeccomp = 4096;  // BPF_MAXINSNS
inline constexpr uint32_t kNoString = 0xffffffffu;
// Request::flags: the spawner opens the child's /proc/<pid>/oom_score_adj for writing
// (as host root) and hands it over with the release; the child places it at fd 6.
inline constexpr uint32_t kRequestOomFd = 1;
// Namespaces a request may ask for; CLONE_NEWUSER is required.
uint64_t allowed_clone_flags();

// What the daemon asks for. Op::fd holds a slot (index into `fds`) for
// kMoveMount, -1 otherwise; the *_slot fields likewise.
struct Request {
  std::vector<Op> ops, limits;
  std::vector<std::string> argv, envp;
  std::vector<sock_filter> seccomp;
  uint64_t clone_flags = 0;      // CLONE_NEW* flags
  uint32_t owner_uid = 0;        // effective uid for the clone: owner of the user namespace
  std::string uid_map, gid_map;  // written to /proc/<child>/{uid,gid}_map
  uint32_t exec_steps_base = 0;
  int err_slot = -1, agent_slot = -1, listen_slot = -1, cgroup_slot = -1;
  int exe_slot = -1;     // -1: the child continues as the agent (the spawner's binary)
  int log_slot = -1;     // stdout and stderr; -1: /dev/null
  uint32_t flags = 0;    // kRequest* below
  std::vector<int> fds;  // the sender's descriptors, sent in this order

  // The slot of `fd`, added on first use.
  int slot(int fd);
};

// The message bytes (without the descriptors, which go alongside).
std::string encode(const Request& r);

// Storage a decoded request points into (the spawner keeps one, statically).
struct Decoded {
  Op ops[kMaxOps];
  Op limits[kMaxLimits];
  char* argv[kMaxArgs + 1];
  char* envp[kMaxEnv + 1];
  ExecPlan plan;  // fds set from the slots; sync_rd, drop_first and agent_main are the caller's
  uint64_t clone_flags = 0;
  uint32_t owner_uid = 0;
  uint32_t flags = 0;
  const char* uid_map = nullptr;
  const char* gid_map = nullptr;
};

// Checks and resolves `msg` (`len` bytes; it must stay alive and unchanged while
// `out` is used) with `fds` received alongside. On failure returns false with `why`
// set and, when the header named a usable error-pipe slot, `*err_fd` set to it.
bool decode(const char* msg, size_t len, const int* fds, uint32_t nfds, Decoded* out,
            const char** why, int* err_fd);

}  // namespace tp::spawn
