#include <gtest/gtest.h>
#include <linux/filter.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

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

// errno of `call` (0 when it succeeds) in a child under `p`.
int errno_under(const SeccompProgram& p, int (*call)()) {
  pid_t pid = fork();
  if (pid == 0) {
    if (load_filter_raw(p) != 0) _exit(255);
    _exit(call() == 0 ? 0 : errno);
  }
  int st = 0;
  if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return -1;
  return WEXITSTATUS(st);
}

// umount2 on a path that is not a mount point.
int umount_errno_under(const SeccompProgram& p) {
  return errno_under(p, [] { return ::umount2("/proc/self", 0); });
}

TEST(SeccompTest, MountCallsAreRefusedUnlessAllowed) {
  auto sandbox = build_sandbox_filter();
  auto build = build_sandbox_filter({.allow_mounts = true});
  ASSERT_TRUE(sandbox && build);
  EXPECT_EQ(umount_errno_under(**sandbox), EPERM);
  // Reaches the kernel, which finds no mount there (or, without privilege, refuses).
  int e = umount_errno_under(**build);
  EXPECT_TRUE(e == EINVAL || (e == EPERM && geteuid() != 0)) << e;
}

// setns on a descriptor that is no namespace.
int setns_errno_under(const SeccompProgram& p) {
  return errno_under(p, [] { return ::setns(0, 0); });
}

TEST(SeccompTest, SetnsIsRefusedUnlessAllowed) {
  auto sandbox = build_sandbox_filter();
  auto mounts = build_sandbox_filter({.allow_mounts = true});
  auto worker = build_sandbox_filter({.allow_mounts = true, .allow_setns = true});
  ASSERT_TRUE(sandbox && mounts && worker);
  EXPECT_EQ(setns_errno_under(**sandbox), EPERM);
  EXPECT_EQ(setns_errno_under(**mounts), EPERM);
  // Reaches the kernel, which finds no namespace behind stdin.
  EXPECT_EQ(setns_errno_under(**worker), EINVAL);
}

}  // namespace
}  // namespace tp::sys
