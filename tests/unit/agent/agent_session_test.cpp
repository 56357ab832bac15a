// Sessions of the real agent (--listen-fd): the control stream ends while
// commands run, a node connects again through the listening socket and gets
// every unacknowledged answer exactly once; unacknowledged output stops a
// command; a new connection replaces a live one; a node that never comes
// back makes the agent exit. Spoken in raw frames, so that acks are exact.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <cstdio>

#include "agent_harness.h"
#include "protocol/wire.h"

namespace tp::agent_test {
namespace {

using proto::Message;
using proto::MsgType;
using proto::Tag;

// One raw connection to the agent.
class Raw {
 public:
  explicit Raw(int fd) : fd_(fd) {}
  ~Raw() { close(); }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;

  static std::unique_ptr<Raw> connect(const std::string& path) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path.c_str());
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
      if (fd >= 0) ::close(fd);
      return nullptr;
    }
    return std::make_unique<Raw>(fd);
  }

  void send(const Message& m) {
    std::string b = proto::encode(m);
    ASSERT_EQ(::write(fd_, b.data(), b.size()), static_cast<ssize_t>(b.size()));
  }
  void send_raw(const std::string& b) {
    ASSERT_EQ(::write(fd_, b.data(), b.size()), static_cast<ssize_t>(b.size()));
  }
  void hello(uint64_t epoch) { send(Message(MsgType::kHello, 0).add_u64(Tag::kEpoch, epoch)); }
  void ack(uint64_t seq) { send(Message(MsgType::kAck, 0).add_u64(Tag::kSeq, seq)); }

  // The next frame; nullopt at EOF, or when nothing came for `quiet_ms` (-1:
  // wait as long as it takes; the test's own timeout ends a hang).
  std::optional<Message> next(int quiet_ms = -1) {
    for (;;) {
      if (auto m = reader_.next()) return m;
      if (reader_.failed()) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      int n = ::poll(&p, 1, quiet_ms);
      if (n == 0) return std::nullopt;
      if (n < 0 && errno == EINTR) continue;
      char buf[65536];
      ssize_t r = ::read(fd_, buf, sizeof(buf));
      if (r <= 0) {
        eof_ = true;
        return std::nullopt;
      }
      reader_.feed(buf, static_cast<size_t>(r));
    }
  }
  bool eof() const { return eof_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
  proto::FrameReader reader_;
  bool eof_ = false;
};

Message exec_msg(uint32_t id, const std::string& script, const std::string& meta,
                 bool stdin_open = false) {
  Message m(MsgType::kExec, id);
  m.add(Tag::kArg, "sh").add(Tag::kArg, "-c").add(Tag::kArg, script);
  m.add(Tag::kMeta, meta);
  m.add_bool(Tag::kStdinOpen, stdin_open);
  return m;
}

std::string seq_output(int n) {
  std::string s;
  for (int i = 1; i <= n; ++i) s += std::to_string(i) + "\n";
  return s;
}

class AgentSessionTest : public AgentTestBase {
 protected:
  void start_raw(AgentOptions o = {}) {
    o.listen = true;
    agent_ = std::make_unique<AgentProcess>(root_.path(), o);
    ASSERT_GE(agent_->fd(), 0);
    ASSERT_FALSE(agent_->socket_path().empty());
    // The harness's socketpair end, spoken raw (the Raw does not own it).
    first_ = std::make_unique<Raw>(::dup(agent_->fd()));
    agent_->close_fd();
    auto ready = first_->next();
    ASSERT_TRUE(ready);
    ASSERT_EQ(ready->type, MsgType::kReady);
    EXPECT_EQ(ready->u64(Tag::kSession), 1u);
    EXPECT_EQ(ready->u64(Tag::kResumedCount), 0u);
  }
  std::unique_ptr<Raw> first_;
};

// Reads answers of `id` until its kExit, acking each; appends output.
Message drain_to_exit(Raw& r, uint32_t id, std::string* out, uint64_t* last_seq) {
  for (;;) {
    auto m = r.next();
    if (!m) return Message(MsgType::kError, 0);
    if (m->id != id) continue;
    uint64_t seq = m->u64(Tag::kSeq);
    EXPECT_GT(seq, *last_seq) << "SEQ goes up";
    *last_seq = seq;
    r.ack(seq);
    if (m->type == MsgType::kOutput) out->append(m->get(Tag::kData).value_or(""));
    if (m->type == MsgType::kExit || m->type == MsgType::kError) return *m;
  }
}

