#include "node/step_log.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <set>
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
                                StepLog::IsLive live = nullptr, bool inline_commit = true,
                                bool always_sync_dirs = false,
                                std::function<bool(const std::string&)> read_first = nullptr) {
    StepLog::Options o;
    o.read_first = std::move(read_first);
    o.data_dir = dir_;
    o.inline_commit = inline_commit;
    o.always_sync_dirs = always_sync_dirs;
    o.retention = retention;
    o.inline_max = 1024;
    o.is_live = std::move(live);
    o.clock = [this] { return now_us_.load(); };
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
  static std::string fmt_id(int i) {
    char b[32];
    std::snprintf(b, sizeof b, "n0-%012x", static_cast<unsigned>(i));
    return b;
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
  // The log's clock (a fake): the real time at the start, moved by the tests.
  std::atomic<int64_t> now_us_{std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count()};
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

// Open reads a small log in one go and a larger one (over 4 MiB) piece by piece: the
// same records come back, and a preallocated tail or a torn record is cut the same way.
TEST_F(StepLogTest, ALogTooLargeToReadInOneGoIsReadPieceByPiece) {
  const std::string big_tail(5 << 20, '\0');
  {
    auto l = open();
    ASSERT_TRUE(l->append_sync(kSb, rec("first"), "one"));
    ASSERT_TRUE(l->append_sync(kSb, rec("second"), "two"));
  }
  const auto two = read_file(log_path());
  write_file(log_path(), two + big_tail);  // a crash's preallocated zeros
  {
    auto l = open();
    EXPECT_EQ(answer_of(*l, "first"), "one");
    EXPECT_EQ(answer_of(*l, "second"), "two");
    EXPECT_EQ(fs::file_size(log_path()), two.size());
    ASSERT_TRUE(l->append_sync(kSb, rec("third"), "three"));
  }
  const auto three = read_file(log_path());
  ASSERT_GT(three.size(), two.size() + 3);
  write_file(log_path(), three.substr(0, three.size() - 3) + big_tail);  // torn, then zeros
  auto l = open();
  EXPECT_EQ(answer_of(*l, "second"), "two");
  EXPECT_FALSE(l->find("third"));
  EXPECT_EQ(fs::file_size(log_path()), two.size());
  EXPECT_EQ(l->info(kSb).last_seq, 2u);
}

TEST_F(StepLogTest, CorruptMiddleRecordStopsReadingAndKeepsTheFileAside) {
  size_t second_at = 0;
  {
    auto l = open();
    ASSERT_TRUE(l->append_sync(kSb, rec("a"), "one"));
    second_at = l->info(kSb).bytes;  // the file itself is larger: preallocated
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

// A whole record (its checksum holds) that this build cannot decode, say of a kind a
// newer build wrote: skipped and left in place, the records after it kept. It used to
// count as a torn tail, and the file was cut there with every record after it.
TEST_F(StepLogTest, AWholeRecordThisBuildCannotReadIsSkippedNotCutAway) {
  size_t second_at = 0;
  {
    auto l = open();
    ASSERT_TRUE(l->append_sync(kSb, rec("a"), "one"));
    second_at = l->info(kSb).bytes;
    ASSERT_TRUE(l->append_sync(kSb, rec("b"), "two"));
    ASSERT_TRUE(l->append_sync(kSb, rec("c"), "three"));
  }
  auto bytes = read_file(log_path());
  uint32_t len = 0;
  std::memcpy(&len, bytes.data() + second_at + 4, 4);
  bytes[second_at + step_format::kRecordHeader] = 77;  // its kind: none this build knows
  uint32_t crc = step_format::record_crc(
      std::string_view(bytes).substr(second_at + step_format::kRecordHeader, len));
  std::memcpy(bytes.data() + second_at + 8, &crc, 4);
  write_file(log_path(), bytes);
  {
    auto l = open();
    EXPECT_EQ(answer_of(*l, "a"), "one");
    EXPECT_FALSE(l->find("b"));
    EXPECT_EQ(answer_of(*l, "c"), "three");
    EXPECT_GE(fs::file_size(log_path()), second_at + step_format::kRecordHeader + len);
    ASSERT_TRUE(l->append_sync(kSb, rec("d"), "four"));
  }
  auto l = open();
  EXPECT_EQ(answer_of(*l, "c"), "three");
  EXPECT_EQ(answer_of(*l, "d"), "four");
  EXPECT_EQ(
      read_file(log_path()).substr(second_at, step_format::kRecordHeader + len),
      bytes.substr(second_at, step_format::kRecordHeader + len));  // still there, for a newer build
  for (auto& e : fs::directory_iterator(dir_ + "/sandboxes/" + kSb))
    EXPECT_FALSE(e.path().filename().string().starts_with("steps.log.damaged-"));
}

TEST_F(StepLogTest, ReadDetectsAChecksumErrorAfterOpen) {
  auto l = open();
  ASSERT_TRUE(l->append_sync(kSb, rec("a"), "one"));
  auto bytes = read_file(log_path());
  bytes[l->info(kSb).bytes - 3] ^= 1;  // in the record (zeros of the preallocated tail follow)
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

TEST_F(StepLogTest, AnIdleLogCommitsOnTheCallersThread) {
  for (bool inline_commit : {true, false}) {
    auto l = open(std::chrono::hours(24), nullptr, inline_commit);
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    std::thread::id ran_on;
    l->append(kSb, rec("k"), "answer", nullptr, [&](Result<void> r, std::string answer) {
      EXPECT_TRUE(r);
      EXPECT_EQ(answer, "answer");
      std::lock_guard lk(m);
      ran_on = std::this_thread::get_id();
      done = true;
      cv.notify_all();
    });
    std::unique_lock lk(m);
    if (inline_commit) {
      // Durable and answered before append() returned, without the writer thread.
      EXPECT_TRUE(done);
      EXPECT_EQ(ran_on, std::this_thread::get_id());
    } else {
      cv.wait(lk, [&] { return done; });
      EXPECT_NE(ran_on, std::this_thread::get_id());
    }
    lk.unlock();
    EXPECT_EQ(answer_of(*l, "k"), "answer");
    l.reset();
    fs::remove_all(dir_ + "/sandboxes");
  }
}

// Threads append without waiting (as the io threads do), with random pauses, and a done
// callback sometimes appends again (a follower's or a waiter's reaction): whether a
// record is committed inline or by the writer, each thread's records keep the order of
// its calls, every seq is used once, and every done runs once.
TEST_F(StepLogTest, InlineAndQueuedCommitsKeepEachCallersOrder) {
  constexpr int kThreads = 4, kEach = 60;
  for (bool inline_commit : {true, false}) {
    for (unsigned seed = 1; seed <= 3; ++seed) {
      auto l = open(std::chrono::hours(24), nullptr, inline_commit);
      std::mutex m;
      std::condition_variable cv;
      int dones = 0, nested = 0;
      auto finished = [&] {
        std::lock_guard lk(m);
        ++dones;
        cv.notify_all();
      };
      std::vector<std::thread> ts;
      for (int t = 0; t < kThreads; ++t)
        ts.emplace_back([&, t] {
          std::mt19937 rng(seed * 100 + static_cast<unsigned>(t));
          for (int i = 0; i < kEach; ++i) {
            std::string k = std::to_string(t) + "-" + std::to_string(i);
            bool again = rng() % 10 == 0;
            l->append(kSb, rec(k), k, nullptr, [&, k, again](Result<void> r, std::string) {
              EXPECT_TRUE(r) << k;
              if (again) {
                {
                  std::lock_guard lk(m);
                  ++nested;
                }
                l->append("", rec("nested-" + k), "n", nullptr,
                          [&](Result<void>, std::string) { finished(); });
              }
              finished();
            });
            if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
          }
        });
      for (auto& t : ts) t.join();
      {
        std::unique_lock lk(m);
        cv.wait(lk, [&] { return dones == kThreads * kEach + nested; });
      }
      auto all = l->list(kSb, 0, kThreads * kEach + 1, false);
      ASSERT_TRUE(all);
      ASSERT_EQ(all->size(), static_cast<size_t>(kThreads * kEach));
      std::vector<int> next(kThreads, 0);
      for (size_t i = 0; i < all->size(); ++i) {
        const auto& r = (*all)[i];
        EXPECT_EQ(r.seq, i + 1);
        int t = std::stoi(r.key.substr(0, r.key.find('-')));
        int n = std::stoi(r.key.substr(r.key.find('-') + 1));
        EXPECT_EQ(n, next[static_cast<size_t>(t)]++)
            << "inline " << inline_commit << " seed " << seed;
      }
      EXPECT_EQ(l->size(), static_cast<size_t>(kThreads * kEach + nested));
      l.reset();
      fs::remove_all(dir_ + "/sandboxes");
      fs::remove_all(dir_ + "/steps");
    }
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

// With a background reader (Options::read_first), the logs past retention are deleted by
// that reader before it reads the others: never read back, their keys never found, while
// the live sandbox's log (read at open) stays whole. Calls that touch the expired logs
// while it runs (round 1) read them back first, or find them gone; a later sweep then
// deletes what they read.
TEST_F(StepLogTest, TheBackgroundReaderDeletesExpiredLogsInsteadOfReadingThem) {
  constexpr int kLogs = 40;
  const std::string live_sb = "n0-aaaaaaaaaaaa";
  auto is_live = [&](const std::string& id) { return id == live_sb; };
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    {
      auto l = open();
      for (int i = 0; i < kLogs; ++i)
        ASSERT_TRUE(l->append_sync(fmt_id(i), rec("k" + std::to_string(i)), "x"));
      ASSERT_TRUE(l->append_sync(live_sb, rec("live"), "y"));
    }
    now_us_ += 2 * 3600 * 1000000ll;  // two hours on, with one of retention
    auto l = open(std::chrono::hours(1), is_live, true, false, is_live);
    std::thread racer;
    if (round == 1)
      racer = std::thread([&] {
        for (int i = kLogs - 1; i >= 0; --i) (void)l->info(fmt_id(i));
      });
    EXPECT_EQ(answer_of(*l, "live"), "y");
    if (racer.joinable()) racer.join();
    if (round == 0) {
      EXPECT_EQ(l->size(), 1u);  // waits for the reader: no expired record was read
      for (int i = 0; i < kLogs; ++i)
        EXPECT_FALSE(fs::exists(dir_ + "/sandboxes/" + fmt_id(i))) << i;
    } else {
      l->sweep();
    }
    for (int i = 0; i < kLogs; ++i) {
      EXPECT_FALSE(fs::exists(dir_ + "/sandboxes/" + fmt_id(i) + "/steps.log")) << i;
      EXPECT_FALSE(l->find("k" + std::to_string(i))) << i;
      EXPECT_EQ(l->info(fmt_id(i)).records, 0u) << i;
    }
    EXPECT_EQ(l->size(), 1u);
    EXPECT_EQ(l->info(live_sb).last_seq, 1u);
    l.reset();
    fs::remove_all(dir_ + "/sandboxes");
    fs::remove_all(dir_ + "/steps");
  }
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

// A version 1 record, as the step log of keyed answers wrote it: kind 1, no seq.
std::string v1_record(const std::string& key, const std::string& answer) {
  auto u32 = [](uint32_t v) {
    std::string b;
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>(v >> (8 * i)));
    return b;
  };
  auto u64 = [](uint64_t v) {
    std::string b;
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<char>(v >> (8 * i)));
    return b;
  };
  auto field = [&](uint16_t tag, const std::string& v) {
    return std::string{static_cast<char>(tag), static_cast<char>(tag >> 8)} +
           u32(static_cast<uint32_t>(v.size())) + v;
  };
  std::string p(1, '\1');
  p += field(1, key) + field(2, "POST") + field(3, "/v1/sandboxes/" + std::string(kSb) + "/exec") +
       field(4, std::string(32, 'h')) + field(5, u64(3)) + field(6, "abc") + field(10, u32(200)) +
       field(11, "application/json") + field(12, answer) + field(14, u64(answer.size())) +
       field(15, u32(crc32c(0, answer.data(), answer.size()))) + field(20, u64(1)) +
       field(21, u64(2));
  return u32(0x52535054) + u32(static_cast<uint32_t>(p.size())) + u32(step_format::record_crc(p)) +
         p;
}

TEST_F(StepLogTest, Version1FilesAreReadAndContinued) {
  fs::create_directories(dir_ + "/sandboxes/" + kSb);
  write_file(log_path(),
             step_format::file_header(1) + v1_record("old-a", "A") + v1_record("old-b", "B"));
  {
    auto l = open();
    EXPECT_EQ(answer_of(*l, "old-a"), "A");
    EXPECT_EQ(answer_of(*l, "old-b"), "B");
    auto all = l->list(kSb, 0, 10, false);
    ASSERT_TRUE(all);
    ASSERT_EQ(all->size(), 2u);
    EXPECT_EQ((*all)[0].seq, 1u);  // their place in the file
    EXPECT_EQ((*all)[1].seq, 2u);
    ASSERT_TRUE(l->append_sync(kSb, rec("new"), "N"));
    EXPECT_EQ(l->info(kSb).last_seq, 3u);
  }
  auto bytes = read_file(log_path());
  EXPECT_EQ(*step_format::parse_file_header(bytes.substr(0, 16)), 2u);
  auto l = open();
  auto all = l->list(kSb, 0, 10, true);
  ASSERT_TRUE(all);
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[2].key, "new");
  EXPECT_EQ((*all)[2].seq, 3u);
  EXPECT_EQ((*all)[0].answer, "A");
}

TEST_F(StepLogTest, ANewerFormatIsLeftAloneAndNeverWritten) {
  fs::create_directories(dir_ + "/sandboxes/" + kSb);
  std::string newer = step_format::file_header(9) + "whatever a later daemon wrote";
  write_file(log_path(), newer);
  auto l = open();
  EXPECT_FALSE(l->info(kSb).exists);
  EXPECT_FALSE(l->append_sync(kSb, rec("k"), "x"));
  EXPECT_FALSE(l->find("k"));
  l.reset();
  EXPECT_EQ(read_file(log_path()), newer);
}

TEST_F(StepLogTest, EveryRecordHasItsSeqCallsWithoutKeyAndEventsToo) {
  {
    auto l = open();
    l->append_event(kSb, "created", R"({"image":"host"})", false);
    ASSERT_TRUE(l->append_sync(kSb, rec(""), "unkeyed"));  // a call without a key
    ASSERT_TRUE(l->append_sync(kSb, rec("k"), "keyed"));
    EXPECT_EQ(l->size(), 1u);  // only keys are indexed
    auto info = l->info(kSb);
    EXPECT_EQ(info.last_seq, 3u);
    EXPECT_EQ(info.records, 3u);
  }
  auto l = open();
  auto all = l->list(kSb, 0, 100, true);
  ASSERT_TRUE(all);
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].kind, StepKind::kEvent);
  EXPECT_EQ((*all)[0].event, "created");
  EXPECT_EQ((*all)[0].detail, R"({"image":"host"})");
  EXPECT_EQ((*all)[1].kind, StepKind::kCall);
  EXPECT_EQ((*all)[1].key, "");
  EXPECT_EQ((*all)[1].answer, "unkeyed");
  EXPECT_EQ((*all)[2].key, "k");
  for (size_t i = 0; i < all->size(); ++i) EXPECT_EQ((*all)[i].seq, i + 1);
  // From a cursor, bounded.
  auto part = l->list(kSb, 1, 1, false);
  ASSERT_TRUE(part);
  ASSERT_EQ(part->size(), 1u);
  EXPECT_EQ((*part)[0].seq, 2u);
  EXPECT_TRUE(l->list(kSb, 3, 10, false)->empty());
  EXPECT_TRUE(l->list("n0-bbbbbbbbbbbb", 0, 10, false)->empty());  // no such log
}

TEST_F(StepLogTest, CallerSummaryAndLargeRequestBodiesAreKept) {
  std::string body(5000, 'q');  // > inline_max (1024): a side file
  {
    auto l = open();
    auto r = rec("big-req");
    r.request_body = body;
    r.request.body_len = body.size();
    r.caller = R"({"transport":"unix","uid":1000})";
    r.summary = R"({"exit_code":0})";
    ASSERT_TRUE(l->append_sync(kSb, r, "ok"));
    auto nokeep = rec("no-body");
    nokeep.request_body.reset();  // larger than the recorded maximum
    nokeep.request.body_len = 1 << 30;
    ASSERT_TRUE(l->append_sync(kSb, nokeep, "ok"));
  }
  auto l = open();  // also: the request's side file is named, so not an orphan
  auto all = l->list(kSb, 0, 10, false);
  ASSERT_TRUE(all);
  ASSERT_EQ(all->size(), 2u);
  const auto& r = (*all)[0];
  EXPECT_EQ(r.caller, R"({"transport":"unix","uid":1000})");
  EXPECT_EQ(r.summary, R"({"exit_code":0})");
  EXPECT_FALSE(r.request_side.empty());
  auto b = l->request_body(kSb, r);
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->has_value());
  EXPECT_EQ(**b, body);
  auto none = l->request_body(kSb, (*all)[1]);
  ASSERT_TRUE(none);
  EXPECT_FALSE(none->has_value());
  EXPECT_GE(l->info(kSb).bytes, body.size());  // side files count
}

TEST_F(StepLogTest, AnEndedEventFollowsEveryCallBeingAnswered) {
  auto l = open();
  l->hold(kSb);  // a call is being answered
  std::atomic<bool> ended_written{false};
  l->append_event(kSb, "ended", "{}", true,
                  [&](Result<void> r, std::string) { ended_written = r.has_value(); });
  l->sandbox_ended(kSb);                                                // its trim waits as well
  ASSERT_TRUE(l->append_sync(kSb, rec("late"), "answer of the call"));  // held calls still append
  EXPECT_FALSE(ended_written);
  EXPECT_FALSE(l->info(kSb).ended);
  EXPECT_TRUE(l->info(kSb).busy);
  std::mutex m;
  std::condition_variable cv;
  bool woke = false;
  l->when_after(kSb, 1, [&] {
    std::lock_guard lk(m);
    woke = true;
    cv.notify_all();
  });
  l->release(kSb);
  {
    std::unique_lock lk(m);
    cv.wait(lk, [&] { return woke; });
  }
  // Written in that order: the call, then the end.
  ASSERT_TRUE(l->append_sync(kSb, rec("after"), "x"));
  auto all = l->list(kSb, 0, 10, false);
  ASSERT_TRUE(all);
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].key, "late");
  EXPECT_EQ((*all)[1].event, "ended");
  EXPECT_TRUE(ended_written);
  EXPECT_TRUE(l->info(kSb).ended);
  EXPECT_TRUE(l->info(kSb).closed);
}

