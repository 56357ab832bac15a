// AgentClient: against the real agent (death, malformed frames) and against a
// scripted fake agent on a socketpair (error mapping, chunking, protocol errors).
#include "node/agent_client.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdio>
#include <thread>

#include "../agent/agent_harness.h"
#include "node/agent_client_codec.h"
#include "protocol/wire.h"

namespace tp::agent_test {
namespace {

using proto::Message;
using proto::MsgType;
using proto::Tag;

class AgentClientTest : public AgentTestBase {
 protected:
  // Starts the agent and a long `sleep` through the client; pid_ and done_ follow it.
  void start_sleeper() {
    start();
    node::ExecRequest req;
    req.argv = {"sleep", "1000"};
    node::ExecHandlers h;
    h.on_started = [this](uint32_t p) { pid_ = p; };
    h.on_done = [this](Result<node::ExecResult> r) { done_.emplace(std::move(r)); };
    client_->exec(req, std::move(h));
    ASSERT_TRUE(run_until([&] { return pid_ != 0; }));
  }
  // Clients of later sessions: closed however a test ends (one left open would
  // keep TearDown's io_.run() waiting on its socket forever).
  void TearDown() override {
    for (auto& c : later_) c->close();
    AgentTestBase::TearDown();
  }
  uint32_t pid_ = 0;
  std::optional<Result<node::ExecResult>> done_;
  std::vector<std::shared_ptr<node::AgentClient>> later_;
};

TEST_F(AgentClientTest, AgentDeathFailsPendingRequests) {
  ASSERT_NO_FATAL_FAILURE(start_sleeper());
  EXPECT_EQ(client_->pending(), 1u);
  ASSERT_EQ(::kill(agent_->pid(), SIGKILL), 0);
  ASSERT_TRUE(run_until([&] { return done_.has_value() && closed_; }));
  ASSERT_FALSE(done_->has_value());
  EXPECT_EQ(done_->error().code, Code::kUnavailable);
  EXPECT_EQ(closed_error_.code, Code::kUnavailable);
  EXPECT_EQ(client_->pending(), 0u);
  // Requests after the end fail the same way, on the io thread.
  bool called = false;
  Result<void> ping;
  client_->ping([&](Result<void> r) {
    called = true;
    ping = r;
  });
  EXPECT_FALSE(called);  // never inline
  ASSERT_TRUE(run_until([&] { return called; }));
  ASSERT_FALSE(ping.has_value());
  EXPECT_EQ(ping.error().code, Code::kUnavailable);
  agent_->wait_exit();
  // The command dies with its agent (PDEATHSIG on the command init). This is
  // the kernel's asynchronous work, so wait for it rather than assume it.
  for (int i = 0; i < 1000 && !process_gone(static_cast<pid_t>(pid_)); ++i) ::usleep(10000);
  EXPECT_TRUE(process_gone(static_cast<pid_t>(pid_)));
}

TEST_F(AgentClientTest, MalformedFrameClosesTheAgent) {
  ASSERT_NO_FATAL_FAILURE(start_sleeper());
  // A frame length below the header size, written around the client.
  const char bad[] = {2, 0, 0, 0, 20, 0};
  ASSERT_EQ(::write(agent_->fd(), bad, sizeof(bad)), static_cast<ssize_t>(sizeof(bad)));
  ASSERT_TRUE(run_until([&] { return done_.has_value(); }));
  ASSERT_FALSE(done_->has_value());
  EXPECT_EQ(done_->error().code, Code::kUnavailable);
  int st = agent_->wait_exit();
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 1);
  // The agent killed its command before exiting.
  EXPECT_TRUE(process_gone(static_cast<pid_t>(pid_)));
}

TEST_F(AgentClientTest, BadFdFailsStart) {
  auto c = node::AgentClient::create(io_, -1, "sb-bad");
  auto r = await<void>([&](auto cb) { c->start(cb); });
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kUnavailable);
}

