// The state file a backend leaves for a restarted daemon (sandbox_state.h).
#include "runtime/sandbox_state.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace tp::runtime {
namespace {

TEST(SandboxState, RoundTripAndTheProcessItNames) {
  char tmpl[] = "/tmp/tp-state-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ASSERT_TRUE(write_state(dir, ::getpid()).has_value());
  auto st = read_state(dir);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->pid, ::getpid());
  EXPECT_EQ(st->start, proc_start_time(::getpid()));
  EXPECT_TRUE(open_saved(*st).has_value());
  // The same pid with another start time is another process.
  SavedState other = *st;
  other.start += 1;
  auto r = open_saved(other);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kNotFound);
  std::ofstream(dir + "/state") << "pid x\n";
  EXPECT_EQ(read_state(dir).error().code, Code::kNotFound);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(read_state(dir).error().code, Code::kNotFound);
}

TEST(SandboxState, Names) {
  EXPECT_TRUE(valid_sandbox_name("n0-3fa9c21b7e04"));
  EXPECT_FALSE(valid_sandbox_name(""));
  EXPECT_FALSE(valid_sandbox_name("../x"));
  EXPECT_FALSE(valid_sandbox_name(std::string(64, 'a')));
}

}  // namespace
}  // namespace tp::runtime