TEST_F(StepLogTest, WhenAfterRunsAtOnceOrOnTheNextAppend) {
  auto l = open();
  ASSERT_TRUE(l->append_sync(kSb, rec("a"), "1"));
  int now = 0;
  l->when_after(kSb, 0, [&] { ++now; });  // seq 1 > 0: at once
  EXPECT_EQ(now, 1);
  std::mutex m;
  std::condition_variable cv;
  int later = 0;
  l->when_after(kSb, 1, [&] {
    std::lock_guard lk(m);
    ++later;
    cv.notify_all();
  });
  EXPECT_EQ(later, 0);
  ASSERT_TRUE(l->append_sync("n0-cccccccccccc", rec("other"), "2"));  // another log: not yet
  {
    std::lock_guard lk(m);
    EXPECT_EQ(later, 0);
  }
  ASSERT_TRUE(l->append_sync(kSb, rec("b"), "3"));
  std::unique_lock lk(m);
  cv.wait(lk, [&] { return later == 1; });
  // Not held into the log's calls: its callbacks run under its fire lock and take m.
  lk.unlock();
  // Dropped callbacks never run.
  std::atomic<bool> ran{false};
  l->when_after(kSb, 5, [&] { ran = true; });
  l->drop_waiters();
  ASSERT_TRUE(l->append_sync(kSb, rec("c"), "4"));
  EXPECT_FALSE(ran);
}

