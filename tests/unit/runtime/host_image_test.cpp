// The `host` image skeleton (src/image/host_image.h). Needs root (chown to uid_base).
#include "image/host_image.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace tp::image {
namespace {

namespace fs = std::filesystem;

TEST(HostImageTest, SkeletonHasNoSecretsAndIsOwnedByMappedRoot) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root";
  char tmpl[] = "/tmp/tp-hi-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  auto img = ensure_host_image(dir, 123456);
  ASSERT_TRUE(img) << img.error().message();
  const std::string& r = img->rootfs;
  EXPECT_EQ(r, dir + "/images/host/rootfs");
  EXPECT_NE(std::find(img->ro_binds.begin(), img->ro_binds.end(), "/usr"), img->ro_binds.end());
  for (const char* secret :
       {"etc/shadow", "etc/gshadow", "etc/ssl/private", "etc/ssh", "root/.ssh"})
    EXPECT_FALSE(fs::exists(fs::symlink_status(r + "/" + secret))) << secret;
  EXPECT_TRUE(fs::is_empty(r + "/root"));
  EXPECT_TRUE(fs::is_empty(r + "/home"));
  std::ifstream pw(r + "/etc/passwd");
  std::stringstream ss;
  ss << pw.rdbuf();
  EXPECT_EQ(ss.str().rfind("root:x:0:0:", 0), 0u);
  EXPECT_EQ(ss.str().find("daemon:"), std::string::npos);
  struct stat st {};
  for (const char* p : {"", "/etc", "/etc/hosts", "/tmp", "/etc/ld.so.cache"}) {
    if (lstat((r + p).c_str(), &st) != 0) continue;
    EXPECT_EQ(st.st_uid, 123456u) << p;
  }
  ASSERT_EQ(lstat((r + "/tmp").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 01777u);
  // Merged /usr links mirror the host's.
  if (fs::is_symlink("/bin")) {
    EXPECT_EQ(fs::read_symlink(r + "/bin"), fs::read_symlink("/bin"));
  }
  // Second call reuses it (no rebuild, same path).
  ASSERT_EQ(unlink((r + "/etc/hosts").c_str()), 0);
  auto again = ensure_host_image(dir, 123456);
  ASSERT_TRUE(again);
  EXPECT_FALSE(fs::exists(r + "/etc/hosts"));
  // No temp dirs left behind.
  int n = 0;
  for (auto& e : fs::directory_iterator(dir + "/images/host")) (void)e, ++n;
  EXPECT_EQ(n, 1);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tp::image