TEST_F(AgentSessionTest, ReconnectGetsEveryByteExactlyOnce) {
  ASSERT_NO_FATAL_FAILURE(start_raw());
  const int n = 100000;  // ~590 KB: more than the agent holds unacknowledged
  const std::string want = seq_output(n);
  first_->hello(7);
  first_->send(exec_msg(5, "seq 1 " + std::to_string(n), "meta-5"));
  // Take some output; acknowledge only part of it, then go away.
  std::string got;
  uint64_t acked = 0;
  size_t seen = 0;
  uint64_t pid = 0;
  while (seen < 100000) {
    auto m = first_->next();
    ASSERT_TRUE(m);
    ASSERT_EQ(m->id, 5u);
    uint64_t seq = m->u64(Tag::kSeq);
    ASSERT_GT(seq, 0u);
    if (m->type == MsgType::kStarted) pid = m->u64(Tag::kPid);
    if (m->type == MsgType::kOutput) {
      seen += m->get(Tag::kData)->size();
      if (got.size() < 50000) {  // acknowledged: must not come again
        got.append(*m->get(Tag::kData));
        acked = seq;
      }
    }
  }
  ASSERT_GT(acked, 0u);
  first_->ack(acked);
  // A ping answered means the ack was read before the end of the stream.
  first_->send(Message(MsgType::kPing, 99));
  for (;;) {
    auto m = first_->next();
    ASSERT_TRUE(m);
    if (m->type == MsgType::kOk && m->id == 99) break;
  }
  first_->close();

  auto second = Raw::connect(agent_->socket_path());
  ASSERT_TRUE(second);
  auto listed = second->next();
  ASSERT_TRUE(listed);
  ASSERT_EQ(listed->type, MsgType::kResumed);
  EXPECT_EQ(listed->id, 5u);
  EXPECT_EQ(listed->str(Tag::kMeta), "meta-5");
  ASSERT_GT(pid, 0u);
  EXPECT_EQ(listed->u64(Tag::kPid), pid);  // the resumed command's pid, as kStarted said
  auto ready = second->next();
  ASSERT_TRUE(ready);
  ASSERT_EQ(ready->type, MsgType::kReady);
  EXPECT_EQ(ready->u64(Tag::kSession), 2u);
  EXPECT_EQ(ready->u64(Tag::kPrevEpoch), 7u);
  EXPECT_EQ(ready->u64(Tag::kHighId), 5u);
  EXPECT_EQ(ready->u64(Tag::kResumedCount), 1u);
  second->hello(8);
  // The replay starts right after the acknowledged frame.
  auto first_replayed = second->next();
  ASSERT_TRUE(first_replayed);
  EXPECT_EQ(first_replayed->u64(Tag::kSeq), acked + 1);
  ASSERT_EQ(first_replayed->type, MsgType::kOutput);
  got.append(*first_replayed->get(Tag::kData));
  uint64_t last = acked + 1;
  second->ack(last);
  Message exit = drain_to_exit(*second, 5, &got, &last);
  ASSERT_EQ(exit.type, MsgType::kExit);
  EXPECT_EQ(exit.i64(Tag::kExitCode, -1), 0);
  EXPECT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want) << "output differs";
  // Everything acknowledged: a third session lists nothing.
  second->send(Message(MsgType::kPing, 100));
  for (;;) {
    auto m = second->next();
    ASSERT_TRUE(m);
    if (m->type == MsgType::kOk && m->id == 100) break;
  }
  auto third = Raw::connect(agent_->socket_path());
  ASSERT_TRUE(third);
  auto r3 = third->next();
  ASSERT_TRUE(r3);
  ASSERT_EQ(r3->type, MsgType::kReady);
  EXPECT_EQ(r3->u64(Tag::kResumedCount), 0u);
  EXPECT_EQ(r3->u64(Tag::kSession), 3u);
  // The replaced session was closed by the agent.
  second->next(-1);
  EXPECT_TRUE(second->eof());
}

