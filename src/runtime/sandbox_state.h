// What a backend keeps on the host so that a restarted daemon adopts the right
// process (live restore): a `state` file in the sandbox's root-only run
// directory naming its init's (or QEMU's) host pid and start time (field 22
// of /proc/<pid>/stat), so that a pid reused by another process is not taken
// for the sandbox's. Shared by the container and microvm backends.
//
// Thread rules: plain functions, safe from any thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "common/result.h"
#include "sys/pidfd.h"

namespace tp::runtime {

// A sandbox id usable as a host file name and hostname: [A-Za-z0-9_-]{1,63}.
bool valid_sandbox_name(const std::string& id);

// Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); 0 if unreadable.
uint64_t proc_start_time(pid_t pid);

struct SavedState {
  pid_t pid = 0;
  uint64_t start = 0;
};

// Writes <dir>/state atomically: "pid <pid>\nstarttime <ticks>\n".
Result<void> write_state(const std::string& dir, pid_t pid);
// kNotFound when missing or malformed.
Result<SavedState> read_state(const std::string& dir);
// A pidfd of the process `st` names, if it still is that process (kNotFound otherwise).
Result<sys::Pidfd> open_saved(const SavedState& st);

}  // namespace tp::runtime