TEST_F(StepLogTest, ANewLogStartsWithOneBlockThenGrowsByThePreallocatedPiece) {
  auto l = open();
  ASSERT_TRUE(l->append_sync(kSb, rec("a"), "one"));
  // Header and record in one block: a short-lived sandbox allocates no more.
  EXPECT_EQ(fs::file_size(log_path()), 4096u);
  EXPECT_LT(l->info(kSb).bytes, 4096u);
  // Past the block, the log grows by the preallocated piece (64 KiB), not by a block.
  for (int i = 0; l->info(kSb).bytes <= 4096u; ++i)
    ASSERT_TRUE(l->append_sync(kSb, rec("b" + std::to_string(i)), std::string(1000, 'x')));
  ASSERT_TRUE(l->append_sync(kSb, rec("d"), std::string(1000, 'z')));
  EXPECT_EQ(fs::file_size(log_path()), 4096u + (64u << 10));
  EXPECT_EQ(answer_of(*l, "d"), std::string(1000, 'z'));
  // Ending the sandbox gives the zeros back.
  l->sandbox_ended(kSb);
  l.reset();
  auto again = open();
  EXPECT_EQ(fs::file_size(log_path()), again->info(kSb).bytes);
  EXPECT_EQ(answer_of(*again, "a"), "one");
}

