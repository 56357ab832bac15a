// Replay and branch (node/replay.h) against a real step log and fakes of the sandbox
// service: what is re-run, where, with which keys, and what counts as a divergence.
#include "node/replay.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "common/json_util.h"
#include "node/trajectory_events.h"
#include "temp_step_log.h"

namespace tp::node {
namespace {

namespace fs = std::filesystem;
constexpr const char* kSrc = "n0-5a5a5a5a5a5a";
constexpr const char* kNew = "n0-b0b0b0b0b0b0";

std::string b64(std::string_view s) { return json_util::base64_encode(s); }

std::string exec_answer(const std::string& out, int code = 0, double duration = 0.01) {
  return R"({"exit_code":)" + std::to_string(code) + R"(,"signal":0,"duration":)" +
         std::to_string(duration) + R"(,"max_rss_kb":1000,"timed_out":false,"stdout":")" +
         b64(out) + R"(","stderr":""})";
}

class ReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(log_);
    control::SandboxRecord r;
    r.id = kSrc;
    r.tier = "container";
    r.image = "tools:3";
    r.layers = {"sha256:" + std::string(64, 'a')};
    r.memory_mb = 256;
    r.cpus = 0.5;
    r.pids = 64;
    r.disk_mb = 100;
    r.ttl_seconds = 600;
    r.env = {{"A", "1"}};
    r.labels = {{"run", "7"}};
    log_->append_event(kSrc, "created", created_detail(r), false);
    call("T/1", "POST", "/exec", R"({"cmd":"echo a"})", 200, exec_answer("a\n"));
    call("", "PUT", "/files?path=%2Fx", "data", 200,
         R"({"name":"x","path":"/x","type":"file","size":4,"mode":420,"mtime":1.5})");
    call("T/2", "POST", "/exec", R"({"cmd":"date +%N"})", 200, exec_answer("111\n"));
    call("", "POST", "/replay", "{}", 200, "{}");  // not re-run
    call("T/3", "POST", "/exec", R"({"cmd":"hostname"})", 200,
         exec_answer(std::string(kSrc) + "\n"));
    call("", "DELETE", "", "", 200, "{}");  // the end: not re-run
  }
  void call(const std::string& key, const std::string& method, const std::string& below,
            const std::string& body, int status, const std::string& answer) {
    StepRecord r;
    r.key = key;
    r.request.method = method;
    r.request.target = "/v1/sandboxes/" + std::string(kSrc) + below;
    r.request.body_len = body.size();
    r.request_body = body;
    r.status = status;
    r.content_type = "application/json";
    ASSERT_TRUE(log_->append_sync(kSrc, r, answer));
  }

  // The fakes: a create that makes kNew, a dispatch that answers from `answers` by
  // the order of calls, and a destroy that counts.
  Replayer::Env env() {
    Replayer::Env e;
    e.log = log_.get();
    e.create = [this](CreateParams p) -> Result<control::SandboxRecord> {
      created = p;
      control::SandboxRecord r;
      r.id = kNew;
      r.state = "running";
      return r;
    };
    e.dispatch = [this](const ReplayCall& c) {
      calls.push_back(c);
      ReplayAnswer a{200, "application/json", "{}"};
      if (c.target.find("/exec") != std::string::npos) {
        std::string out = c.body.find("date") != std::string::npos       ? "222\n"
                          : c.body.find("hostname") != std::string::npos ? std::string(kNew) + "\n"
                                                                         : "a\n";
        a.body = exec_answer(out, 0, 0.5);  // another duration: not a divergence
      } else {
        a.body = R"({"name":"x","path":"/x","type":"file","size":4,"mode":420,"mtime":9.25})";
      }
      return a;
    };
    e.destroy = [this](const std::string& id) { destroyed.push_back(id); };
    e.layers_of = [](const std::string&) -> Result<std::vector<std::string>> {
      return std::vector<std::string>{"sha256:" + std::string(64, 'a')};
    };
    return e;
  }

  testing::TempStepLog tmp_;
  std::shared_ptr<StepLog>& log_ = tmp_.log;
  std::optional<CreateParams> created;
  std::vector<ReplayCall> calls;
  std::vector<std::string> destroyed;
};

