// Streaming downloads (api/download.h) against a responder whose socket the
// test drains by hand, a fake file reader and a fake command: the next piece
// is asked for (or credited) only once the previous one was written, so what
// is held stays bounded whatever the size; small answers keep one body; every
// failure after the head is an aborted stream.
#include "api/download.h"

#include <gtest/gtest.h>

#include <deque>

#include "protocol/wire.h"
#include "slow_responder.h"

namespace tp::api {
namespace {

using testing::exited;
using testing::FakeExec;
using testing::SlowResponder;

// A file of `size` bytes: zeros (a hole) except `tail` at its end. Reads wait
// in `reads` until the test answers them (in any order).
struct FakeFile {
  uint64_t size = 0;
  std::string tail = "END";
  struct Read {
    uint64_t offset, length;
    std::function<void(Result<node::FileChunk>)> done;
  };
  std::deque<Read> reads;
  uint64_t max_outstanding = 0;

  FileDownload::ReadFn fn() {
    return [this](uint64_t off, uint64_t len, std::function<void(Result<node::FileChunk>)> done) {
      EXPECT_EQ(len, FileDownload::kPiece);
      reads.push_back({off, len, std::move(done)});
      max_outstanding = std::max<uint64_t>(max_outstanding, reads.size());
    };
  }
  node::FileChunk chunk_at(uint64_t off, uint64_t len) const {
    node::FileChunk c;
    c.size = size;
    uint64_t n = off >= size ? 0 : std::min<uint64_t>(len, size - off);
    c.data.assign(n, '\0');
    uint64_t tail_at = size - tail.size();
    for (uint64_t i = 0; i < n; ++i)
      if (off + i >= tail_at) c.data[i] = tail[off + i - tail_at];
    return c;
  }
  // Answers the oldest read (or the newest: answers may come in any order).
  bool answer_one(bool newest = false) {
    if (reads.empty()) return false;
    Read r;
    if (newest) {
      r = std::move(reads.back());
      reads.pop_back();
    } else {
      r = std::move(reads.front());
      reads.pop_front();
    }
    r.done(chunk_at(r.offset, r.length));
    return true;
  }
};

// Runs a download to its end: answer a read, write what it queued, repeat;
// checks on the way that at most kDepth pieces are being read or written.
void pump(FakeFile& f, SlowResponder& res) {
  for (;;) {
    EXPECT_LE(f.reads.size() + res.queue.size(), FileDownload::kDepth);
    if (!f.answer_one() && !res.drain_one()) break;
  }
}

TEST(FileDownload, SmallFileIsOneBodyWithItsLength) {
  FakeFile f;
  f.size = 1000;
  auto res = std::make_shared<SlowResponder>();
  FileDownload::start("/small", 1 << 30, f.fn(), res);
  EXPECT_EQ(f.reads.size(), 1u);  // the size is not known yet: one read
  pump(f, *res);
  EXPECT_TRUE(res->sent);
  EXPECT_FALSE(res->streaming);
  EXPECT_EQ(res->status, 200);
  ASSERT_EQ(res->body.size(), 1000u);
  EXPECT_EQ(res->body.substr(997), "END");
}

TEST(FileDownload, BigFileStreamsWithBoundedReadAhead) {
  FakeFile f;
  f.size = 5 * FileDownload::kPiece + 12345;
  auto res = std::make_shared<SlowResponder>();
  FileDownload::start("/big", 1ull << 40, f.fn(), res);
  ASSERT_EQ(f.reads.size(), 1u);
  ASSERT_TRUE(f.answer_one());
  ASSERT_TRUE(res->streaming);
  // The first piece waits for the socket; the next one is read meanwhile, no more.
  EXPECT_EQ(res->queue.size(), 1u);
  ASSERT_EQ(f.reads.size(), FileDownload::kDepth - 1);
  EXPECT_EQ(f.reads.front().offset, FileDownload::kPiece);
  ASSERT_TRUE(f.answer_one());
  EXPECT_TRUE(f.reads.empty());  // a full window: nothing more until the socket takes one
  EXPECT_EQ(res->queue.size(), 1u);
  ASSERT_TRUE(res->drain_one());
  EXPECT_EQ(res->queue.size(), 1u);  // the piece read ahead goes out at once
  EXPECT_EQ(f.reads.size(), 1u);
  pump(f, *res);
  EXPECT_TRUE(res->ended);
  EXPECT_FALSE(res->aborted);
  ASSERT_EQ(res->body.size(), f.size);
  EXPECT_EQ(res->body.substr(f.size - 3), "END");
  EXPECT_EQ(res->body.find_first_not_of('\0'), f.size - 3);
  EXPECT_LE(f.max_outstanding, FileDownload::kDepth);
  EXPECT_LE(res->max_queued_bytes, FileDownload::kPiece);
}

// Pieces are written in file order whatever order the reads answer in.
TEST(FileDownload, PiecesGoOutInOrder) {
  FakeFile f;
  f.size = 4 * FileDownload::kPiece;
  f.tail = std::string(FileDownload::kPiece + 7, 'x');  // a boundary inside the tail
  auto res = std::make_shared<SlowResponder>();
  FileDownload::start("/order", 1ull << 40, f.fn(), res);
  ASSERT_TRUE(f.answer_one());
  for (;;) {
    if (f.reads.size() >= 1 && f.answer_one(true)) continue;
    if (!res->drain_one()) break;
  }
  EXPECT_TRUE(res->ended);
  ASSERT_EQ(res->body.size(), f.size);
  EXPECT_EQ(res->body.substr(f.size - f.tail.size()), f.tail);
  EXPECT_EQ(res->body.find_first_not_of('\0'), f.size - f.tail.size());
}

TEST(FileDownload, ExactMultipleOfThePieceEndsAtTheReportedSize) {
  FakeFile f;
  f.size = 3 * FileDownload::kPiece;
  auto res = std::make_shared<SlowResponder>();
  FileDownload::start("/exact", 1ull << 40, f.fn(), res);
  pump(f, *res);
  EXPECT_TRUE(res->ended);
  EXPECT_EQ(res->body.size(), f.size);
  EXPECT_TRUE(f.reads.empty());
}

// A 100 GiB sparse file: the daemon side holds kDepth pieces however far it
// goes; the client leaving stops the reads.
TEST(FileDownload, HugeSparseFileIsBoundedUntilTheClientLeaves) {
  FakeFile f;
  f.size = 100ull << 30;
  auto res = std::make_shared<SlowResponder>();
  res->keep_body = false;
  FileDownload::start("/sparse", 1ull << 40, f.fn(), res);
  for (int i = 0; i < 300; ++i) {
    ASSERT_LE(f.reads.size() + res->queue.size(), FileDownload::kDepth);
    while (f.answer_one()) {
    }
    ASSERT_FALSE(res->queue.empty());
    res->drain_one();
  }
  EXPECT_LE(f.max_outstanding, FileDownload::kDepth);
  EXPECT_LE(res->max_queued_bytes, FileDownload::kPiece);
  // The client goes away while a piece waits for the socket and one is read.
  while (f.answer_one()) {
  }
  res->on_abort();
  res->drain_one(false);
  while (f.answer_one()) {
  }
  EXPECT_TRUE(f.reads.empty());
  EXPECT_TRUE(res->queue.empty());
  EXPECT_FALSE(res->ended);
}

TEST(FileDownload, OverTheLimitIs413BeforeAnyByte) {
  FakeFile f;
  f.size = 2ull << 30;
  auto res = std::make_shared<SlowResponder>();
  FileDownload::start("/sparse", 1ull << 30, f.fn(), res);
  ASSERT_TRUE(f.answer_one());
  EXPECT_TRUE(res->sent);
  EXPECT_EQ(res->status, 413);
  EXPECT_NE(res->body.find("apparent size"), std::string::npos) << res->body;
  EXPECT_TRUE(f.reads.empty());
}

TEST(FileDownload, ErrorBeforeTheHeadKeepsItsStatus) {
  auto res = std::make_shared<SlowResponder>();
  FileDownload::start(
      "/none", 1 << 30,
      [](uint64_t, uint64_t, std::function<void(Result<node::FileChunk>)> done) {
        done(fail(Code::kNotFound, "openat2 /none"));  // inline, as a refused ref() does
      },
      res);
  EXPECT_EQ(res->error_status(), 404);
}

TEST(FileDownload, ErrorAfterTheHeadAbortsTheStream) {
  FakeFile f;
  f.size = 4 * FileDownload::kPiece;
  auto res = std::make_shared<SlowResponder>();
  FileDownload::start("/f", 1ull << 40, f.fn(), res);
  ASSERT_TRUE(f.answer_one());
  res->drain_one();
  ASSERT_FALSE(f.reads.empty());
  auto r = std::move(f.reads.front());
  f.reads.pop_front();
  r.done(fail(Code::kUnavailable, "agent gone"));
  EXPECT_TRUE(res->aborted);
  EXPECT_FALSE(res->ended);
}

TEST(FileDownload, GrowingPastTheLimitAbortsTheStream) {
  FakeFile f;
  f.size = 2 * FileDownload::kPiece;  // reported size under the limit...
  auto res = std::make_shared<SlowResponder>();
  uint64_t limit = 2 * FileDownload::kPiece + 10;
  FileDownload::start("/grows", limit, f.fn(), res);
  ASSERT_TRUE(f.answer_one());
  f.size = 10 * FileDownload::kPiece;  // ...then it grew
  pump(f, *res);
  EXPECT_TRUE(res->aborted);
  EXPECT_FALSE(res->ended);
  EXPECT_LE(res->body.size(), limit);
}

// ---- CommandDownload ----

CommandDownload::Options opts(uint64_t window, uint64_t max) {
  CommandDownload::Options o;
  o.content_type = "application/x-tar";
  o.window = window;
  o.max_bytes = max;
  o.what = "the tar of /d";
  o.failure = [](const node::ExecOutcome&, const std::string& err) {
    return Error{Code::kNotFound, 0, "tar: " + err};
  };
  return o;
}

TEST(CommandDownload, SmallOutputIsOneBody) {
  FakeExec cmd{7};
  auto res = std::make_shared<SlowResponder>();
  auto dl = std::make_shared<CommandDownload>(res, opts(1 << 20, 1 << 30), cmd.fns());
  auto cb = dl->callbacks();
  dl->attach(7);
  cb.on_output(1, "abc");
  cb.on_output(1, "def");
  cb.on_done(exited(0));
  EXPECT_TRUE(res->sent);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->content_type, "application/x-tar");
  EXPECT_EQ(res->body, "abcdef");
  EXPECT_EQ(cmd.kills, 0);
}

TEST(CommandDownload, FailureBeforeTheHeadKeepsItsStatus) {
  FakeExec cmd{7};
  auto res = std::make_shared<SlowResponder>();
  auto dl = std::make_shared<CommandDownload>(res, opts(1 << 20, 1 << 30), cmd.fns());
  auto cb = dl->callbacks();
  dl->attach(7);
  cb.on_output(2, "Cannot open: No such file");
  cb.on_done(exited(2));
  EXPECT_EQ(res->error_status(), 404);
  EXPECT_NE(res->body.find("No such file"), std::string::npos);
  // stderr's window is given back at once.
  EXPECT_EQ(cmd.credited, 25u);
}

// Output beyond the window streams; credit comes back only as chunks reach the
// socket, so what waits for the client never exceeds the window.
TEST(CommandDownload, CreditFollowsTheSocket) {
  FakeExec cmd{7};
  auto res = std::make_shared<SlowResponder>();
  const uint64_t window = 256 << 10, piece = 64 << 10;
  auto dl = std::make_shared<CommandDownload>(res, opts(window, 1ull << 40), cmd.fns());
  auto cb = dl->callbacks();
  dl->attach(7);
  uint64_t sent = 0;  // what the "agent" sent: never more than window + credit
  auto agent_send = [&] {
    while (sent + piece <= window + cmd.credited) {
      cb.on_output(1, std::string(piece, 'x'));
      sent += piece;
    }
  };
  agent_send();
  EXPECT_TRUE(res->streaming);  // the window is used up: the held head goes out
  EXPECT_EQ(sent, window);
  EXPECT_EQ(cmd.credited, 0u);
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(res->drain_one());
    agent_send();
    EXPECT_LE(dl->unwritten(), window);
  }
  EXPECT_LE(res->max_queued_bytes, window);
  res->drain_all();
  cb.on_done(exited(0));
  EXPECT_TRUE(res->ended);
  EXPECT_EQ(res->body.size(), sent);
  EXPECT_EQ(cmd.credited, sent);
}

