#include "node/step_log.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

namespace tp::node {
namespace {

namespace fs = std::filesystem;
constexpr const char* kSb = "n0-0123456789ab";

class StepLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tp-steplog-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<StepLog> open(std::chrono::seconds retention = std::chrono::hours(24),
                                StepLog::IsLive live = nullptr) {
    StepLog::Options o;
    o.data_dir = dir_;
    o.retention = retention;
    o.inline_max = 1024;
    o.is_live = std::move(live);
    auto l = StepLog::open(o);
    EXPECT_TRUE(l) << (l ? "" : l.error().message());
    return l ? std::move(*l) : nullptr;
  }
  static StepRecord rec(const std::string& key, int status = 200) {
    StepRecord r;
    r.key = key;
    r.request.method = "POST";
    r.request.target = "/v1/sandboxes/" + std::string(kSb) + "/exec";
    r.request.body_sha256 = std::string(32, 'h');
    r.request.body_len = 3;
    r.request_body = "abc";
    r.status = status;
    r.content_type = "application/json";
    r.started_us = std::chrono::duration_cast<std::chrono::microseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
    r.finished_us = r.started_us + 1;
    return r;
  }
  std::string log_path() const { return dir_ + "/sandboxes/" + kSb + "/steps.log"; }
  std::string read_file(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  void write_file(const std::string& p, const std::string& data) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f << data;
  }
  std::string answer_of(StepLog& l, const std::string& key) {
    auto loc = l.find(key);
    if (!loc) return "<missing>";
    auto r = l.read(*loc, true);
    return r ? r->answer : "<error " + r.error().message() + ">";
  }
  std::string dir_;
};

TEST_F(StepLogTest, AppendThenReadBackAndAfterReopen) {
  {
    auto l = open();
    ASSERT_TRUE(l->append_sync(kSb, rec("a", 201), "answer a"));
    ASSERT_TRUE(l->append_sync("", rec("g"), "global answer"));
    auto loc = l->find("a");
    ASSERT_TRUE(loc);
    auto r = l->read(*loc, true);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 201);
    EXPECT_EQ(r->answer, "answer a");
    EXPECT_EQ(r->request, rec("a").request);
    EXPECT_EQ(r->request_body, "abc");
    EXPECT_FALSE(l->find("nope"));
  }
  EXPECT_TRUE(fs::exists(log_path()));
  EXPECT_TRUE(fs::exists(dir_ + "/steps/global.log"));
  auto l = open();
  EXPECT_EQ(l->size(), 2u);
  EXPECT_EQ(answer_of(*l, "a"), "answer a");
  EXPECT_EQ(answer_of(*l, "g"), "global answer");
  auto r = l->read(*l->find("a"), false);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->answer, "");                      // not asked for
  EXPECT_EQ(r->finished_us, r->started_us + 1);  // timing survives
}

TEST_F(StepLogTest, ScopeOfPaths) {
  EXPECT_EQ(StepLog::scope_of("/v1/sandboxes"), "");
  EXPECT_EQ(StepLog::scope_of("/v1/sandboxes/batch"), "");
  EXPECT_EQ(StepLog::scope_of("/v1/images"), "");
  EXPECT_EQ(StepLog::scope_of("/v1/sandboxes/n0-0123456789ab"), "n0-0123456789ab");
  EXPECT_EQ(StepLog::scope_of("/v1/sandboxes/n0-0123456789ab/exec"), "n0-0123456789ab");
  EXPECT_EQ(StepLog::scope_of("/v1/sandboxes/../exec"), "");
}

TEST_F(StepLogTest, BigAnswersGoToSideFiles) {
  std::string big(5000, 'x');
  big[17] = 'y';
  {
    auto l = open();
    ASSERT_TRUE(l->append_sync(kSb, rec("big"), big));
  }
  auto side_dir = dir_ + "/sandboxes/" + kSb + "/steps.d";
  std::vector<fs::path> sides(fs::directory_iterator(side_dir), {});
  ASSERT_EQ(sides.size(), 1u);
  EXPECT_EQ(fs::file_size(sides[0]), big.size());
  EXPECT_LT(fs::file_size(log_path()), 1024u);  // the record only names the side file
  // An orphan side file (a crash before its record) goes at open.
  write_file(side_dir + "/1-1.body", "orphan");
  auto l = open();
  EXPECT_EQ(answer_of(*l, "big"), big);
  EXPECT_FALSE(fs::exists(side_dir + "/1-1.body"));
  // A side file that does not match its record's checksum is an error, not an answer.
  auto s = read_file(sides[0]);
  s[17] = 'x';
  write_file(sides[0], s);
  EXPECT_EQ(answer_of(*l, "big").rfind("<error", 0), 0u);
}

