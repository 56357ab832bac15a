// lock_file: an exclusive advisory lock (flock) on a file, held for as long as the
// returned descriptor is open. The kernel drops it when the holder exits, however it
// exits, so a crashed holder never leaves it behind.
//
// tidepoold holds one on <data dir>/tidepoold.lock from before it opens anything there:
// a second daemon started on the same data directory (say `make run` beside a systemd
// unit) then stops with a clear error instead of opening the first one's store and
// step log, re-adopting its sandboxes and killing what it takes for leftovers.
//
// Thread rules: a free function, callable from any thread; the descriptor has one owner
// (sys/fd.h).
#pragma once

#include <string>

#include "common/result.h"
#include "sys/fd.h"

namespace tp::sys {

// Takes the lock on `path` (created 0600 when missing; never through a symlink) and
// writes the caller's pid into the file. When another open of the file holds it: with
// `wait`, blocks until that one lets go (`tidepoold keys` serializes its edits of the
// key file so); without, kConflict at once, naming the pid that its holder wrote there.
// The descriptor is close-on-exec, so no program the caller starts keeps the lock after
// the caller ends.
Result<UniqueFd> lock_file(const std::string& path, bool wait = false);

}  // namespace tp::sys
