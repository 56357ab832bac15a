// The QMP client (qmp.h) against a scripted QEMU on the other end of a socketpair:
// greeting and capabilities, answers with events in between, errors, a closed
// socket, deadlines, and a descriptor sent with a command.
#include "runtime/microvm/qmp.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <thread>

namespace tp::runtime::microvm {
namespace {

using namespace std::chrono_literals;

// The QEMU side: reads one line per expected command and writes the scripted replies.
struct FakeQemu {
  int fd;
  std::string buf;
  std::string read_line() {
    for (;;) {
      size_t nl = buf.find('\n');
      if (nl != std::string::npos) {
        std::string l = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        return l;
      }
      char tmp[512];
      ssize_t n = ::read(fd, tmp, sizeof tmp);
      if (n <= 0) return {};
      buf.append(tmp, static_cast<size_t>(n));
    }
  }
  void write(const std::string& s) {
    ASSERT_EQ(::write(fd, s.data(), s.size()), static_cast<ssize_t>(s.size()));
  }
};

class QmpTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv_), 0); }
  void TearDown() override {
    if (qemu_.joinable()) qemu_.join();
    if (sv_[1] >= 0) ::close(sv_[1]);
  }
  // Runs `script` as QEMU after the greeting and the capabilities exchange.
  Result<Qmp> start(std::function<void(FakeQemu&)> script) {
    qemu_ = std::thread([this, script] {
      FakeQemu q{sv_[1], {}};
      q.write(R"({"QMP": {"version": {"qemu": {"major": 7}}, "capabilities": []}})"
              "\r\n");
      EXPECT_NE(q.read_line().find("qmp_capabilities"), std::string::npos);
      q.write("{\"return\": {}}\r\n");
      if (script) script(q);
    });
    return Qmp::over(sys::UniqueFd(sv_[0]), 2s);
  }
  int sv_[2] = {-1, -1};
  std::thread qemu_;
};

TEST_F(QmpTest, AnswersAndEventsInBetween) {
  auto qmp = start([](FakeQemu& q) {
    EXPECT_NE(q.read_line().find(R"("execute":"query-status")"), std::string::npos);
    q.write(R"({"event": "VSERPORT_CHANGE", "data": {"id": "agentport", "open": true}})"
            "\r\n");
    q.write(R"({"return": {"status": "running", "running": true}})"
            "\r\n");
  });
  ASSERT_TRUE(qmp.has_value()) << qmp.error().message();
  auto r = qmp->execute("query-status");
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_EQ(r->as_object().at("status").as_string(), "running");
  ASSERT_EQ(qmp->events().size(), 1u);
  auto ev = qmp->wait_event("VSERPORT_CHANGE", 10ms);
  ASSERT_TRUE(ev.has_value());
  EXPECT_TRUE(ev->at("data").as_object().at("open").as_bool());
  EXPECT_TRUE(qmp->events().empty());
}

TEST_F(QmpTest, ArgumentsAreSent) {
  auto qmp = start([](FakeQemu& q) {
    std::string l = q.read_line();
    EXPECT_NE(l.find(R"("arguments":{"uri":"fd:4"})"), std::string::npos) << l;
    q.write("{\"return\": {}}\n");
  });
  ASSERT_TRUE(qmp.has_value());
  EXPECT_TRUE(qmp->execute("migrate-incoming", {{"uri", "fd:4"}}).has_value());
}

TEST_F(QmpTest, AnErrorAnswerIsAnError) {
  auto qmp = start([](FakeQemu& q) {
    q.read_line();
    q.write(R"({"error": {"class": "GenericError", "desc": "no such device"}})"
            "\n");
  });
  ASSERT_TRUE(qmp.has_value());
  auto r = qmp->execute("device_del");
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().context.find("GenericError: no such device"), std::string::npos);
}

TEST_F(QmpTest, ClosedSocketIsUnavailableAndSilenceTimesOut) {
  auto qmp = start([this](FakeQemu& q) {
    q.read_line();  // the first command: no answer in time
    q.read_line();  // the second: QEMU exits
    ::close(sv_[1]);
    sv_[1] = -1;
  });
  ASSERT_TRUE(qmp.has_value());
  auto slow = qmp->execute("query-status", {}, -1, 50ms);
  ASSERT_FALSE(slow.has_value());
  EXPECT_EQ(slow.error().code, Code::kDeadlineExceeded);
  auto gone = qmp->execute("query-status");
  ASSERT_FALSE(gone.has_value());
  EXPECT_EQ(gone.error().code, Code::kUnavailable);
}

TEST_F(QmpTest, ADescriptorTravelsWithTheCommand) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  auto qmp = start([](FakeQemu& q) {
    char data[256];
    union {
      cmsghdr align;
      char buf[CMSG_SPACE(sizeof(int))];
    } control{};
    iovec iov{data, sizeof data};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control.buf;
    mh.msg_controllen = sizeof control.buf;
    ssize_t n = ::recvmsg(q.fd, &mh, 0);
    ASSERT_GT(n, 0);
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    ASSERT_NE(c, nullptr);
    ASSERT_EQ(c->cmsg_type, SCM_RIGHTS);
    int got;
    std::memcpy(&got, CMSG_DATA(c), sizeof got);
    EXPECT_EQ(::write(got, "x", 1), 1);
    ::close(got);
    q.buf.assign(data, static_cast<size_t>(n));
    EXPECT_NE(q.read_line().find("getfd"), std::string::npos);
    q.write("{\"return\": {}}\n");
  });
  ASSERT_TRUE(qmp.has_value());
  EXPECT_TRUE(qmp->execute("getfd", {{"fdname", "state"}}, p[1]).has_value());
  char c = 0;
  EXPECT_EQ(::read(p[0], &c, 1), 1);
  EXPECT_EQ(c, 'x');
  ::close(p[0]);
  ::close(p[1]);
}

TEST(Qmp, ConnectGivesUpWhenNoSocketAppears) {
  auto r = Qmp::connect("/nonexistent-dir/qmp.sock", 20ms);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().sys_errno, ENOENT);
}

}  // namespace
}  // namespace tp::runtime::microvm