TEST_F(AgentSessionTest, UnacknowledgedOutputStopsTheCommandUntilAcks) {
  ASSERT_NO_FATAL_FAILURE(start_raw());
  const int n = 200000;  // ~1.3 MB, far beyond the agent's cap and the pipe
  const std::string want = seq_output(n);
  const std::string marker = host_path("/done");
  first_->hello(1);
  first_->send(exec_msg(3, "seq 1 " + std::to_string(n) + " && : > " + marker, ""));
  std::string got;
  std::vector<uint64_t> seqs;
  // Without acks the agent stops reading; what arrives is bounded.
  while (auto m = first_->next(500)) {
    if (m->type == MsgType::kOutput) got.append(*m->get(Tag::kData));
    seqs.push_back(m->u64(Tag::kSeq));
    ASSERT_NE(m->type, MsgType::kExit);
  }
  EXPECT_LE(got.size(), (256u << 10) + (64u << 10));
  EXPECT_NE(::access(marker.c_str(), F_OK), 0) << "the command finished without acks";
  ASSERT_FALSE(seqs.empty());
  first_->ack(seqs.back());
  uint64_t last = seqs.back();
  Message exit = drain_to_exit(*first_, 3, &got, &last);
  ASSERT_EQ(exit.type, MsgType::kExit);
  EXPECT_EQ(exit.i64(Tag::kExitCode, -1), 0);
  EXPECT_TRUE(got == want);
  EXPECT_EQ(::access(marker.c_str(), F_OK), 0);
}

TEST_F(AgentSessionTest, NewConnectionReplacesTheLiveSession) {
  ASSERT_NO_FATAL_FAILURE(start_raw());
  first_->hello(1);
  first_->send(exec_msg(9, "cat", "the-cat", true));
  first_->send(Message(MsgType::kStdin, 9).add(Tag::kData, "abc"));
  std::string got;
  uint64_t last = 0;
  while (got != "abc") {
    auto m = first_->next();
    ASSERT_TRUE(m);
    last = m->u64(Tag::kSeq);
    if (m->type == MsgType::kOutput) got.append(*m->get(Tag::kData));
  }
  first_->ack(last);
  first_->send(Message(MsgType::kPing, 50));
  for (;;) {
    auto m = first_->next();
    ASSERT_TRUE(m);
    if (m->type == MsgType::kOk) break;
  }
  // first_ stays open: the new connection takes over.
  auto second = Raw::connect(agent_->socket_path());
  ASSERT_TRUE(second);
  auto listed = second->next();
  ASSERT_TRUE(listed);
  ASSERT_EQ(listed->type, MsgType::kResumed);
  EXPECT_EQ(listed->id, 9u);
  EXPECT_EQ(listed->str(Tag::kMeta), "the-cat");
  EXPECT_TRUE(listed->flag(Tag::kRunning));
  auto ready = second->next();
  ASSERT_TRUE(ready);
  ASSERT_EQ(ready->type, MsgType::kReady);
  EXPECT_EQ(ready->u64(Tag::kSession), 2u);
  first_->next();
  EXPECT_TRUE(first_->eof()) << "the replaced session must be closed";
  second->hello(2);
  // A kExec reusing the held id is refused; the command keeps its id.
  second->send(exec_msg(9, "true", ""));
  auto refused = second->next();
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->type, MsgType::kError);
  EXPECT_EQ(refused->str(Tag::kErrCode), "conflict");
  EXPECT_FALSE(refused->has(Tag::kSeq));
  second->send(Message(MsgType::kStdin, 9).add(Tag::kData, "def").add_bool(Tag::kEof, true));
  std::string rest;
  Message exit = drain_to_exit(*second, 9, &rest, &last);
  ASSERT_EQ(exit.type, MsgType::kExit);
  EXPECT_EQ(exit.i64(Tag::kExitCode, -1), 0);
  EXPECT_EQ(rest, "def");
}

TEST_F(AgentSessionTest, EndedCommandIsListedWithItsExit) {
  ASSERT_NO_FATAL_FAILURE(start_raw());
  first_->hello(1);
  first_->send(exec_msg(4, "echo out; exit 3", "m4"));
  // Wait for the exit but acknowledge nothing.
  for (;;) {
    auto m = first_->next();
    ASSERT_TRUE(m);
    if (m->type == MsgType::kExit) break;
  }
  first_->close();
  auto second = Raw::connect(agent_->socket_path());
  ASSERT_TRUE(second);
  auto listed = second->next();
  ASSERT_TRUE(listed);
  ASSERT_EQ(listed->type, MsgType::kResumed);
  EXPECT_FALSE(listed->flag(Tag::kRunning));
  ASSERT_EQ(second->next()->type, MsgType::kReady);
  std::string out;
  uint64_t last = 0;
  bool started = false;
  for (;;) {
    auto m = second->next();
    ASSERT_TRUE(m);
    last = m->u64(Tag::kSeq);
    if (m->type == MsgType::kStarted) started = true;
    if (m->type == MsgType::kOutput) out.append(*m->get(Tag::kData));
    if (m->type == MsgType::kExit) {
      EXPECT_EQ(m->i64(Tag::kExitCode), 3);
      break;
    }
  }
  EXPECT_TRUE(started);
  EXPECT_EQ(out, "out\n");
  second->ack(last);
}