// Live restore through the client: a command outlives its first client, a
// second one connects through the agent's socket, lists it, attaches to it
// and gets what the first did not acknowledge; new ids continue above it.
TEST_F(AgentClientTest, ResumeListsAttachesAndContinuesIds) {
  AgentOptions o;
  o.listen = true;
  start(o);
  node::ExecRequest req = sh("echo a; read x; echo \"b$x\"");
  req.stdin_open = true;
  req.meta = "restore-meta";
  std::string first_out;
  bool first_done = false;
  node::ExecHandlers h;
  h.on_output = [&](int, std::string_view d) { first_out.append(d); };
  h.on_done = [&](Result<node::ExecResult>) { first_done = true; };
  uint32_t id = client_->exec(req, std::move(h));
  ASSERT_TRUE(run_until([&] { return first_out == "a\n"; }));
  // A ping after the output: its answer means the ack of "a" was read.
  ASSERT_TRUE(await<void>([&](auto cb) { client_->ping(cb); }).has_value());
  client_->close();
  agent_->close_fd();
  ASSERT_TRUE(run_until([&] { return first_done; }));

  auto c2 = node::AgentClient::connect(io_, agent_->socket_path(), "sb-test");
  ASSERT_TRUE(c2.has_value()) << c2.error().message();
  auto client2 = *c2;
  auto r = await<void>([&](auto cb) { client2->start(cb); });
  ASSERT_TRUE(r.has_value()) << r.error().message();
  auto listed = client2->resumed();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].id, id);
  EXPECT_EQ(listed[0].meta, "restore-meta");
  EXPECT_TRUE(listed[0].running);
  EXPECT_EQ(client2->attach(id + 1000, {}).error().code, Code::kNotFound);

  std::string out;
  std::optional<Result<node::ExecResult>> done;
  node::ExecHandlers h2;
  h2.on_output = [&](int, std::string_view d) { out.append(d); };
  h2.on_done = [&](Result<node::ExecResult> res) { done.emplace(std::move(res)); };
  ASSERT_TRUE(client2->attach(id, std::move(h2)).has_value());
  EXPECT_EQ(client2->attach(id, {}).error().code, Code::kNotFound) << "attached twice";
  client2->send_stdin(id, "1\n", true);
  ASSERT_TRUE(run_until([&] { return done.has_value(); }));
  ASSERT_TRUE(done->has_value()) << done->error().message();
  EXPECT_EQ((*done)->exit_code, 0);
  EXPECT_EQ(out, "b1\n") << "acknowledged output must not come again";

  // New requests of the second client get ids above the resumed one.
  std::optional<Result<node::ExecResult>> d3;
  node::ExecHandlers h3;
  h3.on_done = [&](Result<node::ExecResult> res) { d3.emplace(std::move(res)); };
  uint32_t id3 = client2->exec(sh("true"), std::move(h3));
  EXPECT_GT(id3, id);
  ASSERT_TRUE(run_until([&] { return d3.has_value(); }));
  EXPECT_TRUE(d3->has_value());
  client2->close();
  io_.restart();
  io_.run();
}

// Answers of a resumed command that arrive before attach() wait for it.
TEST_F(AgentClientTest, ReplayedAnswersWaitForAttach) {
  AgentOptions o;
  o.listen = true;
  start(o);
  const std::string marker = host_path("/ended");
  uint32_t pid = 0;
  node::ExecHandlers h;
  // The first client goes away as soon as the command started: nothing after
  // that is acknowledged.
  h.on_started = [&](uint32_t p) {
    pid = p;
    client_->close();
  };
  h.on_done = [](Result<node::ExecResult>) {};
  // Stdin stays open: the command prints nothing until the second client gives it a
  // line (with stdin closed `read x` returns at once, and the output could reach
  // the first client with kStarted).
  node::ExecRequest req = sh("read x; echo one; echo two >&2; : > " + marker + "; exit 4");
  req.stdin_open = true;
  client_->exec(req, std::move(h));
  ASSERT_TRUE(run_until([&] { return pid != 0; }));
  io_.restart();
  io_.run();
  agent_->close_fd();
  // The command waits for stdin, which a second client gives.
  auto c2 = node::AgentClient::connect(io_, agent_->socket_path(), "sb-test");
  ASSERT_TRUE(c2.has_value());
  auto client2 = *c2;
  later_.push_back(client2);
  ASSERT_TRUE(await<void>([&](auto cb) { client2->start(cb); }).has_value());
  ASSERT_EQ(client2->resumed().size(), 1u);
  uint32_t rid = client2->resumed()[0].id;
  client2->send_stdin(rid, "\n", true);
  ASSERT_TRUE(await<void>([&](auto cb) { client2->ping(cb); }).has_value());  // the stdin went out
  // Gone before it would abandon (and so acknowledge) the unattached answers after
  // kAttachWait: under a slow build (TSan) the wait below can take that long.
  client2->close();
  io_.restart();
  io_.run();
  // Wait until the command is over, then reconnect once more: this session's
  // replay then holds everything and arrives before attach() below.
  for (int i = 0;
       i < 3000 && !(::access(marker.c_str(), F_OK) == 0 && process_gone(static_cast<pid_t>(pid)));
       ++i)
    ::usleep(10000);
  auto c3 = node::AgentClient::connect(io_, agent_->socket_path(), "sb-test");
  ASSERT_TRUE(c3.has_value());
  auto client3 = *c3;
  later_.push_back(client3);
  ASSERT_TRUE(await<void>([&](auto cb) { client3->start(cb); }).has_value());
  ASSERT_EQ(client3->resumed().size(), 1u);
  EXPECT_EQ(client3->resumed()[0].id, rid);
  // A round trip: the agent wrote the replay before it read this.
  ASSERT_TRUE(await<void>([&](auto cb) { client3->ping(cb); }).has_value());
  std::string out, err;
  std::optional<Result<node::ExecResult>> done;
  node::ExecHandlers h3;
  h3.on_output = [&](int s, std::string_view d) { (s == 1 ? out : err).append(d); };
  h3.on_done = [&](Result<node::ExecResult> res) { done.emplace(std::move(res)); };
  ASSERT_TRUE(client3->attach(rid, std::move(h3)).has_value());
  ASSERT_TRUE(run_until([&] { return done.has_value(); }));
  ASSERT_TRUE(done->has_value()) << done->error().message();
  EXPECT_EQ((*done)->exit_code, 4);
  EXPECT_EQ(out, "one\n");
  EXPECT_EQ(err, "two\n");
  client2->close();
  client3->close();
  io_.restart();
  io_.run();
}

