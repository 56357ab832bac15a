// ExecControl: the credits and the kill an HTTP handler sends to one running
// command (Service::credit_exec, Service::signal_exec), including those it
// wants before it knows the command's id: an exec's first output can arrive
// before Service::exec() has returned that id. Those are held and sent by
// attach(); a kill wanted then wins over credits.
//
// Thread rules: any thread; the functions are called outside the lock.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>

namespace tp::api {

class ExecControl {
 public:
  struct Fns {
    std::function<void(uint32_t exec_id, uint64_t bytes)> credit;
    std::function<void(uint32_t exec_id)> kill;
  };

  explicit ExecControl(Fns fns) : fns_(std::move(fns)) {}

  // The command's id is known: what was wanted before is sent now.
  void attach(uint32_t exec_id);
  // Lets the command send `bytes` more of its output.
  void credit(uint64_t bytes) { send(bytes, false); }
  // Kills the command (SIGKILL).
  void kill() { send(0, true); }

 private:
  void send(uint64_t credit, bool kill);

  const Fns fns_;
  std::mutex mu_;
  std::optional<uint32_t> id_;
  uint64_t owed_credit_ = 0;
  bool kill_wanted_ = false;
};

}  // namespace tp::api
