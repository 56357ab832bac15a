// agent::Session alone: held vs transient frames, SEQ, acks (cumulative,
// never beyond what was written), the per-command count, replay on begin(),
// and the command records a new session lists.
#include "agent/session.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

namespace tp::agent {
namespace {

using proto::Message;
using proto::MsgType;
using proto::Tag;

class AgentSessionLogicTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv), 0);
    ours_ = sv[0];
    peer_ = sv[1];
  }
  void TearDown() override {
    ::close(ours_);
    ::close(peer_);
  }
  // Everything written so far, decoded.
  std::vector<Message> written() {
    char buf[65536];
    ssize_t n;
    while ((n = ::read(peer_, buf, sizeof buf)) > 0) reader_.feed(buf, static_cast<size_t>(n));
    std::vector<Message> out;
    while (auto m = reader_.next()) out.push_back(std::move(*m));
    return out;
  }
  static Message output(uint32_t id, std::string data) {
    Message m(MsgType::kOutput, id);
    m.add_u64(Tag::kStream, 1).add(Tag::kData, data);
    return m;
  }
  int ours_ = -1, peer_ = -1;
  proto::FrameReader reader_;
  Session s_;
};

TEST_F(AgentSessionLogicTest, HeldFramesWaitForAcksAndComeAgain) {
  s_.begin(1);
  s_.hello(5);
  s_.note_exec(7, "meta7");
  Message started(MsgType::kStarted, 7);
  started.add_u64(Tag::kPid, 4242);
  s_.send(std::move(started), true);
  s_.send(output(7, "aaa"), true);
  s_.send(Message(MsgType::kOk, 9), false);
  ASSERT_TRUE(s_.flush(ours_));
  auto w = written();
  ASSERT_EQ(w.size(), 4u);  // kReady, kOk (transient first), kStarted, kOutput
  EXPECT_EQ(w[0].type, MsgType::kReady);
  EXPECT_EQ(w[1].type, MsgType::kOk);
  EXPECT_FALSE(w[1].has(Tag::kSeq));
  EXPECT_EQ(w[2].u64(Tag::kSeq), 1u);
  EXPECT_EQ(w[3].u64(Tag::kSeq), 2u);
  EXPECT_GT(s_.held_bytes(7), 0u);
  EXPECT_TRUE(s_.holds(7));
  // An ack beyond what was written counts up to what was written only.
  s_.send(output(7, "bbb"), true);  // SEQ 3, not written yet
  s_.ack(100);
  EXPECT_TRUE(s_.want_write());
  s_.end();
  // The next session lists the command and replays SEQ 3 only.
  s_.begin(1);
  ASSERT_TRUE(s_.flush(ours_));
  w = written();
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0].type, MsgType::kResumed);
  EXPECT_EQ(w[0].id, 7u);
  EXPECT_EQ(w[0].str(Tag::kMeta), "meta7");
  EXPECT_TRUE(w[0].flag(Tag::kRunning));
  EXPECT_EQ(w[0].u64(Tag::kPid), 4242u);
  EXPECT_EQ(w[1].type, MsgType::kReady);
  EXPECT_EQ(w[1].u64(Tag::kSession), 2u);
  EXPECT_EQ(w[1].u64(Tag::kPrevEpoch), 5u);
  EXPECT_EQ(w[1].u64(Tag::kHighId), 7u);
  EXPECT_EQ(w[1].u64(Tag::kResumedCount), 1u);
  EXPECT_EQ(w[2].u64(Tag::kSeq), 3u);
  EXPECT_EQ(w[2].str(Tag::kData), "bbb");
  // The exit ends the command; once acknowledged its record is gone.
  s_.send(Message(MsgType::kExit, 7), true);
  ASSERT_TRUE(s_.flush(ours_));
  ASSERT_EQ(written().size(), 1u);
  EXPECT_TRUE(s_.holds(7));
  s_.ack(4);
  EXPECT_FALSE(s_.holds(7));
  EXPECT_EQ(s_.held_bytes(7), 0u);
  EXPECT_TRUE(s_.idle());
}

TEST_F(AgentSessionLogicTest, WithoutHelloWrittenIsDoneAndTransientNeedsAConnection) {
  s_.begin(1);
  s_.note_exec(2, "");
  s_.send(output(2, "x"), true);
  ASSERT_TRUE(s_.flush(ours_));
  EXPECT_EQ(s_.held_bytes(2), 0u);  // no kHello yet: nothing waits for acks
  s_.send(Message(MsgType::kExit, 2), true);
  ASSERT_TRUE(s_.flush(ours_));
  EXPECT_FALSE(s_.holds(2));
  (void)written();
  s_.end();
  s_.send(Message(MsgType::kOk, 3), false);  // dropped: nobody asked in this session
  s_.note_exec(4, "");
  s_.send(output(4, "kept"), true);  // held while no node is there
  EXPECT_GT(s_.held_bytes(4), 0u);
  s_.begin(1);  // a reconnecting node acknowledges
  ASSERT_TRUE(s_.flush(ours_));
  auto w = written();
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0].type, MsgType::kResumed);
  EXPECT_EQ(w[1].type, MsgType::kReady);
  EXPECT_EQ(w[2].str(Tag::kData), "kept");
  EXPECT_GT(s_.held_bytes(4), 0u) << "written is not acknowledged in a resumed session";
}

TEST_F(AgentSessionLogicTest, BrokenStreamIsReported) {
  s_.begin(1);
  ::close(peer_);
  peer_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  // EPIPE, not SIGPIPE (the agent ignores SIGPIPE; so does this test, briefly).
  auto old = ::signal(SIGPIPE, SIG_IGN);
  EXPECT_FALSE(s_.flush(ours_));
  ::signal(SIGPIPE, old);
}

}  // namespace
}  // namespace tp::agent