// Answers replayed to a new session wait for attach(); once attach() has
// handled them they must be acknowledged. A command at the agent's cap of
// unacknowledged output (256 KiB) sends nothing more that could carry the ack,
// so without it the command would wait forever.
TEST_F(AgentClientTest, AttachAcknowledgesTheReplayedBacklog) {
  AgentOptions o;
  o.listen = true;
  start(o);
  const std::string progress = host_path("/progress");
  const std::string go = host_path("/go");
  uint32_t pid = 0;
  node::ExecHandlers h;
  h.on_started = [&](uint32_t p) {
    pid = p;
    client_->close();
  };
  h.on_done = [](Result<node::ExecResult>) {};
  // The output starts once this client is closed: close() is posted to the client's
  // strand, so output read with kStarted would still be handled, and acknowledged or
  // not depending on whether the ack got out before the socket closed.
  client_->exec(
      sh("while [ ! -e " + go + " ]; do sleep 0.01; done; " +
         "for i in 1 2 3 4 5 6 7 8; do head -c 65536 /dev/zero; echo $i > " + progress + "; done"),
      std::move(h));
  ASSERT_TRUE(run_until([&] { return pid != 0; }));
  io_.restart();
  io_.run();
  agent_->close_fd();
  // Nothing is acknowledged from here until the second client attaches.
  int go_fd = ::open(go.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  ASSERT_GE(go_fd, 0);
  ::close(go_fd);
  // Piece 5 written means the agent read 4 (its pipe holds one): 256 KiB held, at the cap.
  auto pieces = [&] {
    FILE* f = std::fopen(progress.c_str(), "r");
    int n = 0;
    if (f) {
      if (std::fscanf(f, "%d", &n) != 1) n = 0;
      std::fclose(f);
    }
    return n;
  };
  for (int i = 0; i < 3000 && pieces() < 5; ++i) ::usleep(10000);
  ASSERT_GE(pieces(), 5);
  EXPECT_LT(pieces(), 8);
  auto c2 = node::AgentClient::connect(io_, agent_->socket_path(), "sb-test");
  ASSERT_TRUE(c2.has_value());
  auto client2 = *c2;
  ASSERT_TRUE(await<void>([&](auto cb) { client2->start(cb); }).has_value());
  ASSERT_EQ(client2->resumed().size(), 1u);
  // Round trips: the replay has arrived (and waits for attach) by now.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(await<void>([&](auto cb) { client2->ping(cb); }));
  uint64_t got = 0;
  std::optional<Result<node::ExecResult>> done;
  node::ExecHandlers h2;
  h2.on_output = [&](int, std::string_view d) { got += d.size(); };
  h2.on_done = [&](Result<node::ExecResult> r) { done.emplace(std::move(r)); };
  ASSERT_TRUE(client2->attach(client2->resumed()[0].id, std::move(h2)).has_value());
  // A hang guard, not a time limit on a working client.
  bool stuck = false;
  boost::asio::steady_timer guard(io_, std::chrono::seconds(60));
  guard.async_wait([&](boost::system::error_code ec) { stuck = !ec; });
  ASSERT_TRUE(run_until([&] { return done.has_value() || stuck; }));
  guard.cancel();
  ASSERT_FALSE(stuck) << "the command never finished: its replayed output was not acknowledged";
  ASSERT_TRUE(done->has_value()) << done->error().message();
  EXPECT_EQ(got, 8u * 65536u);
  client2->close();
  io_.restart();
  io_.run();
}

// Flow control (kExec WINDOW, kCredit): the agent reads no more of a
// command's output than it was granted, exactly, and goes on when credited.
TEST_F(AgentClientTest, WindowPacesOutputUntilCredited) {
  start();
  node::ExecRequest req = sh("head -c 4194304 /dev/zero");
  req.window = 100000;  // not a multiple of the agent's reads
  uint64_t got = 0;
  std::optional<Result<node::ExecResult>> done;
  node::ExecHandlers h;
  h.on_output = [&](int, std::string_view d) { got += d.size(); };
  h.on_done = [&](Result<node::ExecResult> r) { done.emplace(std::move(r)); };
  uint32_t id = client_->exec(req, std::move(h));
  ASSERT_TRUE(run_until([&] { return got >= 100000; }));
  // Round trips through the agent's loop: output beyond the window would have come by now.
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(await<void>([&](auto cb) { client_->ping(cb); }));
  EXPECT_EQ(got, 100000u);
  EXPECT_FALSE(done.has_value());
  client_->credit(id, 50000);
  ASSERT_TRUE(run_until([&] { return got >= 150000; }));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(await<void>([&](auto cb) { client_->ping(cb); }));
  EXPECT_EQ(got, 150000u);
  client_->credit(id, 1ull << 40);
  ASSERT_TRUE(run_until([&] { return done.has_value(); }));
  ASSERT_TRUE(done->has_value()) << done->error().message();
  EXPECT_EQ((*done)->exit_code, 0);
  EXPECT_EQ(got, 4194304u);
}

// Output past the command's limit is dropped, not sent: it takes no credit, so a
// windowed command that prints more than its limit still runs to its end (it
// once stalled with its window used up by bytes nobody would credit back).
TEST_F(AgentClientTest, OutputPastTheLimitTakesNoCredit) {
  start();
  node::ExecRequest req = sh("head -c 2097152 /dev/zero");
  req.output_limit = 65536;
  req.window = 65536;
  uint64_t got = 0;
  std::optional<Result<node::ExecResult>> done;
  node::ExecHandlers h;
  h.on_output = [&](int, std::string_view d) { got += d.size(); };
  h.on_done = [&](Result<node::ExecResult> r) { done.emplace(std::move(r)); };
  uint32_t id = client_->exec(req, std::move(h));
  ASSERT_TRUE(run_until([&] { return got >= 65536; }));
  client_->credit(id, got);  // what a consumer grants back once it was written
  bool stuck = false;
  boost::asio::steady_timer guard(io_, std::chrono::seconds(60));
  guard.async_wait([&](boost::system::error_code ec) { stuck = !ec; });
  ASSERT_TRUE(run_until([&] { return done.has_value() || stuck; }));
  guard.cancel();
  ASSERT_FALSE(stuck) << "the command stalled past its output limit";
  ASSERT_TRUE(done->has_value()) << done->error().message();
  EXPECT_EQ((*done)->exit_code, 0);
  EXPECT_TRUE((*done)->stdout_truncated);
  EXPECT_EQ(got, 65536u);
}

// A window belongs to the session that set it: a node that reconnects knows
// nothing of it and gets the rest of the output without credit, exactly once.
TEST_F(AgentClientTest, NewSessionLiftsTheWindow) {
  AgentOptions o;
  o.listen = true;
  start(o);
  node::ExecRequest req = sh("head -c 1048576 /dev/zero");
  req.window = 65536;
  uint64_t first = 0;
  node::ExecHandlers h;
  h.on_output = [&](int, std::string_view d) { first += d.size(); };
  h.on_done = [](Result<node::ExecResult>) {};
  client_->exec(req, std::move(h));
  ASSERT_TRUE(run_until([&] { return first >= 65536; }));
  ASSERT_TRUE(await<void>([&](auto cb) { client_->ping(cb); }));  // the ack went out
  EXPECT_EQ(first, 65536u);
  client_->close();
  io_.restart();
  io_.run();
  agent_->close_fd();
  auto c2 = node::AgentClient::connect(io_, agent_->socket_path(), "sb-test");
  ASSERT_TRUE(c2.has_value());
  auto client2 = *c2;
  ASSERT_TRUE(await<void>([&](auto cb) { client2->start(cb); }).has_value());
  ASSERT_EQ(client2->resumed().size(), 1u);
  uint64_t second = 0;
  std::optional<Result<node::ExecResult>> done;
  node::ExecHandlers h2;
  h2.on_output = [&](int, std::string_view d) { second += d.size(); };
  h2.on_done = [&](Result<node::ExecResult> r) { done.emplace(std::move(r)); };
  ASSERT_TRUE(client2->attach(client2->resumed()[0].id, std::move(h2)).has_value());
  ASSERT_TRUE(run_until([&] { return done.has_value(); }));
  ASSERT_TRUE(done->has_value()) << done->error().message();
  EXPECT_EQ(first + second, 1048576u);
  client2->close();
  io_.restart();
  io_.run();
}

// A sparse file reads as zeros at any offset; SIZE is its apparent size.
TEST_F(AgentClientTest, ReadChunkOfASparseFile) {
  start();
  const uint64_t size = 10ull << 30;
  {
    int fd = ::open(host_path("/sparse").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
    ASSERT_EQ(::pwrite(fd, "END", 3, static_cast<off_t>(size - 3)), 3);
    ::close(fd);
  }
  auto r = await<node::FileChunk>(
      [&](auto cb) { client_->read_chunk("/sparse", size - proto::kMaxChunk, 8ull << 20, cb); });
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_EQ(r->size, size);
  ASSERT_EQ(r->data.size(), proto::kMaxChunk);  // LENGTH is capped at one chunk
  EXPECT_EQ(r->data.substr(r->data.size() - 3), "END");
  EXPECT_EQ(r->data.find_first_not_of('\0'), r->data.size() - 3);
  auto end = await<node::FileChunk>([&](auto cb) { client_->read_chunk("/sparse", size, 10, cb); });
  ASSERT_TRUE(end.has_value());
  EXPECT_TRUE(end->data.empty());
  auto none = await<node::FileChunk>([&](auto cb) { client_->read_chunk("/none", 0, 10, cb); });
  ASSERT_FALSE(none.has_value());
  EXPECT_EQ(none.error().code, Code::kNotFound);
}

TEST_F(AgentClientTest, ConnectWithoutAgentIsNotFound) {
  auto c = node::AgentClient::connect(io_, root_.path() + "/no-such.sock", "sb-none");
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().code, Code::kNotFound);
}

// A scripted agent on the other end of a socketpair, run on its own thread.
class FakeAgent {
 public:
  explicit FakeAgent(std::function<void(FakeAgent&)> script) {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    node_fd_ = sv[0];
    fd_ = sv[1];
    thread_ = std::thread([this, script = std::move(script)] {
      script(*this);
      ::shutdown(fd_, SHUT_RDWR);
    });
  }
  ~FakeAgent() {
    // Wakes the script if it still waits for the client.
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
    ::close(node_fd_);
  }
  int node_fd() const { return node_fd_; }

  void send(const Message& m) { send_raw(proto::encode(m)); }
  void send_raw(const std::string& b) {
    ASSERT_EQ(::write(fd_, b.data(), b.size()), static_cast<ssize_t>(b.size()));
  }
  // The next request; the client's kHello and kAck frames are skipped (acked()
  // keeps the highest SEQ acknowledged).
  std::optional<Message> recv() {
    for (;;) {
      if (auto m = reader_.next()) {
        if (m->type == MsgType::kAck) acked_ = std::max(acked_, m->u64(Tag::kSeq));
        if (m->type == MsgType::kHello || m->type == MsgType::kAck) continue;
        return m;
      }
      char buf[65536];
      ssize_t n = ::read(fd_, buf, sizeof(buf));
      if (n <= 0) return std::nullopt;
      reader_.feed(buf, static_cast<size_t>(n));
    }
  }
  void ready() { send(Message(MsgType::kReady, 0).add_u64(Tag::kVersion, proto::kVersion)); }
  uint64_t acked() const { return acked_; }

 private:
  int node_fd_ = -1, fd_ = -1;
  uint64_t acked_ = 0;
  proto::FrameReader reader_;
  std::thread thread_;
};

class AgentClientFakeTest : public AgentTestBase {
 protected:
  void connect(FakeAgent& fake) {
    client_ = node::AgentClient::create(io_, fake.node_fd(), "sb-fake");
    client_->set_on_closed([this](const Error& e) {
      closed_ = true;
      closed_error_ = e;
    });
    auto r = await<void>([&](auto cb) { client_->start(cb); });
    ASSERT_TRUE(r.has_value());
  }
};

TEST_F(AgentClientFakeTest, AgentErrorsMapToCodes) {
  FakeAgent fake([](FakeAgent& f) {
    f.ready();
    auto m = f.recv();
    ASSERT_TRUE(m);
    EXPECT_EQ(m->type, MsgType::kFileStat);
    f.send(proto::make_error(m->id, "insufficient_storage", ENOSPC, "write /x"));
    f.recv();  // until the client closes
  });
  connect(fake);
  auto r = await<node::FileEntry>([&](auto cb) { client_->stat("/x", cb); });
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kInsufficientStorage);
  EXPECT_EQ(r.error().sys_errno, ENOSPC);
  EXPECT_NE(r.error().context.find("write /x"), std::string::npos);
  stop();
}

