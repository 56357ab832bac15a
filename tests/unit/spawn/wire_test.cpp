// The spawner's request format without root: what encode() writes decode() reads
// back, and every malformed or unsafe request is refused before anything happens.
#include "spawn/wire.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>

#include <cstring>
#include <memory>

namespace tp::spawn {
namespace {

// Descriptor numbers as the spawner would receive them (never opened: decode only maps slots).
constexpr int kFds[] = {40, 41, 42, 43, 44, 45};

Request sample() {
  Request r;
  r.err_slot = r.slot(100);
  r.agent_slot = r.slot(101);
  r.listen_slot = r.slot(102);
  Op hello{OpKind::kHello};
  hello.step = 0;
  Op enter{OpKind::kRecvSetup};
  enter.mode = 2;
  enter.step = 1;
  r.slot(103);
  Op mnt{OpKind::kMount};
  mnt.a = "tmpfs";
  mnt.b = "/d/mnt";
  mnt.c = "tmpfs";
  mnt.d = "size=1048576";
  mnt.flags = MS_NOSUID | MS_NODEV;
  mnt.step = 2;
  Op move{OpKind::kMoveMount};
  move.fd = r.slot(104);
  move.a = "/d/mnt/lower/0";
  move.step = 3;
  Op lim{OpKind::kSetRlimit};
  lim.mode = 7;
  lim.flags = 1024;
  lim.step = 4;
  r.ops = {hello, enter, mnt, move};
  r.limits = {lim};
  r.argv = {"tp-agent", "--fd", "3"};
  r.envp = {"PATH=/bin", "HOME=/root"};
  r.seccomp = {sock_filter{6, 0, 0, 0x7fff0000}};
  r.clone_flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET;
  r.owner_uid = 1048576;
  r.uid_map = r.gid_map = "0 1048576 65536\n";
  r.exec_steps_base = 5;
  return r;
}

struct Out {
  std::unique_ptr<Decoded> d = std::make_unique<Decoded>();
  const char* why = "";
  int err_fd = -2;
};

Out decode_bytes(const std::string& msg, uint32_t nfds) {
  Out o;
  bool ok = decode(msg.data(), msg.size(), kFds, nfds, o.d.get(), &o.why, &o.err_fd);
  if (ok) o.why = nullptr;
  return o;
}

TEST(SpawnWireTest, DecodeReadsBackWhatEncodeWrote) {
  Request r = sample();
  EXPECT_EQ(r.fds, (std::vector<int>{100, 101, 102, 103, 104}));
  EXPECT_EQ(r.slot(103), 3);  // a descriptor used twice keeps its slot
  std::string msg = encode(r);
  Out o = decode_bytes(msg, 5);
  ASSERT_EQ(o.why, nullptr);
  const ExecPlan& p = o.d->plan;
  ASSERT_EQ(p.n_ops, 4u);
  EXPECT_EQ(p.ops[0].kind, OpKind::kHello);
  EXPECT_EQ(p.ops[1].kind, OpKind::kRecvSetup);
  EXPECT_EQ(p.ops[1].mode, 2u);
  EXPECT_EQ(p.ops[1].fd, -1);
  EXPECT_STREQ(p.ops[2].a, "tmpfs");
  EXPECT_STREQ(p.ops[2].b, "/d/mnt");
  EXPECT_STREQ(p.ops[2].d, "size=1048576");
  EXPECT_EQ(p.ops[2].flags, static_cast<unsigned long>(MS_NOSUID | MS_NODEV));
  EXPECT_EQ(p.ops[2].fd, -1);
  EXPECT_EQ(p.ops[3].fd, kFds[4]);  // slots become the receiver's descriptors
  EXPECT_STREQ(p.ops[3].a, "/d/mnt/lower/0");
  EXPECT_EQ(p.ops[3].step, 3u);
  ASSERT_EQ(p.n_limits, 1u);
  EXPECT_EQ(p.limits[0].mode, 7u);
  EXPECT_EQ(p.limits[0].flags, 1024u);
  EXPECT_STREQ(p.argv[0], "tp-agent");
  EXPECT_STREQ(p.argv[2], "3");
  EXPECT_EQ(p.argv[3], nullptr);
  EXPECT_STREQ(p.envp[1], "HOME=/root");
  EXPECT_EQ(p.envp[2], nullptr);
  ASSERT_EQ(p.seccomp.len, 1u);
  EXPECT_EQ(p.seccomp.filter[0].k, 0x7fff0000u);
  EXPECT_EQ(p.err_wr, kFds[0]);
  EXPECT_EQ(p.agent_child, kFds[1]);
  EXPECT_EQ(p.agent_listen, kFds[2]);
  EXPECT_EQ(p.cgroup_fd, -1);
  EXPECT_EQ(p.exe_fd, -1);  // none: the child goes on as the agent
  EXPECT_EQ(p.log_fd, -1);  // none: stdout and stderr are /dev/null
  EXPECT_EQ(p.exec_steps_base, 5u);
  EXPECT_EQ(o.d->owner_uid, 1048576u);
  EXPECT_STREQ(o.d->uid_map, "0 1048576 65536\n");
  EXPECT_EQ(o.d->clone_flags, static_cast<uint64_t>(r.clone_flags));
}

TEST(SpawnWireTest, RefusesUnsafeRequestsAndSaysWhereToReport) {
  auto refused = [](Request r, const char* why) {
    Out o = decode_bytes(encode(r), static_cast<uint32_t>(r.fds.size()));
    ASSERT_NE(o.why, nullptr) << "accepted, expected: " << why;
    EXPECT_STREQ(o.why, why);
    EXPECT_EQ(o.err_fd, kFds[0]);  // the header was sound: the refusal goes on the error pipe
  };
  Request r = sample();
  r.clone_flags &= ~static_cast<uint64_t>(CLONE_NEWUSER);
  refused(r, "no new user namespace");
  r = sample();
  r.owner_uid = 0;
  refused(r, "user namespace owned by host root");
  r = sample();
  r.clone_flags |= CLONE_VM;
  refused(r, "clone flags beyond namespaces");
  r = sample();
  r.argv.clear();
  refused(r, "empty argv");
  r = sample();
  r.ops[3].fd = 9;  // no such slot
  refused(r, "malformed op");
  r = sample();
  r.ops[2].fd = 0;  // a mount takes no descriptor
  refused(r, "malformed op");
  r = sample();
  r.ops[2].b = nullptr;  // a mount needs its target
  refused(r, "malformed op");
  r = sample();
  r.ops[0].kind = OpKind::kSetRlimit;  // limits go in their own list
  refused(r, "malformed op");
  r = sample();
  r.limits[0].kind = OpKind::kMount;
  refused(r, "malformed limit");
  r = sample();
  r.agent_slot = -1;
  refused(r, "error pipe or agent socket missing");
  r = sample();
  r.log_slot = 7;
  refused(r, "descriptor slot out of range");
  r = sample();
  r.limits.push_back(Op{OpKind::kSchedIdle});  // a limit, applied with the rlimits
  EXPECT_EQ(decode_bytes(encode(r), static_cast<uint32_t>(r.fds.size())).why, nullptr);
  r.ops.push_back(Op{OpKind::kSchedIdle});  // but not an op
  refused(r, "malformed op");
  r = sample();
  r.ops.resize(kMaxOps + 1, Op{OpKind::kHello});
  refused(r, "over a count limit");
}

TEST(SpawnWireTest, RefusesBrokenMessages) {
  Request r = sample();
  const std::string good = encode(r);
  auto check = [](const std::string& msg, uint32_t nfds, const char* why, bool reportable) {
    Out o = decode_bytes(msg, nfds);
    ASSERT_NE(o.why, nullptr) << why;
    EXPECT_STREQ(o.why, why);
    EXPECT_EQ(o.err_fd, reportable ? kFds[0] : -1) << why;
  };
  check(good.substr(0, 10), 5, "shorter than its header", false);
  std::string m = good;
  m[0] ^= 1;
  check(m, 5, "bad magic", false);
  check(good.substr(0, good.size() - 1), 5, "size does not match the message", false);
  check(good, 4, "descriptor count does not match", false);
  // The string table must end in a NUL, or a string could run past the message.
  m = good;
  m.back() = 'x';
  check(m, 5, "string table not terminated", true);
  // A string offset past the table.
  m = good;
  // The header is 96 bytes (spawn/wire.cpp); ops[0].a lies 16 bytes into the first op.
  uint32_t bad = 0x7fffffff;
  std::memcpy(&m[96 + 16], &bad, sizeof bad);
  check(m, 5, "malformed op", true);
  // A count that does not fit the message.
  m = good;
  uint32_t ops = 5;
  std::memcpy(&m[52], &ops, sizeof ops);  // Header::n_ops
  check(m, 5, "sections do not add up to the message", true);
}

}  // namespace
}  // namespace tp::spawn