TEST_F(ReplayTest, ReRunsTheCallsIntoAFreshSandboxAndReportsTheFirstDivergence) {
  auto rep = Replayer::run(env(), kSrc, {});
  ASSERT_TRUE(rep) << rep.error().message();
  // Created like the source (its image still names the recorded layers).
  ASSERT_TRUE(created);
  EXPECT_EQ(created->image, "tools:3");
  EXPECT_EQ(created->memory_mb, 256u);
  EXPECT_EQ(created->cpus, 0.5);
  EXPECT_EQ(created->env.at("A"), "1");
  EXPECT_EQ(created->labels.at("run"), "7");
  EXPECT_EQ(created->labels.at("replay_of"), kSrc);
  // The four content calls, in order, into the new sandbox, without keys.
  ASSERT_EQ(calls.size(), 4u);
  EXPECT_EQ(calls[0].target, "/v1/sandboxes/" + std::string(kNew) + "/exec");
  EXPECT_EQ(calls[0].body, R"({"cmd":"echo a"})");
  EXPECT_EQ(calls[1].method, "PUT");
  EXPECT_EQ(calls[1].target, "/v1/sandboxes/" + std::string(kNew) + "/files?path=%2Fx");
  EXPECT_EQ(calls[1].body, "data");
  for (const auto& c : calls) EXPECT_EQ(c.key, "");
  EXPECT_EQ(rep->replayed, 4u);
  EXPECT_EQ(rep->skipped, (std::vector<uint64_t>{5, 7}));  // replay and DELETE
  // mtime and duration differ run by run; `date` does not match; the hostname (the
  // sandbox id) is read as the source's.
  EXPECT_EQ(rep->divergences, 1u);
  ASSERT_TRUE(rep->first);
  EXPECT_EQ(rep->first->seq, 4u);
  EXPECT_EQ(rep->first->key, "T/2");
  EXPECT_EQ(rep->first->field, "stdout");
  EXPECT_EQ(rep->first->recorded, "111\n");
  EXPECT_EQ(rep->first->replayed, "222\n");
  EXPECT_EQ(rep->to_step, 7u);
  // A plain replay removes its sandbox; the new sandbox's log says what it was.
  EXPECT_FALSE(rep->kept);
  EXPECT_EQ(destroyed, std::vector<std::string>{kNew});
  auto ev = log_->list(kNew, 0, 10, false);
  ASSERT_TRUE(ev);
  ASSERT_EQ(ev->size(), 2u);
  EXPECT_EQ((*ev)[0].event, "replay");
  EXPECT_EQ((*ev)[1].event, "replay_finished");
  EXPECT_NE((*ev)[1].detail.find(R"("first_divergence":4)"), std::string::npos) << (*ev)[1].detail;
}

TEST_F(ReplayTest, ABranchStopsAtItsStepKeepsItsSandboxAndTakesNewKeys) {
  ReplayRequest rq;
  rq.to_key = "T/1";
  rq.branch = true;
  rq.rekey_from = "T/";
  rq.rekey_to = "B/";
  auto rep = Replayer::run(env(), kSrc, rq);
  ASSERT_TRUE(rep) << rep.error().message();
  EXPECT_EQ(rep->to_step, 2u);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].key, "B/1");
  EXPECT_TRUE(rep->kept);
  EXPECT_TRUE(destroyed.empty());
  EXPECT_EQ(rep->divergences, 0u);
  // Up to a seq: the unkeyed call keeps no key.
  calls.clear();
  rq = {};
  rq.to_step = 3;
  rq.rekey_from = "T/";
  rq.rekey_to = "B/";
  rep = Replayer::run(env(), kSrc, rq);
  ASSERT_TRUE(rep);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].key, "B/1");
  EXPECT_EQ(calls[1].key, "");
}

TEST_F(ReplayTest, BadBoundsAndAChangedImage) {
  ReplayRequest rq;
  rq.to_step = 99;
  auto r = Replayer::run(env(), kSrc, rq);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kInvalidArgument);
  rq = {};
  rq.to_key = "T/42";
  r = Replayer::run(env(), kSrc, rq);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kNotFound);
  EXPECT_FALSE(created);  // nothing was made
  // The image names other layers now: the recorded ones are used, by digest.
  auto e = env();
  e.layers_of = [](const std::string&) -> Result<std::vector<std::string>> {
    return std::vector<std::string>{"sha256:" + std::string(64, 'b')};
  };
  rq = {};
  rq.to_step = 1;
  r = Replayer::run(e, kSrc, rq);
  ASSERT_TRUE(r);
  EXPECT_EQ(created->image, "layers:sha256:" + std::string(64, 'a'));
  ASSERT_EQ(r->notes.size(), 1u);
  // A source without a log is an error from its record lookup.
  e.get = [](const std::string&) -> Result<control::SandboxRecord> {
    return fail(Code::kNotFound, "sandbox n0-000000000000 not found");
  };
  r = Replayer::run(e, "n0-000000000000", {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kNotFound);
}

