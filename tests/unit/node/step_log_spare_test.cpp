// The step log's spare logs: sandbox logs made ahead, handed out by id, renamed into
// place by the first record, and recovered or removed at open.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "node/step_log.h"

namespace tp::node {
namespace {

namespace fs = std::filesystem;

class StepLogSpareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tp-stepspare-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<StepLog> open(size_t spares, bool always_sync_dirs = false) {
    StepLog::Options o;
    o.data_dir = dir_;
    o.spares = spares;
    o.always_sync_dirs = always_sync_dirs;
    o.make_id = [this] {
      char b[32];
      std::snprintf(b, sizeof b, "n0-%012x", next_id_++);
      return std::string(b);
    };
    auto l = StepLog::open(o);
    EXPECT_TRUE(l) << (l ? "" : l.error().message());
    return l ? std::move(*l) : nullptr;
  }
  // Waits until `n` spares are ready (the spare thread makes them).
  static bool wait_ready(StepLog& l, size_t n) {
    for (int i = 0; i < 2000; ++i) {
      if (l.spares_ready() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  static StepRecord call(const std::string& key) {
    StepRecord r;
    r.key = key;
    r.request.method = "POST";
    r.request.target = "/v1/sandboxes/x/exec";
    r.request.body_sha256 = std::string(32, 'h');
    r.request.body_len = 0;
    r.status = 200;
    r.content_type = "application/json";
    r.started_us = 1;
    r.finished_us = 2;
    return r;
  }
  std::set<std::string> entries(const std::string& sub) {
    std::set<std::string> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_ + "/" + sub, ec))
      out.insert(e.path().filename().string());
    return out;
  }
  std::string dir_;
  unsigned next_id_ = 1;
};

TEST_F(StepLogSpareTest, ASpareIsMadeAheadAndItsFirstRecordMovesItIntoPlace) {
  auto l = open(4);
  ASSERT_TRUE(wait_ready(*l, 4));
  EXPECT_EQ(entries("steps/spare").size(), 4u);
  auto id = l->take_spare();
  ASSERT_TRUE(id);
  // Made ahead: directory, file, header and one block, before any record.
  const std::string spare = dir_ + "/steps/spare/" + *id + "/steps.log";
  struct stat st {};
  ASSERT_EQ(::stat(spare.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 4096);
  EXPECT_FALSE(entries("sandboxes").count(*id));

  ASSERT_TRUE(l->append_sync(*id, call("k1"), "one"));
  EXPECT_TRUE(entries("sandboxes").count(*id));
  EXPECT_FALSE(entries("steps/spare").count(*id));
  ASSERT_TRUE(l->append_sync(*id, call("k2"), "two"));
  auto recs = l->list(*id, 0, 10, true);
  ASSERT_TRUE(recs);
  ASSERT_EQ(recs->size(), 2u);
  EXPECT_EQ((*recs)[0].seq, 1u);
  EXPECT_EQ((*recs)[1].answer, "two");
  auto info = l->info(*id);
  EXPECT_TRUE(info.exists);
  EXPECT_EQ(info.last_seq, 2u);
}

TEST_F(StepLogSpareTest, HandedOutSparesAreRefilledAndNeverHandedOutTwice) {
  auto l = open(4);
  ASSERT_TRUE(wait_ready(*l, 4));
  std::set<std::string> seen;
  for (int i = 0; i < 40; ++i) {
    auto id = l->take_spare();
    if (!id) {
      ASSERT_TRUE(wait_ready(*l, 1));
      id = l->take_spare();
    }
    ASSERT_TRUE(id);
    EXPECT_TRUE(seen.insert(*id).second) << *id << " handed out twice";
    ASSERT_TRUE(l->append_sync(*id, call("key-" + *id), "x"));
  }
  ASSERT_TRUE(wait_ready(*l, 2));
  for (const auto& id : seen) EXPECT_TRUE(entries("sandboxes").count(id)) << id;
}

// A create refused before its sandbox existed (a quota, shutdown) gives its spare back:
// ready again when nobody saw the id, else removed. They stayed taken, their
// directories under steps/spare, until the daemon stopped.
TEST_F(StepLogSpareTest, ASpareNoSandboxGotGoesBackOrAway) {
  auto l = open(4);
  ASSERT_TRUE(wait_ready(*l, 4));
  auto a = l->take_spare();
  ASSERT_TRUE(a);
  l->return_spare(*a, true);
  EXPECT_EQ(l->spares_ready(), 4u);
  EXPECT_EQ(l->take_spare(), a);  // handed out again, and only once
  auto b = l->take_spare();
  ASSERT_TRUE(b);
  l->return_spare(*b, false);
  EXPECT_FALSE(entries("steps/spare").count(*b));
  l->return_spare(*b, true);  // not taken (any more): ignored
  l->return_spare("n0-neverseen", true);
  for (int i = 0; i < 8; ++i) {
    auto id = l->take_spare();
    if (!id) {
      ASSERT_TRUE(wait_ready(*l, 1));
      id = l->take_spare();
    }
    ASSERT_TRUE(id);
    EXPECT_NE(*id, *b);
    EXPECT_NE(*id, "n0-neverseen");
    l->return_spare(*id, true);
    EXPECT_EQ(l->take_spare(), id);
    ASSERT_TRUE(l->append_sync(*id, call("key-" + *id), "x"));
  }
  ASSERT_TRUE(l->append_sync(*a, call("key-a"), "x"));
  EXPECT_TRUE(entries("sandboxes").count(*a));
}

TEST_F(StepLogSpareTest, WithoutSparesTakeSpareGivesNothing) {
  auto l = open(0);
  EXPECT_FALSE(l->take_spare());
  EXPECT_EQ(l->spares_ready(), 0u);
  EXPECT_TRUE(entries("steps/spare").empty());
}

TEST_F(StepLogSpareTest, AnExistingSandboxDirectoryKeepsItsFilesAndGetsTheLog) {
  auto l = open(2);
  ASSERT_TRUE(wait_ready(*l, 1));
  auto id = l->take_spare();
  ASSERT_TRUE(id);
  // Another module's file there first (background process output).
  fs::create_directories(dir_ + "/sandboxes/" + *id);
  std::ofstream(dir_ + "/sandboxes/" + *id + "/proc-1.out") << "out";
  ASSERT_TRUE(l->append_sync(*id, call("k"), "a"));
  EXPECT_TRUE(fs::exists(dir_ + "/sandboxes/" + *id + "/proc-1.out"));
  EXPECT_TRUE(fs::exists(dir_ + "/sandboxes/" + *id + "/steps.log"));
  EXPECT_FALSE(entries("steps/spare").count(*id));
  EXPECT_TRUE(l->find("k"));
}

TEST_F(StepLogSpareTest, ACleanStopRemovesUnusedSpares) {
  {
    auto l = open(4);
    ASSERT_TRUE(wait_ready(*l, 4));
    auto taken = l->take_spare();  // handed out, never written
    ASSERT_TRUE(taken);
  }
  EXPECT_TRUE(entries("steps/spare").empty());
}

// A crash (here: files as a crash leaves them) between a spare's first record and the
// rename reaching the disk: open moves it into place; a spare with no record goes.
TEST_F(StepLogSpareTest, OpenMovesASpareWithRecordsIntoPlaceAndRemovesEmptyOnes) {
  std::string used, unused;
  {
    auto l = open(4);
    ASSERT_TRUE(wait_ready(*l, 4));
    used = *l->take_spare();
    unused = *l->take_spare();
    ASSERT_TRUE(l->append_sync(used, call("kept"), "the answer"));
  }
  // As if the rename had not reached the disk, and the stop had not cleaned up.
  fs::rename(dir_ + "/sandboxes/" + used, dir_ + "/steps/spare/" + used);
  fs::create_directories(dir_ + "/steps/spare/" + unused);
  {
    std::ofstream f(dir_ + "/steps/spare/" + unused + "/steps.log", std::ios::binary);
    f << std::string(4096, '\0');
  }
  auto l = open(0);
  EXPECT_TRUE(entries("steps/spare").empty());
  EXPECT_TRUE(entries("sandboxes").count(used));
  EXPECT_FALSE(entries("sandboxes").count(unused));
  auto loc = l->find("kept");
  ASSERT_TRUE(loc);
  auto r = l->read(*loc, true);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->answer, "the answer");
}

TEST_F(StepLogSpareTest, SparesWorkWhereDirectoriesAreSynced) {
  auto l = open(2, /*always_sync_dirs=*/true);
  ASSERT_TRUE(wait_ready(*l, 2));
  auto id = l->take_spare();
  ASSERT_TRUE(id);
  ASSERT_TRUE(l->append_sync(*id, call("k"), "a"));
  EXPECT_TRUE(l->find("k"));
}

// Many threads take spares and write their first records while the spare thread
// refills: every id is distinct and every log ends up in place with its records.
TEST_F(StepLogSpareTest, ConcurrentTakersAndTheRefillAgree) {
  auto l = open(8);
  ASSERT_TRUE(wait_ready(*l, 8));
  std::mutex m;
  std::set<std::string> ids;
  std::atomic<int> fresh{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        auto id = l->take_spare();
        if (!id) {
          // None ready: the caller makes its own id (as the manager does).
          char b[32];
          std::snprintf(b, sizeof b, "n9-%06x%06x", t, i);
          id = b;
          fresh++;
        }
        ASSERT_TRUE(l->append_sync(*id, call(*id + "/1"), "a"));
        ASSERT_TRUE(l->append_sync(*id, call(*id + "/2"), "b"));
        std::lock_guard lk(m);
        EXPECT_TRUE(ids.insert(*id).second);
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(ids.size(), 100u);
  for (const auto& id : ids) {
    EXPECT_TRUE(entries("sandboxes").count(id)) << id;
    EXPECT_EQ(l->info(id).last_seq, 2u) << id;
  }
  for (const auto& s : entries("steps/spare")) EXPECT_FALSE(ids.count(s)) << s;
}

}  // namespace
}  // namespace tp::node
