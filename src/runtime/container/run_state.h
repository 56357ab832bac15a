// Live restore's host side of a sandbox (docs/architecture.md, "Live restore"):
// the agent's listening socket, where a restarted daemon connects again, and the
// identity of the sandbox's init (host pid and start time, field 22 of
// /proc/<pid>/stat), so that a later daemon run adopts that process and not one
// that reused its pid.
//
// Layout, in one root-only directory (ContainerOptions::run_dir):
//   <id>.sock   the socket (bound by the daemon, its fd passed to the agent: the
//               sandbox cannot reach the path), with the init's identity in its
//               extended attribute trusted.tidepool.init ("pid <pid> starttime <t>");
//   <id>.state  the same text, only where the file system takes no trusted xattrs.
// One inode per sandbox: on a busy file system each inode made and removed per
// sandbox was a measurable share of a create (ext4 without a journal scans past
// recently deleted inodes on every allocation).
// Sandboxes made by earlier versions have <id>/agent.sock and <id>/state, and may
// sit in another directory (the data dir's containers/run, before the run dir
// could move to a tmpfs): find(), remove() and ids() know that layout and those
// directories too, so such sandboxes are adopted and cleaned up as well.
//
// Thread rules: calls for different ids may run concurrently; one id is used by
// one thread at a time (its sandbox's).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "sys/fd.h"

namespace tp::runtime::container {

class RunState {
 public:
  // `dir`: where new sandboxes go; `earlier`: directories earlier runs may have used.
  explicit RunState(std::string dir, std::vector<std::string> earlier = {})
      : dir_(std::move(dir)), earlier_(std::move(earlier)) {}
  const std::string& dir() const { return dir_; }

  std::string socket_path(const std::string& id) const { return dir_ + "/" + id + ".sock"; }
  // Binds <id>.sock afresh (anything left of an earlier sandbox with this id goes
  // first) and listens; the fd.
  Result<sys::UniqueFd> make_socket(const std::string& id) const;
  // Records `pid` (and its start time) as the init of `id`.
  Result<void> record(const std::string& id, pid_t pid) const;

  struct Found {
    std::string socket;  // where the agent listens
    pid_t pid = 0;
    uint64_t start = 0;
  };
  // The socket and init of `id`, in either layout; kNotFound if there is none.
  Result<Found> find(const std::string& id) const;
  // Removes everything of `id`, in either layout. Idempotent.
  void remove(const std::string& id) const;
  // Ids with anything in the directories.
  std::vector<std::string> ids() const;

 private:
  Result<Found> find_in(const std::string& dir, const std::string& id) const;

  std::string dir_;
  std::vector<std::string> earlier_;
  // Whether dir_ takes the trusted xattr (-1: not known yet): remove() skips the
  // .state files where it does.
  mutable std::atomic<int> xattrs_{-1};
};

}  // namespace tp::runtime::container