TEST_F(AgentSessionTest, NoNodeForTheOrphanTimeoutEndsTheAgent) {
  AgentOptions o;
  o.orphan_timeout_s = 1;
  ASSERT_NO_FATAL_FAILURE(start_raw(o));
  first_->hello(1);
  first_->send(exec_msg(2, "sleep 1000", ""));
  uint32_t pid = 0;
  while (!pid) {
    auto m = first_->next();
    ASSERT_TRUE(m);
    if (m->type == MsgType::kStarted) pid = static_cast<uint32_t>(m->u64(Tag::kPid));
  }
  first_->close();
  int st = agent_->wait_exit();
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);
  for (int i = 0; i < 1000 && !process_gone(static_cast<pid_t>(pid)); ++i) ::usleep(10000);
  EXPECT_TRUE(process_gone(static_cast<pid_t>(pid)));
}

TEST_F(AgentSessionTest, ProtocolErrorStillEndsTheAgent) {
  ASSERT_NO_FATAL_FAILURE(start_raw());
  first_->hello(1);
  auto raw = Raw::connect(agent_->socket_path());
  ASSERT_TRUE(raw);
  ASSERT_EQ(raw->next()->type, MsgType::kReady);
  raw->send(Message(MsgType::kPing, 1));
  ASSERT_EQ(raw->next()->type, MsgType::kOk);
  // A frame length below the header size.
  raw->send_raw(std::string("\x02\x00\x00\x00\x14\x00", 6));
  int st = agent_->wait_exit();
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 1);
}

// --serial (a VM's port; a connected socketpair stands in for it): a second node's
// kHello in one session means a new host took the port without the agent seeing the
// old one leave. It starts a new session on the same stream: the unacknowledged
// answers come again after kResumed and kReady, and the port stays open.
TEST_F(AgentSessionTest, SerialPortNewNodeHelloStartsANewSession) {
  AgentOptions o;
  o.serial = true;
  agent_ = std::make_unique<AgentProcess>(root_.path(), o);
  ASSERT_GE(agent_->fd(), 0);
  Raw r(::dup(agent_->fd()));
  agent_->close_fd();
  auto ready = r.next();
  ASSERT_TRUE(ready);
  ASSERT_EQ(ready->type, MsgType::kReady);
  EXPECT_EQ(ready->u64(Tag::kSession), 1u);
  r.hello(111);
  r.send(exec_msg(5, "echo one", "m5"));
  std::string first;
  for (;;) {  // the answers, not acknowledged
    auto m = r.next();
    ASSERT_TRUE(m);
    if (m->type == MsgType::kOutput) first += m->get(Tag::kData).value_or("");
    if (m->type == MsgType::kExit) break;
  }
  EXPECT_EQ(first, "one\n");
  // The same node again is not a new session.
  r.hello(111);
  r.send(Message(MsgType::kPing, 6));
  auto pong = r.next();
  ASSERT_TRUE(pong);
  EXPECT_EQ(pong->type, MsgType::kOk);
  // Another node: a new session, the ended command listed and its answers again.
  r.hello(222);
  auto resumed = r.next();
  ASSERT_TRUE(resumed);
  ASSERT_EQ(resumed->type, MsgType::kResumed);
  EXPECT_EQ(resumed->id, 5u);
  EXPECT_EQ(resumed->str(Tag::kMeta), "m5");
  EXPECT_FALSE(resumed->flag(Tag::kRunning));
  auto ready2 = r.next();
  ASSERT_TRUE(ready2);
  ASSERT_EQ(ready2->type, MsgType::kReady);
  EXPECT_EQ(ready2->u64(Tag::kSession), 2u);
  EXPECT_EQ(ready2->u64(Tag::kPrevEpoch), 111u);
  std::string again;
  uint64_t last = 0;
  Message x = drain_to_exit(r, 5, &again, &last);
  EXPECT_EQ(x.type, MsgType::kExit);
  EXPECT_EQ(again, "one\n");
  // Requests after it are served in that session.
  r.send(Message(MsgType::kPing, 7));
  auto pong2 = r.next();
  ASSERT_TRUE(pong2);
  EXPECT_EQ(pong2->type, MsgType::kOk);
  EXPECT_EQ(pong2->id, 7u);
}

}  // namespace
}  // namespace tp::agent_test