TEST_F(AgentClientFakeTest, WriteFileSendsTruncateThenAppendChunks) {
  std::vector<std::pair<size_t, bool>> chunks;  // (size, append)
  {
    FakeAgent fake([&](FakeAgent& f) {
      f.ready();
      uint64_t total = 0;
      while (auto m = f.recv()) {
        auto d = m->get(Tag::kData).value_or("");
        chunks.emplace_back(d.size(), m->flag(Tag::kAppend));
        total = m->flag(Tag::kAppend) ? total + d.size() : d.size();
        f.send(Message(MsgType::kOk, m->id).add_u64(Tag::kSize, total));
      }
    });
    connect(fake);
    std::string data(2 * proto::kMaxChunk + 10, 'q');
    auto r = await<uint64_t>([&](auto cb) { client_->write_file("/f", data, 0644, true, cb); });
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(*r, data.size());
    stop();
  }  // joins the fake's thread
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0], std::make_pair(size_t{proto::kMaxChunk}, false));
  EXPECT_EQ(chunks[1], std::make_pair(size_t{proto::kMaxChunk}, true));
  EXPECT_EQ(chunks[2], std::make_pair(size_t{10}, true));
}

// kCredit is sent only to an agent that announced it: an older agent answers
// an unknown message type with kError under the command's id, which would end
// the command. WINDOW is then not asked for either.
TEST_F(AgentClientFakeTest, WindowAndCreditOnlyWithTheFeature) {
  for (bool feature : {false, true}) {
    SCOPED_TRACE(feature ? "with FEATURES credit" : "without");
    std::optional<Message> exec, after;
    {
      FakeAgent fake([&](FakeAgent& f) {
        Message ready(MsgType::kReady, 0);
        ready.add_u64(Tag::kVersion, proto::kVersion);
        if (feature) ready.add_u64(Tag::kFeatures, proto::kFeatureCredit);
        f.send(ready);
        exec = f.recv();
        after = f.recv();  // kCredit, or (without the feature) the ping
        if (after && after->type == MsgType::kCredit) {
          auto ping = f.recv();
          if (ping) f.send(Message(MsgType::kOk, ping->id));
        } else if (after) {
          f.send(Message(MsgType::kOk, after->id));
        }
        if (exec) f.send(Message(MsgType::kExit, exec->id).add_i64(Tag::kExitCode, 0));
        f.recv();  // until the client closes
      });
      connect(fake);
      node::ExecRequest req;
      req.argv = {"true"};
      req.window = 1000;
      bool done = false;
      node::ExecHandlers h;
      h.on_done = [&](Result<node::ExecResult>) { done = true; };
      uint32_t id = client_->exec(req, std::move(h));
      client_->credit(id, 500);
      ASSERT_TRUE(await<void>([&](auto cb) { client_->ping(cb); }).has_value());
      ASSERT_TRUE(run_until([&] { return done; }));
      stop();
    }
    ASSERT_TRUE(exec && after);
    EXPECT_EQ(exec->type, MsgType::kExec);
    if (feature) {
      EXPECT_EQ(exec->u64(Tag::kWindow), 1000u);
      EXPECT_EQ(after->type, MsgType::kCredit);
      EXPECT_EQ(after->id, exec->id);
      EXPECT_EQ(after->u64(Tag::kLength), 500u);
    } else {
      EXPECT_FALSE(exec->has(Tag::kWindow));
      EXPECT_EQ(after->type, MsgType::kPing);
    }
  }
}