TEST_F(StepLogTest, DirectoriesSyncedWhereAskedForKeepEveryRecord) {
  {
    auto l = open(std::chrono::hours(24), nullptr, true, /*always_sync_dirs=*/true);
    ASSERT_TRUE(l->append_sync(kSb, rec("a"), "one"));
    ASSERT_TRUE(l->append_sync(kSb, rec("big"), std::string(5000, 'b')));  // a side file
    ASSERT_TRUE(l->append_sync("", rec("g"), "global"));
  }
  auto l = open();
  EXPECT_EQ(answer_of(*l, "a"), "one");
  EXPECT_EQ(answer_of(*l, "big"), std::string(5000, 'b'));
  EXPECT_EQ(answer_of(*l, "g"), "global");
}

TEST_F(StepLogTest, ALazyEventIsInTheLogWhenItsDoneRunsAndTheNextRecordFollowsIt) {
  for (bool sync_dirs : {false, true}) {
    SCOPED_TRACE(sync_dirs ? "directories fsync'ed" : "directories not fsync'ed");
    fs::remove_all(dir_ + "/sandboxes");
    {
      auto l = open(std::chrono::hours(24), nullptr, true, sync_dirs);
      uint64_t seen = 0;
      bool ran = false;
      l->append_event(
          kSb, "created", R"({"image":"x"})", false,
          [&](Result<void> r, std::string) {
            EXPECT_TRUE(r);
            seen = l->info(kSb).last_seq;
            ran = true;
          },
          /*lazy=*/true);
      EXPECT_TRUE(ran);  // an idle log writes it on this thread
      EXPECT_EQ(seen, 1u);
      ASSERT_TRUE(l->append_sync(kSb, rec("a"), "one"));  // synced: the event with it
      EXPECT_EQ(l->info(kSb).last_seq, 2u);
    }
    auto l = open();
    auto recs = l->list(kSb, 0, 10, false);
    ASSERT_TRUE(recs);
    ASSERT_EQ(recs->size(), 2u);
    EXPECT_EQ((*recs)[0].event, "created");
    EXPECT_EQ((*recs)[1].key, "a");
  }
}