TEST(ReplayCompare, StreamsMatchWhateverTheirChunksAndStatusesDiverge) {
  StepRecord rec;
  rec.seq = 3;
  rec.status = 200;
  rec.content_type = "application/x-ndjson";
  rec.answer = R"({"type":"started","pid":7})"
               "\n"
               R"({"type":"stdout","data":")" +
               b64("ab") +
               R"("})"
               "\n"
               R"({"type":"stdout","data":")" +
               b64("c") +
               R"("})"
               "\n"
               R"({"type":"exit","exit_code":0,"signal":0,"duration":0.1})"
               "\n";
  ReplayAnswer same{200, "application/x-ndjson",
                    R"({"type":"started","pid":9})"
                    "\n"
                    R"({"type":"stdout","data":")" +
                        b64("a") +
                        R"("})"
                        "\n"
                        R"({"type":"stdout","data":")" +
                        b64("bc") +
                        R"("})"
                        "\n"
                        R"({"type":"exit","exit_code":0,"signal":0,"duration":0.7})"
                        "\n"};
  EXPECT_FALSE(Replayer::compare(rec, same, kSrc, kNew));
  ReplayAnswer exit1 = same;
  exit1.body.replace(exit1.body.find(R"("exit_code":0)"), 13, R"("exit_code":1)");
  auto d = Replayer::compare(rec, exit1, kSrc, kNew);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->field, "exit_code");
  EXPECT_EQ(d->recorded, "0");
  EXPECT_EQ(d->replayed, "1");
  ReplayAnswer refused{409, "application/json", R"({"code":"conflict","message":"x"})"};
  d = Replayer::compare(rec, refused, kSrc, kNew);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->field, "status");
}

// A background process's start: its pid in the sandbox differs run by run (and a step
// recorded before the answer carried it has none); its handle and state do not.
TEST(ReplayCompare, AProcessStartMatchesWhateverItsOsPid) {
  StepRecord rec;
  rec.seq = 4;
  rec.status = 201;
  rec.content_type = "application/json";
  rec.answer = R"({"pid":1,"os_pid":12,"cmd":["sleep","9"],"state":"running"})";
  ReplayAnswer other_pid{201, "application/json",
                         R"({"pid":1,"os_pid":40,"cmd":["sleep","9"],"state":"running"})"};
  EXPECT_FALSE(Replayer::compare(rec, other_pid, kSrc, kNew));
  StepRecord older = rec;
  older.answer = R"({"pid":1,"cmd":["sleep","9"],"state":"running"})";
  EXPECT_FALSE(Replayer::compare(older, other_pid, kSrc, kNew));
  ReplayAnswer ended{201, "application/json", R"({"pid":1,"cmd":["sleep","9"],"state":"exited"})"};
  auto d = Replayer::compare(rec, ended, kSrc, kNew);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->field, "state");
}

TEST(ReplayCompare, WhatIsReRun) {
  const std::string sb = "/v1/sandboxes/n0-5a5a5a5a5a5a";
  EXPECT_TRUE(Replayer::replayable("POST", sb + "/exec"));
  EXPECT_TRUE(Replayer::replayable("PUT", sb + "/files?path=%2Fa"));
  EXPECT_TRUE(Replayer::replayable("DELETE", sb + "/files?path=%2Fa"));
  EXPECT_TRUE(Replayer::replayable("POST", sb + "/files/mkdir?path=%2Fd"));
  EXPECT_TRUE(Replayer::replayable("PUT", sb + "/files/tar?path=%2Fd"));
  EXPECT_TRUE(Replayer::replayable("POST", sb + "/processes"));
  EXPECT_TRUE(Replayer::replayable("POST", sb + "/processes/3/wait?timeout=1.0"));
  EXPECT_TRUE(Replayer::replayable("POST", sb + "/processes/3/signal"));
  EXPECT_TRUE(Replayer::replayable("POST", sb + "/processes/3/stdin"));
  EXPECT_FALSE(Replayer::replayable("DELETE", sb));
  EXPECT_FALSE(Replayer::replayable("POST", sb + "/replay"));
  EXPECT_FALSE(Replayer::replayable("POST", "/v1/sandboxes"));
  EXPECT_FALSE(Replayer::replayable("POST", "/v1/images/build"));
}

}  // namespace
}  // namespace tp::node