TEST_F(AgentClientFakeTest, MalformedFrameFromAgentClosesTheClient) {
  FakeAgent fake([](FakeAgent& f) {
    f.ready();
    auto m = f.recv();  // the ping
    ASSERT_TRUE(m);
    f.send_raw(std::string("\xff\xff\xff\xff\x6e\0\0\0\0\0\0\0", 12));
    f.recv();
  });
  connect(fake);
  auto r = await<void>([&](auto cb) { client_->ping(cb); });
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kUnavailable);
  ASSERT_TRUE(run_until([&] { return closed_; }));
  EXPECT_NE(closed_error_.context.find("protocol error"), std::string::npos);
  stop();
}

// The held answers of one command (SEQ 1..), in one buffer: written at once, the
// client reads them in one go.
std::string command_answers(uint32_t id, const std::vector<std::string>& outputs) {
  uint64_t seq = 0;
  std::string b =
      proto::encode(Message(MsgType::kStarted, id).add_u64(Tag::kPid, 7).add_u64(Tag::kSeq, ++seq));
  for (const auto& d : outputs)
    b += proto::encode(Message(MsgType::kOutput, id)
                           .add_u64(Tag::kStream, 1)
                           .add(Tag::kData, d)
                           .add_u64(Tag::kSeq, ++seq));
  b += proto::encode(
      Message(MsgType::kExit, id).add_i64(Tag::kExitCode, 4).add_u64(Tag::kSeq, ++seq));
  return b;
}