TEST(CommandDownload, ClientLeavingKillsTheCommand) {
  FakeExec cmd{7};
  auto res = std::make_shared<SlowResponder>();
  auto dl = std::make_shared<CommandDownload>(res, opts(1024, 1ull << 40), cmd.fns());
  auto cb = dl->callbacks();
  dl->attach(7);
  cb.on_output(1, std::string(2048, 'x'));
  ASSERT_TRUE(res->streaming);
  res->on_abort();
  EXPECT_EQ(cmd.kills, 1);
  res->drain_one(false);
  cb.on_output(1, std::string(2048, 'x'));  // in flight before the kill: dropped
  EXPECT_TRUE(res->queue.empty());
  cb.on_done(exited(-1));
  EXPECT_EQ(cmd.kills, 1);
  EXPECT_FALSE(res->ended);
  EXPECT_EQ(cmd.credited, 0u);
}

TEST(CommandDownload, KillAndCreditBeforeAttachAreSentOnAttach) {
  FakeExec cmd{7};
  auto res = std::make_shared<SlowResponder>();
  auto dl = std::make_shared<CommandDownload>(res, opts(4, 1ull << 40), cmd.fns());
  auto cb = dl->callbacks();
  cb.on_output(1, "abcd");
  res->drain_one();
  EXPECT_EQ(cmd.credited, 0u);
  dl->attach(7);
  EXPECT_EQ(cmd.credited, 4u);

  FakeExec cmd2{7};
  auto res2 = std::make_shared<SlowResponder>();
  auto dl2 = std::make_shared<CommandDownload>(res2, opts(4, 1ull << 40), cmd2.fns());
  auto cb2 = dl2->callbacks();
  res2->on_abort();
  EXPECT_EQ(cmd2.kills, 0);
  dl2->attach(7);
  EXPECT_EQ(cmd2.kills, 1);
}

