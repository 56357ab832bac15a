#include "image/image_user.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace tp::image {
namespace {

class ImageUserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char t[] = "/tmp/tp-imguser-XXXXXX";
    dir_ = mkdtemp(t);
    std::filesystem::create_directories(dir_ + "/top/etc");
    std::filesystem::create_directories(dir_ + "/base/etc");
    std::ofstream(dir_ + "/base/etc/passwd")
        << "root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n";
    std::ofstream(dir_ + "/base/etc/group") << "root:x:0:\nstaff:x:50:\n";
    // A link out of the layer must not be followed to the host's files.
    std::filesystem::create_symlink("/etc/passwd", dir_ + "/top/etc/passwd");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::vector<std::string> layers() { return {dir_ + "/top", dir_ + "/base"}; }
  std::string dir_;
};

TEST_F(ImageUserTest, NumbersNamesAndGroups) {
  EXPECT_EQ(*resolve_user("", layers()), (std::pair<uint32_t, uint32_t>{0, 0}));
  EXPECT_EQ(*resolve_user("42", layers()), (std::pair<uint32_t, uint32_t>{42, 42}));
  EXPECT_EQ(*resolve_user("42:7", layers()), (std::pair<uint32_t, uint32_t>{42, 7}));
  EXPECT_EQ(*resolve_user("app", layers()), (std::pair<uint32_t, uint32_t>{1000, 1001}));
  EXPECT_EQ(*resolve_user("app:staff", layers()), (std::pair<uint32_t, uint32_t>{1000, 50}));
}

TEST_F(ImageUserTest, UnknownNamesAndOutOfRangeIdsAreRefused) {
  EXPECT_EQ(resolve_user("nobody-here", layers()).error().code, Code::kInvalidArgument);
  EXPECT_EQ(resolve_user("app:nogroup", layers()).error().code, Code::kInvalidArgument);
  EXPECT_FALSE(resolve_user("70000", layers()));
}

TEST_F(ImageUserTest, LinksOutOfALayerAreNotFollowed) {
  // top/etc/passwd points at the host's /etc/passwd (which has root, daemon, ...):
  // resolved inside the layer it is a dangling link, so "daemon" is not found there
  // and the base layer (which has no daemon) decides.
  EXPECT_FALSE(resolve_user("daemon", layers()));
}

}  // namespace
}  // namespace tp::image