// An agent that sends more output than the command's limit (the real one forwards at
// most that much per stream) is not to be trusted: the session ends, and the handlers
// never see the excess (the daemon held whatever such an agent sent).
TEST_F(AgentClientFakeTest, OutputPastTheCommandsLimitEndsTheSession) {
  std::optional<Result<node::ExecResult>> done;
  size_t seen = 0;
  FakeAgent fake([&](FakeAgent& f) {
    f.ready();
    auto exec = f.recv();
    ASSERT_TRUE(exec);
    // 10 bytes allowed: 8 then 8 on stdout (the second frame is past it).
    f.send_raw(command_answers(exec->id, {"12345678", "abcdefgh"}));
    while (f.recv()) {
    }
  });
  connect(fake);
  auto req = sh("x");
  req.output_limit = 10;
  node::ExecHandlers h;
  h.on_output = [&](int, std::string_view d) { seen += d.size(); };
  h.on_done = [&](Result<node::ExecResult> r) { done.emplace(std::move(r)); };
  client_->exec(req, std::move(h));
  ASSERT_TRUE(run_until([&] { return done.has_value(); }));
  stop();
  EXPECT_TRUE(closed_);
  EXPECT_EQ(seen, 8u);
  ASSERT_FALSE(done->has_value()) << "the exit after the excess was handled";
  EXPECT_EQ(done->error().code, Code::kUnavailable);
  EXPECT_NE(closed_error_.context.find("more output than the command's limit"), std::string::npos)
      << closed_error_.context;
}