TEST_F(StepLogTest, OpenDescriptorsStayBoundedHoweverManyLogsAreWritten) {
  auto fds = [] { return std::distance(fs::directory_iterator("/proc/self/fd"), {}); };
  auto l = open();
  ASSERT_TRUE(l->append_sync("", rec("g"), "g"));
  const auto before = fds();
  auto id = [](int i) { return fmt_id(i); };
  for (int i = 0; i < 100; ++i)
    ASSERT_TRUE(l->append_sync(id(i), rec("k" + std::to_string(i)), "a"));
  EXPECT_LE(fds(), before + 32);  // the recently written ones, not one per sandbox
  // A log whose descriptor was closed is opened again and goes on where it was.
  ASSERT_TRUE(l->append_sync(id(0), rec("again"), "b"));
  EXPECT_EQ(l->info(id(0)).last_seq, 2u);
  l->sandbox_ended(id(99));  // an ended sandbox's descriptor is closed
  ASSERT_TRUE(l->append_sync(id(98), rec("after"), "c"));
  l.reset();
  auto again = open();
  EXPECT_EQ(answer_of(*again, "again"), "b");
  EXPECT_EQ(answer_of(*again, "k99"), "a");
  EXPECT_EQ(again->info(id(0)).records, 2u);
}

TEST_F(StepLogTest, AnAppendThatReleasesItsHoldCommitsTheEventsThatWaitedWithIt) {
  auto l = open();
  ASSERT_TRUE(l->append_sync(kSb, rec("first"), "1"));
  l->hold(kSb);  // a call being answered
  l->append_event(kSb, "ended", R"({"end_reason":"deleted"})", /*after_calls=*/true);
  l->sandbox_ended(kSb);
  EXPECT_FALSE(l->info(kSb).ended);  // waits for the call
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  StepLogInfo seen;
  l->append(
      kSb, rec("delete"), "{}", nullptr,
      [&](Result<void> r, std::string) {
        EXPECT_TRUE(r);
        auto i = l->info(kSb);  // when the call's answer may go: its event is in too
        std::lock_guard lk(m);
        seen = i;
        done = true;
        cv.notify_all();
      },
      /*release_hold=*/true);
  std::unique_lock lk(m);
  ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(10), [&] { return done; }));
  EXPECT_TRUE(seen.ended);
  EXPECT_TRUE(seen.closed);
  EXPECT_EQ(seen.last_seq, 3u);
  auto recs = l->list(kSb, 0, 10, false);
  ASSERT_TRUE(recs);
  ASSERT_EQ(recs->size(), 3u);
  EXPECT_EQ((*recs)[1].key, "delete");  // the call, then the event that waited for it
  EXPECT_EQ((*recs)[2].event, "ended");
  EXPECT_EQ(fs::file_size(log_path()), l->info(kSb).bytes);  // trimmed in that commit
}

TEST_F(StepLogTest, APreallocatedTailLeftByACrashIsNotATornRecord) {
  std::string on_disk;
  {
    auto l = open();
    ASSERT_TRUE(l->append_sync(kSb, rec("a"), "one"));
    ASSERT_TRUE(l->append_sync(kSb, rec("b"), "two"));
    on_disk = read_file(log_path());  // what a crash leaves: the records, then zeros
    EXPECT_GT(on_disk.size(), l->info(kSb).bytes);
  }
  EXPECT_LT(fs::file_size(log_path()), on_disk.size());  // a clean stop trims it
  write_file(log_path(), on_disk);
  auto l = open();
  EXPECT_EQ(answer_of(*l, "a"), "one");
  EXPECT_EQ(answer_of(*l, "b"), "two");
  EXPECT_EQ(fs::file_size(log_path()), l->info(kSb).bytes);  // cut at open
  for (auto& e : fs::directory_iterator(dir_ + "/sandboxes/" + kSb))
    EXPECT_FALSE(e.path().filename().string().starts_with("steps.log.damaged-"));
  // A record cut short inside preallocated space (zeros after it) is torn, not damage.
  std::string two_records = read_file(log_path());
  ASSERT_TRUE(l->append_sync(kSb, rec("c"), "three"));
  l.reset();
  std::string three = read_file(log_path());
  std::string cut = three.substr(0, two_records.size() + (three.size() - two_records.size()) / 2);
  write_file(log_path(), cut + std::string(4096, '\0'));
  l = open();
  EXPECT_EQ(answer_of(*l, "b"), "two");
  EXPECT_FALSE(l->find("c"));
  EXPECT_EQ(fs::file_size(log_path()), two_records.size());
  for (auto& e : fs::directory_iterator(dir_ + "/sandboxes/" + kSb))
    EXPECT_FALSE(e.path().filename().string().starts_with("steps.log.damaged-"));
}

