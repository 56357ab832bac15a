#include "runtime/microvm/qmp.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace tp::runtime::microvm {

namespace json = boost::json;
using namespace std::chrono_literals;

Result<Qmp> Qmp::connect(const std::string& path, std::chrono::milliseconds timeout) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof(sa.sun_path))
    return fail(Code::kInvalidArgument, "QMP socket path too long: " + path);
  std::memcpy(sa.sun_path, path.data(), path.size());
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    sys::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) return sys_fail("socket(AF_UNIX) for " + path);
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0)
      return over(std::move(fd),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    // Not there yet (QEMU still starting), or its one client slot is taken.
    if ((errno != ENOENT && errno != ECONNREFUSED && errno != EAGAIN) || Clock::now() > deadline)
      return sys_fail("connect(" + path + ")");
    std::this_thread::sleep_for(2ms);
  }
}

Result<Qmp> Qmp::over(sys::UniqueFd fd, std::chrono::milliseconds timeout) {
  Qmp q(std::move(fd));
  const auto deadline = Clock::now() + timeout;
  auto greeting = q.read_message(deadline);
  if (!greeting) return std::unexpected(greeting.error());
  if (!greeting->contains("QMP")) return fail(Code::kInternal, "QMP: no greeting");
  auto caps = q.execute("qmp_capabilities", {}, -1,
                        std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::max(deadline - Clock::now(), Clock::duration(1ms))));
  if (!caps) return std::unexpected(caps.error());
  return q;
}

Result<void> Qmp::send(const std::string& line, int fd) {
  iovec iov{const_cast<char*>(line.data()), line.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  union {
    cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
  } control{};
  if (fd >= 0) {
    mh.msg_control = control.buf;
    mh.msg_controllen = sizeof control.buf;
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  size_t off = 0;
  while (off < line.size()) {
    iov.iov_base = const_cast<char*>(line.data() + off);
    iov.iov_len = line.size() - off;
    ssize_t n = ::sendmsg(fd_.get(), &mh, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return sys_fail("sendmsg(QMP)");
    off += static_cast<size_t>(n);
    mh.msg_control = nullptr;  // the descriptor goes with the first byte only
    mh.msg_controllen = 0;
  }
  return {};
}

Result<json::object> Qmp::read_message(Clock::time_point deadline) {
  for (;;) {
    size_t nl = buf_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
      boost::system::error_code ec;
      json::value v = json::parse(line, ec);
      if (ec || !v.is_object()) return fail(Code::kInternal, "QMP: malformed message: " + line);
      return std::move(v.as_object());
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return fail(Code::kDeadlineExceeded, "QMP: no answer in time");
    pollfd p{fd_.get(), POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return sys_fail("poll(QMP)");
    if (r == 0) continue;
    char tmp[8192];
    ssize_t n = ::read(fd_.get(), tmp, sizeof tmp);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return sys_fail("read(QMP)");
    if (n == 0) return fail(Code::kUnavailable, "QMP: QEMU closed the connection");
    buf_.append(tmp, static_cast<size_t>(n));
    if (buf_.size() > (16u << 20)) return fail(Code::kInternal, "QMP: message too large");
  }
}

Result<json::value> Qmp::execute(std::string_view command, json::object args, int fd,
                                 std::chrono::milliseconds timeout) {
  json::object req;
  req["execute"] = command;
  if (!args.empty()) req["arguments"] = std::move(args);
  TP_TRY(send(json::serialize(req) + "\n", fd));
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    auto m = read_message(deadline);
    if (!m) {
      Error e = m.error();
      e.context = std::string(command) + ": " + e.context;
      return std::unexpected(e);
    }
    if (m->contains("event")) {
      events_.push_back(std::move(*m));
      continue;
    }
    if (auto* r = m->if_contains("return")) return *r;
    if (auto* e = m->if_contains("error"); e && e->is_object()) {
      auto text = [&](const char* k) -> std::string {
        auto* v = e->as_object().if_contains(k);
        return v && v->is_string() ? std::string(v->as_string()) : std::string();
      };
      return fail(Code::kInternal,
                  "QMP " + std::string(command) + ": " + text("class") + ": " + text("desc"));
    }
    // A message that is neither (e.g. another greeting): skip it.
  }
}

Result<json::object> Qmp::wait_event(std::string_view name, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    for (auto it = events_.begin(); it != events_.end(); ++it) {
      auto* ev = it->if_contains("event");
      if (ev && ev->is_string() && ev->as_string() == name) {
        json::object out = std::move(*it);
        events_.erase(it);
        return out;
      }
    }
    auto m = read_message(deadline);
    if (!m) {
      Error e = m.error();
      e.context = "waiting for QMP event " + std::string(name) + ": " + e.context;
      return std::unexpected(e);
    }
    if (m->contains("event")) events_.push_back(std::move(*m));
  }
}

}  // namespace tp::runtime::microvm
