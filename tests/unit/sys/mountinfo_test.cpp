// parse_mountinfo and mount_of (sys/mountinfo.h).
#include "sys/mountinfo.h"

#include <gtest/gtest.h>

namespace tp::sys {
namespace {

constexpr const char* kInfo =
    "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "23 22 0:21 / /proc rw,nosuid - proc proc rw\n"
    "30 22 0:26 / /sys/fs/cgroup/memory rw shared:9 - cgroup cgroup rw,memory\n"
    "31 22 0:27 / /tmp rw - tmpfs tmpfs rw,size=1024k\n"
    "32 31 254:0 /data /tmp/a\\040b rw - ext4 /dev/vda rw\n"
    "garbage without the separator\n"
    "33 22 0:28 / /short - x\n"
    "34 31 0:29 / /tmp rw - xfs /dev/vdb rw\n";

TEST(Mountinfo, ParsesEveryWellFormedLineInOrder) {
  auto m = parse_mountinfo(kInfo);
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m[0].mount_point, "/");
  EXPECT_EQ(m[0].fs_type, "ext4");
  EXPECT_EQ(m[0].source, "/dev/vda");
  EXPECT_EQ(m[2].mount_point, "/sys/fs/cgroup/memory");
  EXPECT_EQ(m[2].fs_type, "cgroup");
  EXPECT_EQ(m[2].super_options, "rw,memory");
  EXPECT_EQ(m[4].mount_point, "/tmp/a b");  // \040 decoded
  EXPECT_TRUE(parse_mountinfo("").empty());
}

TEST(Mountinfo, TheMountOfAPathIsTheLongestPrefixAndTheLastOnAPoint) {
  auto m = parse_mountinfo(kInfo);
  EXPECT_EQ(mount_of(m, "/var/lib/tidepool")->fs_type, "ext4");
  EXPECT_EQ(mount_of(m, "/proc/self")->fs_type, "proc");
  // /tmp is mounted twice: the later mount hides the earlier one.
  EXPECT_EQ(mount_of(m, "/tmp/x")->fs_type, "xfs");
  EXPECT_EQ(mount_of(m, "/tmp")->fs_type, "xfs");
  EXPECT_EQ(mount_of(m, "/tmp/a b/c")->fs_type, "ext4");
  // A name that only starts like a mount point is not under it.
  EXPECT_EQ(mount_of(m, "/procfoo")->fs_type, "ext4");
  EXPECT_FALSE(mount_of({}, "/x"));
}

TEST(Mountinfo, SplitFieldsDropsEmptyPieces) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(split_fields("a  b c ", ' '), (V{"a", "b", "c"}));
  EXPECT_EQ(split_fields(",rw,,memory", ','), (V{"rw", "memory"}));
  EXPECT_TRUE(split_fields("", ',').empty());
}

}  // namespace
}  // namespace tp::sys