TEST_F(StepLogTest, RetentionRunsOnTheLogsClock) {
  const int64_t kMinute = 60'000'000;
  {
    auto l = open(std::chrono::hours(1));
    auto g = rec("global-key");
    g.finished_us = now_us_;
    ASSERT_TRUE(l->append_sync("", g, "g"));
    ASSERT_TRUE(l->append_sync(kSb, rec("sb-key"), "s"));
    l->sandbox_ended(kSb);
    // Ten minutes later: everything is still there.
    now_us_ += 10 * kMinute;
    l->sweep();
    EXPECT_EQ(answer_of(*l, "global-key"), "g");
    EXPECT_EQ(answer_of(*l, "sb-key"), "s");
    // Past the hour: the ended sandbox's log and the node-wide key are forgotten.
    now_us_ += 51 * kMinute;
    l->sweep();
    EXPECT_FALSE(l->find("global-key"));
    EXPECT_FALSE(l->find("sb-key"));
  }
  EXPECT_FALSE(fs::exists(log_path()));
}

// ---- intents: a keyed call's intent, then its answer (docs/trajectory-log.md)

// What a crash leaves: the data directory as the page cache holds it now.
std::string crash_image(const std::string& dir) {
  char tmpl[] = "/tmp/tp-steplog-crash-XXXXXX";
  std::string to = mkdtemp(tmpl);
  fs::copy(dir, to, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  return to;
}

// Logs are read back several at a time at open: every key of every log is found, each
// log continues at its own next seq, and a damaged one among them is set aside alone.
TEST_F(StepLogTest, ManyLogsReadBackAtOnceKeepEveryKeyAndTheirOwnSeqs) {
  constexpr int kLogs = 64;
  {
    auto l = open();
    for (int i = 0; i < kLogs; ++i)
      for (int j = 0; j <= i % 3; ++j)
        ASSERT_TRUE(l->append_sync(fmt_id(i),
                                   rec("k" + std::to_string(i) + "-" + std::to_string(j)),
                                   "a" + std::to_string(i)));
  }
  write_file(dir_ + "/sandboxes/" + fmt_id(7) + "/steps.log", "not a step log at all");
  auto l = open();
  for (int i = 0; i < kLogs; ++i) {
    for (int j = 0; j <= i % 3; ++j) {
      const std::string key = "k" + std::to_string(i) + "-" + std::to_string(j);
      EXPECT_EQ(answer_of(*l, key), i == 7 ? "<missing>" : "a" + std::to_string(i)) << key;
    }
    if (i != 7) {
      EXPECT_EQ(l->info(fmt_id(i)).last_seq, static_cast<uint64_t>(i % 3 + 1)) << i;
    }
  }
  ASSERT_TRUE(l->append_sync(fmt_id(5), rec("later"), "b"));
  EXPECT_EQ(l->info(fmt_id(5)).last_seq, 4u);
}

// Options::read_first: the other logs are read after open() returns, by a background
// thread; every call that touches one of them first reads it (or waits for it), so they
// serve as if read at open.
TEST_F(StepLogTest, LogsReadAfterOpenServeEveryCallAsIfReadAtOpen) {
  constexpr int kLogs = 64;
  size_t keys = 0;
  {
    auto l = open();
    for (int i = 0; i < kLogs; ++i)
      for (int j = 0; j <= i % 3; ++j, ++keys)
        ASSERT_TRUE(l->append_sync(fmt_id(i),
                                   rec("k" + std::to_string(i) + "-" + std::to_string(j)),
                                   "a" + std::to_string(i)));
  }
  write_file(dir_ + "/sandboxes/" + fmt_id(9) + "/steps.log", "not a step log at all");
  auto even = [](const std::string& id) {
    return (std::stoul(id.substr(3), nullptr, 16) % 2) == 0;
  };
  auto l = open(std::chrono::hours(24), nullptr, true, false, even);
  // Touched first (maybe before the reader gets to them): the later logs answer at once.
  for (int i = kLogs - 1; i >= 0; --i)
    if (i != 9) {
      EXPECT_EQ(l->info(fmt_id(i)).last_seq, static_cast<uint64_t>(i % 3 + 1)) << i;
    }
  ASSERT_TRUE(l->append_sync(fmt_id(5), rec("later"), "b"));
  EXPECT_EQ(l->info(fmt_id(5)).last_seq, 4u);
  auto five = l->list(fmt_id(5), 0, 100, false);
  ASSERT_TRUE(five);
  ASSERT_EQ(five->size(), 4u);
  EXPECT_EQ((*five)[2].key, "k5-2");
  EXPECT_EQ((*five)[3].key, "later");
  // A key is found whichever log holds it (find waits for the reader); the damaged log
  // read later is set aside as at open, and none of its keys is found.
  for (int i = 0; i < kLogs; ++i)
    for (int j = 0; j <= i % 3; ++j) {
      const std::string key = "k" + std::to_string(i) + "-" + std::to_string(j);
      EXPECT_EQ(answer_of(*l, key), i == 9 ? "<missing>" : "a" + std::to_string(i)) << key;
    }
  EXPECT_EQ(l->size(), keys);  // k9-0 lost with its log, "later" added
  EXPECT_EQ(l->info(fmt_id(9)).records, 0u);
  bool damaged_kept = false;
  for (const auto& e : fs::directory_iterator(dir_ + "/sandboxes/" + fmt_id(9)))
    damaged_kept |= e.path().filename().string().starts_with("steps.log.damaged-");
  EXPECT_TRUE(damaged_kept);
}

// Intents found in a log read after open are answered 503 by the reader (nothing more
// precise can come for a sandbox that is not running); a find of the key waits for it.
TEST_F(StepLogTest, AnIntentInALogReadAfterOpenIsAnswered503) {
  std::string crashed;
  {
    auto l = open();
    ASSERT_TRUE(l->append_sync(kSb, rec("a"), "answer a"));
    l->append_intent(kSb, rec("k"));
    crashed = crash_image(dir_);  // the daemon dies here
  }
  fs::remove_all(dir_);
  dir_ = crashed;
  {
    auto l = open(std::chrono::hours(24), nullptr, true, false,
                  [](const std::string&) { return false; });
    EXPECT_EQ(l->answer_interrupted(), 0u);  // none in the logs read at open
    auto loc = l->find("k");
    ASSERT_TRUE(loc);
    auto r = l->read(*loc, true);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 503);
    EXPECT_NE(r->answer.find("the daemon restarted while this call was being answered"),
              std::string::npos);
  }
  auto l = open();
  EXPECT_EQ(l->answer_interrupted(), 0u);  // answered once, durably
  auto all = l->list(kSb, 0, 100, false);
  ASSERT_TRUE(all);
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[1].key, "k");
  EXPECT_EQ((*all)[1].status, 503);
}

