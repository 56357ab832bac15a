#include "common/sha256.h"

#include <gtest/gtest.h>

#include <string>

namespace tp {
namespace {

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256("abc").size(), 32u);
  EXPECT_EQ(hex_encode(sha256("abc")), sha256_hex("abc"));
}

TEST(Sha256Test, IncrementalMatchesOneShot) {
  std::string data;
  for (int i = 0; i < 100000; ++i) data.push_back(static_cast<char>(i * 7));
  Sha256 h;
  ASSERT_TRUE(h.ok());
  for (size_t off = 0; off < data.size(); off += 4093)
    h.update(std::string_view(data).substr(off, 4093));
  EXPECT_EQ(h.hex_digest(), sha256_hex(data));
}

TEST(Sha256Test, AFinishedDigestGivesNothingMore) {
  Sha256 h;
  h.update("abc");
  EXPECT_EQ(h.digest(), sha256("abc"));
  EXPECT_FALSE(h.ok());
  h.update("more");
  EXPECT_EQ(h.digest(), "");
}

TEST(Sha256Test, HexEncodesEveryByte) {
  EXPECT_EQ(hex_encode(std::string("\x00\x0f\xf0\xff", 4)), "000ff0ff");
  EXPECT_EQ(hex_encode(""), "");
}

}  // namespace
}  // namespace tp