TEST(CommandDownload, FailureAfterTheHeadAbortsTheStream) {
  FakeExec cmd{7};
  auto res = std::make_shared<SlowResponder>();
  auto dl = std::make_shared<CommandDownload>(res, opts(16, 1ull << 40), cmd.fns());
  auto cb = dl->callbacks();
  dl->attach(7);
  cb.on_output(1, std::string(32, 'x'));
  res->drain_all();
  cb.on_output(2, "tar: file changed as we read it");
  cb.on_done(exited(1));
  EXPECT_TRUE(res->aborted);
  EXPECT_FALSE(res->ended);
}

TEST(CommandDownload, OverTheLimit) {
  // Within the first window: 413.
  FakeExec cmd{7};
  auto res = std::make_shared<SlowResponder>();
  auto dl = std::make_shared<CommandDownload>(res, opts(1 << 20, 100), cmd.fns());
  auto cb = dl->callbacks();
  dl->attach(7);
  cb.on_output(1, std::string(101, 'x'));
  EXPECT_EQ(res->error_status(), 413);
  EXPECT_EQ(cmd.kills, 1);
  cb.on_done(exited(-1));

  // After the stream started: cut off, killed.
  FakeExec cmd2{7};
  auto res2 = std::make_shared<SlowResponder>();
  auto dl2 = std::make_shared<CommandDownload>(res2, opts(10, 25), cmd2.fns());
  auto cb2 = dl2->callbacks();
  dl2->attach(7);
  cb2.on_output(1, std::string(10, 'x'));
  res2->drain_all();
  cb2.on_output(1, std::string(10, 'x'));
  res2->drain_all();
  cb2.on_output(1, std::string(10, 'x'));
  EXPECT_TRUE(res2->aborted);
  EXPECT_EQ(cmd2.kills, 1);
  EXPECT_EQ(res2->body.size(), 20u);
}

// An agent that ignores the window (one from before flow control) is cut off
// instead of buffered.
TEST(CommandDownload, OutputBeyondTheWindowIsCutOff) {
  FakeExec cmd{7};
  auto res = std::make_shared<SlowResponder>();
  auto dl = std::make_shared<CommandDownload>(res, opts(64 << 10, 1ull << 40), cmd.fns());
  auto cb = dl->callbacks();
  dl->attach(7);
  for (int i = 0; i < 200 && !res->aborted; ++i) cb.on_output(1, std::string(64 << 10, 'x'));
  EXPECT_TRUE(res->aborted);
  EXPECT_EQ(cmd.kills, 1);
  EXPECT_LE(res->queued_bytes, CommandDownload::kMaxUnwritten + (64 << 10));
}

}  // namespace
}  // namespace tp::api