// Random interleavings of the reader with calls on the logs it has not read yet: reads,
// appends, followers and finds from several threads. Every log ends with its records in
// order, each once, whoever read it; a log closed while the reader runs leaves every log
// to the next open.
TEST_F(StepLogTest, CallsRacingTheReaderOfLaterLogsKeepEveryLogWhole) {
  constexpr int kLogs = 48, kThreads = 4, kOps = 60;
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(round);
    std::vector<int> before(kLogs, 0);
    {
      auto l = open();
      for (int i = 0; i < kLogs; ++i) {
        before[i] = 1 + (i + round) % 4;
        for (int j = 0; j < before[i]; ++j)
          ASSERT_TRUE(l->append_sync(fmt_id(i), rec(fmt_id(i) + "-" + std::to_string(j)), "x"));
      }
    }
    // Stopped at once, mid-read: nothing is lost for the next open.
    open(std::chrono::hours(24), nullptr, true, false, [](const std::string&) {
      return false;
    }).reset();
    std::vector<std::atomic<int>> added(kLogs);
    {
      auto l = open(std::chrono::hours(24), nullptr, true, false,
                    [](const std::string&) { return false; });
      std::vector<std::thread> ts;
      for (int t = 0; t < kThreads; ++t)
        ts.emplace_back([&, t] {
          std::mt19937 rng(1000 * round + t);
          for (int n = 0; n < kOps; ++n) {
            const int i = static_cast<int>(rng() % kLogs);
            const std::string id = fmt_id(i);
            switch (rng() % 4) {
              case 0: {
                const int k = added[i]++;
                EXPECT_TRUE(l->append_sync(
                    id, rec(id + "-t" + std::to_string(t) + "-" + std::to_string(k)), "y"));
                break;
              }
              case 1:
                EXPECT_GE(l->info(id).records, static_cast<uint64_t>(before[i]));
                break;
              case 2: {
                std::atomic<bool> ran{false};
                l->when_after(id, 0, [&] { ran = true; });
                EXPECT_TRUE(ran);  // it has records: at once
                break;
              }
              default:
                EXPECT_EQ(answer_of(*l, id + "-0"), "x");
            }
          }
        });
      for (auto& t : ts) t.join();
    }
    auto l = open();
    for (int i = 0; i < kLogs; ++i) {
      auto all = l->list(fmt_id(i), 0, 1000, false);
      ASSERT_TRUE(all);
      ASSERT_EQ(all->size(), static_cast<size_t>(before[i] + added[i].load())) << i;
      std::set<std::string> seen;
      for (size_t j = 0; j < all->size(); ++j) {
        EXPECT_EQ((*all)[j].seq, j + 1) << i;
        EXPECT_TRUE(seen.insert((*all)[j].key).second) << (*all)[j].key;
        if (j < static_cast<size_t>(before[i])) {
          EXPECT_EQ((*all)[j].key, fmt_id(i) + "-" + std::to_string(j));
        }
      }
    }
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
}

TEST_F(StepLogTest, AnIntentThenItsAnswerIsOneResultAndNoEntry) {
  {
    auto l = open();
    ASSERT_TRUE(l->append_sync(kSb, rec("a"), "answer a"));
    l->append_intent(kSb, rec("k"));
    EXPECT_FALSE(l->find("k"));  // not answered yet
    EXPECT_EQ(l->info(kSb).records, 1u);
    ASSERT_TRUE(l->append_sync(kSb, rec("k"), "answer k"));
    l->append_intent("", rec("g"));  // node-wide ones alike
    ASSERT_TRUE(l->append_sync("", rec("g"), "answer g"));
    EXPECT_EQ(answer_of(*l, "k"), "answer k");
  }
  auto l = open();
  EXPECT_EQ(l->answer_interrupted(), 0u);
  EXPECT_EQ(answer_of(*l, "k"), "answer k");
  EXPECT_EQ(answer_of(*l, "g"), "answer g");
  // The intent is no entry of the log: seqs stay consecutive, it is not listed.
  auto all = l->list(kSb, 0, 100, false);
  ASSERT_TRUE(all);
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].key, "a");
  EXPECT_EQ((*all)[1].key, "k");
  EXPECT_EQ((*all)[1].seq, 2u);
  EXPECT_EQ((*all)[1].kind, StepKind::kCall);
  EXPECT_EQ(l->info(kSb).last_seq, 2u);
  ASSERT_TRUE(l->append_sync(kSb, rec("b"), "answer b"));
  EXPECT_EQ(l->info(kSb).last_seq, 3u);
}

