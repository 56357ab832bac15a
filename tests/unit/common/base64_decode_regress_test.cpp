// Regression (found by fuzz/http_fuzz, ASan heap-buffer-overflow): base64_decode
// sized its output with decoded_size(), which rounds down, so unpadded input whose
// length is 2 or 3 mod 4 (an exec request's "stdin": "YWI") wrote 1-2 bytes past
// the buffer. The ASan build (make test-asan) turns any overflow here into a failure.
#include <gtest/gtest.h>

#include "common/json_util.h"

namespace tp::json_util {
namespace {

TEST(Base64DecodeRegress, UnpaddedInputOfEveryLength) {
  const std::string plain = "The quick brown fox jumps over the lazy dog, twice over.";
  for (size_t n = 0; n <= plain.size(); ++n) {
    std::string enc = base64_encode(plain.substr(0, n));
    std::string unpadded = enc;
    while (!unpadded.empty() && unpadded.back() == '=') unpadded.pop_back();
    for (const std::string& in : {enc, unpadded}) {
      auto out = base64_decode(in);
      ASSERT_TRUE(out) << in;
      EXPECT_EQ(*out, plain.substr(0, n)) << in;
    }
  }
  EXPECT_EQ(*base64_decode("YQ"), "a");
  EXPECT_EQ(*base64_decode("YWI"), "ab");
  EXPECT_FALSE(base64_decode("YWJjZ"));  // 1 mod 4 cannot be valid
  EXPECT_FALSE(base64_decode("YW!j"));
}

TEST(Base64DecodeRegress, FuzzerInput) {
  // 75 characters of 'a' after "GE": the input that overflowed.
  std::string in = "GE" + std::string(73, 'a');
  auto out = base64_decode(in);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->size(), 56u);
}

}  // namespace
}  // namespace tp::json_util
