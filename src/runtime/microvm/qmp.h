// A blocking client of QEMU's machine protocol (QMP) over a unix socket.
//
// connect() reads QEMU's greeting and leaves capabilities negotiation done;
// execute() sends one command and returns its "return" value (an "error"
// answer is kInternal with QEMU's class and description). Events that arrive
// meanwhile are kept, in order, for wait_event(). A descriptor can ride along
// with a command (SCM_RIGHTS, for "getfd"). Every wait has a deadline; a
// closed socket (QEMU exited) is kUnavailable. QEMU serves one QMP client per
// socket at a time: hold a client only while talking.
//
// Thread rules: one thread at a time per client.
#pragma once

#include <boost/json.hpp>
#include <chrono>
#include <deque>
#include <string>
#include <string_view>

#include "common/result.h"
#include "sys/fd.h"

namespace tp::runtime::microvm {

class Qmp {
 public:
  // Connects to the socket at `path` (retrying while QEMU has not created it
  // yet, until `timeout`), reads the greeting and negotiates capabilities.
  static Result<Qmp> connect(const std::string& path, std::chrono::milliseconds timeout);
  // Uses an already connected stream (tests); does the greeting as connect() does.
  static Result<Qmp> over(sys::UniqueFd fd, std::chrono::milliseconds timeout);

  Result<boost::json::value> execute(std::string_view command, boost::json::object args = {},
                                     int fd = -1,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // The next event named `name` (kept or arriving), removed from the queue.
  Result<boost::json::object> wait_event(std::string_view name, std::chrono::milliseconds timeout);
  // Events received so far and not yet taken.
  const std::deque<boost::json::object>& events() const { return events_; }

 private:
  explicit Qmp(sys::UniqueFd fd) : fd_(std::move(fd)) {}
  using Clock = std::chrono::steady_clock;
  // One message (a JSON object per line) before `deadline`.
  Result<boost::json::object> read_message(Clock::time_point deadline);
  Result<void> send(const std::string& line, int fd);

  sys::UniqueFd fd_;
  std::string buf_;
  std::deque<boost::json::object> events_;
};

}  // namespace tp::runtime::microvm