TEST_F(StepLogTest, AnIntentWithoutAnAnswerIsAnswered503AfterTheRestart) {
  std::string crashed;
  StepRecord call_k;
  {
    auto l = open();
    ASSERT_TRUE(l->append_sync(kSb, rec("a"), "answer a"));
    call_k = rec("k");
    l->append_intent(kSb, call_k);
    l->append_intent("", rec("g"));
    crashed = crash_image(dir_);  // the daemon dies here
    ASSERT_TRUE(l->append_sync(kSb, rec("k"), "answer k"));
  }
  fs::remove_all(dir_);
  dir_ = crashed;
  {
    auto l = open();
    EXPECT_FALSE(l->find("k"));  // until answer_interrupted (after recover, at start)
    EXPECT_EQ(l->answer_interrupted(), 2u);
    EXPECT_EQ(l->answer_interrupted(), 0u);  // once
    for (const char* key : {"k", "g"}) {
      SCOPED_TRACE(key);
      auto loc = l->find(key);
      ASSERT_TRUE(loc);
      auto r = l->read(*loc, true);
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 503);
      EXPECT_EQ(r->content_type, "application/json");
      EXPECT_NE(r->answer.find(R"("code":"unavailable")"), std::string::npos) << r->answer;
      EXPECT_NE(r->answer.find("the daemon restarted while this call was being answered"),
                std::string::npos)
          << r->answer;
      EXPECT_EQ(r->request, rec(key).request);    // a retry with another request is a 409
      EXPECT_EQ(r->finished_us, now_us_.load());  // answered now
    }
    EXPECT_EQ(l->read(*l->find("k"), false)->started_us, call_k.started_us);  // it began then
    auto all = l->list(kSb, 0, 100, false);
    ASSERT_TRUE(all);
    ASSERT_EQ(all->size(), 2u);
    EXPECT_EQ((*all)[1].key, "k");
    EXPECT_EQ((*all)[1].seq, 2u);
  }
  // Answered: the next start finds its answer after it.
  auto l = open();
  EXPECT_EQ(l->answer_interrupted(), 0u);
  EXPECT_EQ(l->list(kSb, 0, 100, false)->size(), 2u);
  EXPECT_EQ(l->read(*l->find("k"), false)->status, 503);
}

// A keyed command's own outcome (recorded by the sandbox manager's recover(), before
// answer_interrupted) is the key's one record.
TEST_F(StepLogTest, AnOutcomeRecordedAfterOpenIsTheKeysOnlyRecord) {
  std::string crashed;
  {
    auto l = open();
    l->append_intent(kSb, rec("exec/1"));
    crashed = crash_image(dir_);
  }
  fs::remove_all(dir_);
  dir_ = crashed;
  {
    auto l = open();
    ASSERT_TRUE(l->append_sync(kSb, rec("exec/1", 503), "its command was stopped"));
    EXPECT_EQ(l->answer_interrupted(), 0u);
    EXPECT_EQ(answer_of(*l, "exec/1"), "its command was stopped");
  }
  auto l = open();
  EXPECT_EQ(l->answer_interrupted(), 0u);
  auto all = l->list(kSb, 0, 100, false);
  ASSERT_TRUE(all);
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ(answer_of(*l, "exec/1"), "its command was stopped");
}

// A key answered without its record (the answer could not be recorded) and run again:
// the second intent has its answer after it.
TEST_F(StepLogTest, AnIntentRepeatedBeforeItsAnswerIsAnswered) {
  {
    auto l = open();
    l->append_intent(kSb, rec("k"));
    l->append_intent(kSb, rec("k"));
    ASSERT_TRUE(l->append_sync(kSb, rec("k"), "answer k"));
  }
  auto l = open();
  EXPECT_EQ(l->answer_interrupted(), 0u);
  EXPECT_EQ(answer_of(*l, "k"), "answer k");
}

TEST_F(StepLogTest, ATornIntentIsCutAwayAndItsKeyIsUnknown) {
  {
    auto l = open();
    ASSERT_TRUE(l->append_sync(kSb, rec("a"), "answer a"));
  }
  const auto one = read_file(log_path());
  {
    auto l = open();
    l->append_intent(kSb, rec("k"));
  }
  const auto two = read_file(log_path());  // a clean stop trims the preallocated zeros
  ASSERT_GT(two.size(), one.size());
  for (size_t cut = one.size() + 1; cut < two.size(); ++cut) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    write_file(log_path(), two.substr(0, cut));
    auto l = open();
    EXPECT_EQ(l->answer_interrupted(), 0u);  // a power loss mid-write: no call began
    EXPECT_FALSE(l->find("k"));
    EXPECT_EQ(answer_of(*l, "a"), "answer a");
    EXPECT_EQ(fs::file_size(log_path()), one.size());
  }
  // Whole, it is a call the daemon died answering.
  write_file(log_path(), two);
  auto l = open();
  EXPECT_EQ(l->answer_interrupted(), 1u);
  EXPECT_EQ(l->read(*l->find("k"), false)->status, 503);
  EXPECT_EQ(l->info(kSb).last_seq, 2u);
}

TEST(Crc32c, KnownValue) {
  // The standard check value of CRC-32C.
  EXPECT_EQ(crc32c(0, "123456789", 9), 0xE3069283u);
  // Incremental equals one shot.
  EXPECT_EQ(crc32c(crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
}

}  // namespace
}  // namespace tp::node
