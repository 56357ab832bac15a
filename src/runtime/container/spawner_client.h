// The daemon's side of the spawner (spawn/spawner.h): starts it, sends it one
// request per sandbox, follows each start on its error pipe, and replaces a
// spawner that died or stopped answering.
//
// A start (send(), then Start::finish()):
//  - send() makes the request's error pipe, sends the request with its
//    descriptors (the caller closes its own copies after), and returns at once,
//    so the caller can do its share (cgroup limits) while the spawner and the
//    child work. A spawner found dead, or whose socket is gone, is replaced and the
//    request sent again once (nothing of it had happened).
//  - finish() reads the error pipe to EOF (spawn/plan.h lists the records). The
//    child's first record is its pid: the daemon is its parent (CLONE_PARENT) and
//    opens its pidfd at once, so even a spawner that dies halfway leaves nothing
//    unreaped. Success is EOF after the spawner's kStepSpawned with no failure; then
//    the child has finished its setup. On any failure the child is killed and
//    reaped and the error names the step.
//  - A spawner that does not report kStepSpawned within `timeout` is killed and
//    replaced (the start fails with kUnavailable); so is one that closed a request
//    without a word (it died).
// The spawner holds no secret and no descriptor of the daemon's but its socket;
// whatever it was given for a start it closes when that start is done.
//
// Thread rules: send() and finish() may run concurrently from any threads (each
// Start is used by one thread). The spawner serves requests in the order they
// arrive; its own share of a start (clone, maps) is short, the child's setup
// runs in parallel with the next start.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/result.h"
#include "spawn/wire.h"
#include "sys/fd.h"
#include "sys/pidfd.h"

namespace tp::runtime::container {

class Spawner {
 public:
  // Starts `exe_fd` (an O_PATH descriptor of the tp-agent binary at `path`; kept by
  // the caller for the Spawner's lifetime) in spawner mode and waits until it is ready.
  static Result<std::unique_ptr<Spawner>> start(int exe_fd, std::string path,
                                                std::chrono::milliseconds timeout);
  // Closes the socket (the spawner exits at EOF) and reaps every spawner it started.
  ~Spawner();
  Spawner(const Spawner&) = delete;
  Spawner& operator=(const Spawner&) = delete;

  struct Conn;
  class Start {
   public:
    Start(Spawner* owner, std::shared_ptr<Conn> conn, sys::UniqueFd err_rd)
        : owner_(owner), conn_(std::move(conn)), err_rd_(std::move(err_rd)) {}
    // The child's host pid as soon as it reported it (it is still setting up), or 0
    // when the start failed before that (finish() says how).
    pid_t wait_pid();
    // `steps`: the plan's step descriptions. Returns the child's pidfd once its
    // setup is complete.
    Result<sys::Pidfd> finish(const std::vector<std::string>& steps);

   private:
    // Reads the error pipe until EOF, or until the pid is known with `until_pid`.
    void pump(bool until_pid);

    Spawner* owner_;
    std::shared_ptr<Conn> conn_;
    sys::UniqueFd err_rd_;
    bool started_ = false, eof_ = false, spawned_ = false, timed_out_ = false;
    bool has_failed_ = false;
    spawn::ChildFailure failed_{0, 0};
    std::chrono::steady_clock::time_point deadline_{};
    sys::Pidfd child_;
  };

  // Sends `req` (its err_slot is set here). The descriptors in req.fds stay the
  // caller's; it may close them once send() returned.
  Result<Start> send(spawn::Request req);

  pid_t pid();               // of the current spawner, 0 if none is running
  uint64_t started() const;  // spawners started so far (1 + replacements)

 private:
  Spawner(int exe_fd, std::string path, std::chrono::milliseconds timeout)
      : exe_fd_(exe_fd), path_(std::move(path)), timeout_(timeout) {}
  Result<std::shared_ptr<Conn>> current();
  Result<std::shared_ptr<Conn>> launch();
  // Kills `c`'s spawner if it is still the current one; the next send() starts another.
  void replace(const std::shared_ptr<Conn>& c, const char* why);
  void reap_dead(bool block);

  const int exe_fd_;
  const std::string path_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::shared_ptr<Conn> conn_;
  std::vector<sys::Pidfd> dead_;  // killed spawners not reaped yet
  uint64_t started_ = 0;
};

struct Spawner::Conn {
  sys::UniqueFd sock;
  sys::Pidfd proc;
};

}  // namespace tp::runtime::container