TEST_F(StepLogTest, StreamedSideFile) {
  auto l = open();
  auto side = l->new_side(kSb);
  ASSERT_TRUE(side);
  ASSERT_TRUE((*side)->write("part1,"));
  ASSERT_TRUE((*side)->write("part2"));
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  l->append(kSb, rec("s"), "", std::move(*side), [&](Result<void> r, std::string) {
    EXPECT_TRUE(r);
    std::lock_guard lk(m);
    done = true;
    cv.notify_all();
  });
  std::unique_lock lk(m);
  cv.wait(lk, [&] { return done; });
  EXPECT_EQ(answer_of(*l, "s"), "part1,part2");
  // An abandoned side file is removed.
  auto other = l->new_side(kSb);
  ASSERT_TRUE(other);
  other->reset();
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_ + "/sandboxes/" + kSb + "/steps.d"), {}), 1);
}

TEST_F(StepLogTest, TornFinalRecordAtEveryByteIsTruncatedAway) {
  {
    auto l = open();
    ASSERT_TRUE(l->append_sync(kSb, rec("first"), "one"));
  }
  const auto one = read_file(log_path());
  {
    auto l = open();
    ASSERT_TRUE(l->append_sync(kSb, rec("second"), "two"));
  }
  const auto two = read_file(log_path());
  ASSERT_GT(two.size(), one.size());
  for (size_t cut = one.size(); cut < two.size(); ++cut) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    write_file(log_path(), two.substr(0, cut));
    auto l = open();
    EXPECT_EQ(answer_of(*l, "first"), "one");
    EXPECT_FALSE(l->find("second"));
    EXPECT_EQ(fs::file_size(log_path()), one.size());  // the torn bytes are gone
  }
  // The whole last record present but its bytes never written (zeros): torn too.
  std::string zeroed = one + std::string(two.size() - one.size(), '\0');
  write_file(log_path(), zeroed);
  {
    auto l = open();
    EXPECT_FALSE(l->find("second"));
    EXPECT_EQ(fs::file_size(log_path()), one.size());
    // The log goes on after the cut.
    ASSERT_TRUE(l->append_sync(kSb, rec("third"), "three"));
  }
  auto l = open();
  EXPECT_EQ(answer_of(*l, "third"), "three");
  EXPECT_EQ(answer_of(*l, "first"), "one");
  // A file cut inside its own header is started afresh.
  write_file(log_path(), two.substr(0, 5));
  l = open();
  EXPECT_EQ(l->size(), 0u);
  EXPECT_EQ(fs::file_size(log_path()), 16u);
}

TEST_F(StepLogTest, CorruptMiddleRecordStopsReadingAndKeepsTheFileAside) {
  size_t second_at = 0;
  {
    auto l = open();
    ASSERT_TRUE(l->append_sync(kSb, rec("a"), "one"));
    second_at = fs::file_size(log_path());
    ASSERT_TRUE(l->append_sync(kSb, rec("b"), "two"));
    ASSERT_TRUE(l->append_sync(kSb, rec("c"), "three"));
  }
  auto bytes = read_file(log_path());
  bytes[second_at + 20] ^= 0x40;  // inside the second record's payload
  write_file(log_path(), bytes);
  auto l = open();
  EXPECT_EQ(answer_of(*l, "a"), "one");
  EXPECT_FALSE(l->find("b"));
  EXPECT_FALSE(l->find("c"));  // reading stopped at the damage
  EXPECT_EQ(fs::file_size(log_path()), second_at);
  int aside = 0;
  for (auto& e : fs::directory_iterator(dir_ + "/sandboxes/" + kSb))
    if (e.path().filename().string().starts_with("steps.log.damaged-")) {
      ++aside;
      EXPECT_EQ(read_file(e.path()), bytes);
    }
  EXPECT_EQ(aside, 1);
  ASSERT_TRUE(l->append_sync(kSb, rec("d"), "four"));
  l.reset();
  l = open();
  EXPECT_EQ(answer_of(*l, "d"), "four");
}

TEST_F(StepLogTest, ReadDetectsAChecksumErrorAfterOpen) {
  auto l = open();
  ASSERT_TRUE(l->append_sync(kSb, rec("a"), "one"));
  auto bytes = read_file(log_path());
  bytes[bytes.size() - 3] ^= 1;
  write_file(log_path(), bytes);
  auto r = l->read(*l->find("a"), true);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("checksum"), std::string::npos);
}

