#include <gtest/gtest.h>
#include <linux/filter.h>

#include "sys/seccomp.h"
#include "sys/userns.h"

namespace tp::sys {
namespace {

TEST(UsernsTest, MapTextMapsRootToBase) {
  EXPECT_EQ(id_map_text(100000), "0 100000 65536\n");
  EXPECT_EQ(id_map_text(200000, 1000), "0 200000 1000\n");
}

TEST(UsernsTest, RejectsHostRootAndOverflow) {
  EXPECT_FALSE(validate_id_base(0));
  EXPECT_FALSE(validate_id_base(0xffffffffu));
  EXPECT_TRUE(validate_id_base(100000));
}

TEST(SeccompTest, BuildsAStableProgram) {
  auto p = build_sandbox_filter();
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_GT((*p)->insns.size(), 20u);
  EXPECT_EQ((*p)->fprog.len, (*p)->insns.size());
  EXPECT_EQ((*p)->fprog.filter, (*p)->insns.data());
  // Ends in a return (the default allow or a rule's action).
  EXPECT_EQ(BPF_CLASS((*p)->insns.back().code), BPF_RET);
}

}  // namespace
}  // namespace tp::sys
