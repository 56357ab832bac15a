#include "protocol/wire.h"

#include <gtest/gtest.h>

namespace tp::proto {
namespace {

TEST(Wire, RoundTripIsBinarySafe) {
  std::string bin("a\0b\xff\x00z", 6);
  Message m(MsgType::kExec, 42);
  m.add(Tag::kArg, "sh")
      .add(Tag::kArg, bin)
      .add_u64(Tag::kTimeoutMs, 1500)
      .add_i64(Tag::kExitCode, -1);
  std::string enc = encode(m);
  FrameReader r;
  // Feed one byte at a time: frames must reassemble across arbitrary splits.
  for (char c : enc) r.feed(&c, 1);
  auto got = r.next();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->type, MsgType::kExec);
  EXPECT_EQ(got->id, 42u);
  auto args = got->all(Tag::kArg);
  ASSERT_EQ(args.size(), 2u);
  EXPECT_EQ(args[1], bin);
  EXPECT_EQ(got->u64(Tag::kTimeoutMs), 1500u);
  EXPECT_EQ(got->i64(Tag::kExitCode), -1);
  EXPECT_FALSE(r.next().has_value());
  EXPECT_FALSE(r.failed());
}

TEST(Wire, OversizedFrameFailsTheReader) {
  std::string bad = {'\xff', '\xff', '\xff', '\x7f', 1, 0, 0, 0, 0, 0, 0, 0};
  FrameReader r;
  r.feed(bad.data(), bad.size());
  EXPECT_FALSE(r.next().has_value());
  EXPECT_TRUE(r.failed());
}

TEST(Wire, TruncatedFieldIsMalformed) {
  Message m(MsgType::kPing, 1);
  m.add(Tag::kPath, "/x");
  std::string enc = encode(m);
  enc[12 + 2] = 100;  // field length now points past the frame
  FrameReader r;
  r.feed(enc.data(), enc.size());
  EXPECT_FALSE(r.next().has_value());
  EXPECT_TRUE(r.failed());
}

}  // namespace
}  // namespace tp::proto