TEST_F(StepLogTest, KeyReusedWithAnotherFingerprintKeepsTheFirstRequest) {
  auto l = open();
  ASSERT_TRUE(l->append_sync(kSb, rec("k"), "one"));
  auto first = l->read(*l->find("k"), false);
  ASSERT_TRUE(first);
  auto other = rec("k").request;
  other.target += "?x=1";
  EXPECT_FALSE(first->request == other);  // the caller refuses it with 409 (idempotency_test)
  EXPECT_NE(first->request.describe(), other.describe());
  EXPECT_NE(other.describe().find("?x=1"), std::string::npos);
}

TEST_F(StepLogTest, ConcurrentAppendsAllLand) {
  constexpr int kThreads = 8, kEach = 40;
  {
    auto l = open();
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
      ts.emplace_back([&, t] {
        for (int i = 0; i < kEach; ++i) {
          std::string k = "k" + std::to_string(t) + "-" + std::to_string(i);
          // Mixed: both logs, inline and side answers.
          std::string scope = (i % 2) ? std::string(kSb) : std::string();
          std::string ans = (i % 5 == 0) ? std::string(3000, static_cast<char>('a' + t)) : k;
          EXPECT_TRUE(l->append_sync(scope, rec(k), ans));
        }
      });
    for (auto& t : ts) t.join();
    EXPECT_EQ(l->size(), static_cast<size_t>(kThreads * kEach));
  }
  auto l = open();
  ASSERT_EQ(l->size(), static_cast<size_t>(kThreads * kEach));
  for (int t = 0; t < kThreads; ++t)
    for (int i = 0; i < kEach; ++i) {
      std::string k = "k" + std::to_string(t) + "-" + std::to_string(i);
      std::string want = (i % 5 == 0) ? std::string(3000, static_cast<char>('a' + t)) : k;
      EXPECT_EQ(answer_of(*l, k), want) << k;
    }
}

TEST_F(StepLogTest, RetentionDeletesEndedSandboxLogsOnly) {
  const std::string live_sb = "n0-aaaaaaaaaaaa";
  {
    auto l = open();
    ASSERT_TRUE(l->append_sync(kSb, rec("ended"), "x"));
    ASSERT_TRUE(l->append_sync(live_sb, rec("live"), "y"));
    auto old = rec("global");
    old.finished_us = 2;  // long past
    ASSERT_TRUE(l->append_sync("", old, "z"));
  }
  // Another module's file in the sandbox directory stays.
  write_file(dir_ + "/sandboxes/" + live_sb + "/other", "o");
  auto is_live = [&](const std::string& id) { return id == live_sb; };
  // Within retention: everything stays.
  {
    auto l = open(std::chrono::hours(1), is_live);
    l->sandbox_ended(kSb);
    l->sweep();
    EXPECT_TRUE(l->find("ended"));
  }
  // Past retention (0 s): the ended sandbox's log and keys go, the live one's stay;
  // the node-wide log is compacted to its recent records.
  auto l = open(std::chrono::seconds(0), is_live);
  EXPECT_FALSE(fs::exists(dir_ + "/sandboxes/" + kSb));
  EXPECT_FALSE(l->find("ended"));
  EXPECT_EQ(answer_of(*l, "live"), "y");
  EXPECT_FALSE(l->find("global"));
  EXPECT_EQ(fs::file_size(dir_ + "/steps/global.log"), 16u);
  // At runtime too: the live sandbox ends.
  l->set_is_live([](const std::string&) { return false; });
  l->sandbox_ended(live_sb);
  l->sweep();
  EXPECT_FALSE(l->find("live"));
  EXPECT_FALSE(fs::exists(dir_ + "/sandboxes/" + live_sb + "/steps.log"));
  EXPECT_TRUE(fs::exists(dir_ + "/sandboxes/" + live_sb + "/other"));
}

TEST_F(StepLogTest, ParseDuration) {
  EXPECT_EQ(*StepLog::parse_duration("90"), std::chrono::seconds(90));
  EXPECT_EQ(*StepLog::parse_duration("30m"), std::chrono::seconds(1800));
  EXPECT_EQ(*StepLog::parse_duration("24h"), std::chrono::seconds(86400));
  EXPECT_EQ(*StepLog::parse_duration("2d"), std::chrono::seconds(172800));
  EXPECT_FALSE(StepLog::parse_duration(""));
  EXPECT_FALSE(StepLog::parse_duration("h"));
  EXPECT_FALSE(StepLog::parse_duration("5w"));
}

TEST(Crc32c, KnownValue) {
  // The standard check value of CRC-32C.
  EXPECT_EQ(crc32c(0, "123456789", 9), 0xE3069283u);
  // Incremental equals one shot.
  EXPECT_EQ(crc32c(crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
}

}  // namespace
}  // namespace tp::node