// close() from a handler: the answers read with that one are neither handled nor
// acknowledged, so the agent keeps them for its next session. (They were handled by
// the closed client and acknowledged, and so lost to the next session, when the
// first client of AgentClientTest.ReplayedAnswersWaitForAttach read its command's
// output together with kStarted.)
TEST_F(AgentClientFakeTest, CloseInAHandlerLeavesTheRestToTheNextSession) {
  uint64_t acked = 0;
  int outputs = 0;
  std::optional<Result<node::ExecResult>> done;
  {
    FakeAgent fake([&](FakeAgent& f) {
      f.ready();
      auto exec = f.recv();
      ASSERT_TRUE(exec);
      f.send_raw(command_answers(exec->id, {"one\n"}));
      while (f.recv()) {
      }
      acked = f.acked();
    });
    connect(fake);
    node::ExecHandlers h;
    h.on_started = [&](uint32_t) { client_->close(); };
    h.on_output = [&](int, std::string_view) { ++outputs; };
    h.on_done = [&](Result<node::ExecResult> r) { done.emplace(std::move(r)); };
    client_->exec(sh("x"), std::move(h));
    ASSERT_TRUE(run_until([&] { return done.has_value() && closed_; }));
    stop();
  }  // joins the fake's thread
  EXPECT_EQ(outputs, 0);
  ASSERT_FALSE(done->has_value()) << "the exit was handled after close()";
  EXPECT_EQ(done->error().code, Code::kUnavailable);
  EXPECT_EQ(acked, 1u) << "only kStarted was handled";
}

// close() from another thread while a handler runs waits for it: its answer was
// handled (and is acknowledged); no handler runs after close() returned, and what
// came after it is left to the next session.
TEST_F(AgentClientFakeTest, CloseWaitsForARunningHandler) {
  uint64_t acked = 0;
  std::atomic<int> outputs{0};
  std::atomic<bool> in_handler{false}, handler_returned{false}, done{false};
  std::atomic<bool> done_ok{false};
  {
    FakeAgent fake([&](FakeAgent& f) {
      f.ready();
      auto exec = f.recv();
      ASSERT_TRUE(exec);
      f.send_raw(command_answers(exec->id, {"one\n", "two\n"}));
      while (f.recv()) {
      }
      acked = f.acked();
    });
    connect(fake);
    auto work = boost::asio::make_work_guard(io_);
    io_.restart();
    std::thread io_thread([&] { io_.run(); });
    node::ExecHandlers h;
    h.on_output = [&](int, std::string_view) {
      if (++outputs > 1) return;
      in_handler = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      handler_returned = true;
    };
    h.on_done = [&](Result<node::ExecResult> r) {
      done_ok = r.has_value();
      done = true;
    };
    client_->exec(sh("x"), std::move(h));
    while (!in_handler) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    client_->close();
    EXPECT_TRUE(handler_returned.load()) << "close() returned while a handler ran";
    while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    work.reset();
    io_thread.join();
    stop();
  }
  EXPECT_EQ(outputs.load(), 1);
  EXPECT_FALSE(done_ok.load()) << "the exit was handled after close()";
  EXPECT_EQ(acked, 2u) << "kStarted and the first output were handled";
}

TEST_F(AgentClientFakeTest, AgentGoneBeforeReadyFailsStart) {
  FakeAgent fake([](FakeAgent&) {});  // closes at once
  client_ = node::AgentClient::create(io_, fake.node_fd(), "sb-fake");
  auto r = await<void>([&](auto cb) { client_->start(cb); });
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kUnavailable);
  stop();
}

// Pure codec tests.
TEST(AgentClientCodec, ExecFramesSplitLargeStdin) {
  node::ExecRequest req;
  req.argv = {"cat"};
  req.env = {"A=1"};
  req.uid = 5;
  req.gid = 6;
  req.timeout_ms = 100;
  req.stdin_data = std::string(proto::kMaxChunk + 5, 's');
  auto frames = node::codec::exec_frames(req, 9);
  ASSERT_TRUE(frames.has_value());
  ASSERT_EQ(frames->size(), 2u);
  proto::FrameReader r;
  for (auto& f : *frames) r.feed(f.data(), f.size());
  auto exec = r.next();
  ASSERT_TRUE(exec);
  EXPECT_EQ(exec->type, MsgType::kExec);
  EXPECT_EQ(exec->id, 9u);
  EXPECT_EQ(exec->str(Tag::kArg), "cat");
  EXPECT_EQ(exec->str(Tag::kEnv), "A=1");
  EXPECT_EQ(exec->u64(Tag::kUid), 5u);
  EXPECT_EQ(exec->u64(Tag::kGid), 6u);
  EXPECT_EQ(exec->u64(Tag::kTimeoutMs), 100u);
  EXPECT_TRUE(exec->flag(Tag::kStdinOpen));  // more stdin follows
  EXPECT_EQ(exec->get(Tag::kData)->size(), proto::kMaxChunk);
  auto in = r.next();
  ASSERT_TRUE(in);
  EXPECT_EQ(in->type, MsgType::kStdin);
  EXPECT_EQ(in->get(Tag::kData)->size(), 5u);
  EXPECT_TRUE(in->flag(Tag::kEof));
}

TEST(AgentClientCodec, ExecFrameTooLargeIsRefused) {
  node::ExecRequest req;
  req.argv = {"echo", std::string(proto::kMaxFrame, 'a')};
  auto frames = node::codec::exec_frames(req, 1);
  ASSERT_FALSE(frames.has_value());
  EXPECT_EQ(frames.error().code, Code::kPayloadTooLarge);
}

TEST(AgentClientCodec, StdinFramesAlwaysCarryEof) {
  auto f = node::codec::stdin_frames(3, "", true);
  ASSERT_EQ(f.size(), 1u);
  proto::FrameReader r;
  r.feed(f[0].data(), f[0].size());
  auto m = r.next();
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->flag(Tag::kEof));
  EXPECT_FALSE(m->has(Tag::kData));
}

TEST(AgentClientCodec, ResultsAndEntries) {
  Message x(MsgType::kExit, 1);
  x.add_i64(Tag::kExitCode, -1).add_u64(Tag::kTermSignal, 9).add_bool(Tag::kTimedOut, true);
  auto r = node::codec::exec_result_from(x);
  EXPECT_EQ(r.exit_code, -1);
  EXPECT_EQ(r.signal, 9);
  EXPECT_TRUE(r.timed_out);
  Message e;
  e.add(Tag::kFileType, "symlink").add(Tag::kLinkTarget, "/t").add_u64(Tag::kMode, 0777);
  auto fe = node::codec::entry_from(e.fields, "/a/b");
  EXPECT_EQ(fe.path, "/a/b");
  EXPECT_EQ(fe.name, "b");
  EXPECT_EQ(fe.type, "symlink");
  EXPECT_EQ(fe.link_target, "/t");
  EXPECT_EQ(fe.mode, 0777u);
  EXPECT_EQ(node::codec::base_name("/"), "/");
  EXPECT_EQ(node::codec::base_name("/x/y/"), "y");
  auto err = node::codec::error_from(proto::make_error(1, "no_such_code", 0, "m"));
  EXPECT_EQ(err.code, Code::kInternal);
}

}  // namespace
}  // namespace tp::agent_test
