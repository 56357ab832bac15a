// The function tier's HTTP routes (native and SandboxFusion's /run_code) over a real
// FunctionService whose workers are fakes.
#include "api/function_routes.h"

#include <gtest/gtest.h>

#include <boost/json.hpp>

#include "../function/fake_worker.h"
#include "api/sandbox_fusion.h"
#include "common/json_util.h"
#include "slow_responder.h"

namespace tp::api {
namespace {

namespace json = boost::json;
using function::FunctionService;
using function::RunResult;
using function::StepResult;
using function::Verdict;
using function::testing::FakeWorker;
using function::testing::payload_head;
using function::testing::step_exited;
using testing::SlowResponder;

struct Routes {
  Routes() {
    function::ServiceOptions o;
    o.workers = 1;
    o.slots = 8;
    o.run_blocking = [](std::function<void()> f) { f(); };
    svc = std::make_shared<FunctionService>(
        *function::LanguageSet::load(""),
        [this](const std::string&) -> Result<std::shared_ptr<function::Worker>> {
          worker = std::make_shared<FakeWorker>("w");
          return std::shared_ptr<function::Worker>(worker);
        },
        o);
    native = std::make_unique<FunctionRoutes>(svc);
    sf = std::make_unique<SandboxFusionRoutes>(svc);
  }
  std::shared_ptr<SlowResponder> call(const std::string& method, const std::string& path,
                                      const std::string& body) {
    Request r;
    r.method = method;
    r.path = path;
    r.body = body;
    r.caller.peer = "ip:127.0.0.1";
    auto res = std::make_shared<SlowResponder>();
    EXPECT_TRUE(native->handle(r, res) || sf->handle(r, res)) << path;
    return res;
  }
  static json::object body_of(const SlowResponder& r) { return json::parse(r.body).as_object(); }

  std::shared_ptr<FunctionService> svc;
  std::shared_ptr<FakeWorker> worker;
  std::unique_ptr<FunctionRoutes> native;
  std::unique_ptr<SandboxFusionRoutes> sf;
};

TEST(FunctionRoutes, RunAnswersTheResult) {
  Routes t;
  auto res = t.call(
      "POST", "/v1/functions/run",
      R"J({"language":"python","source":"print(input())","stdin":"hi","timeout":2.5,"memory_mb":128,"files":{"d.txt":"eHk="},"args":["a"]})J");
  EXPECT_FALSE(res->sent);
  auto c = t.worker->take();
  EXPECT_EQ(c.meta.timeout_ms, 2500u);
  EXPECT_EQ(c.meta.memory_bytes, 128ull << 20);
  auto head = payload_head(c.payload);
  EXPECT_EQ(head.at("argv").as_array().back().as_string(), "a");
  EXPECT_NE(c.payload.find("xy"), std::string::npos);
  StepResult s = step_exited(0, "hi\n");
  s.stderr_data = std::string("\xff\xfe", 2);
  s.wall_us = 1234;
  c.done(s);
  ASSERT_TRUE(res->sent);
  EXPECT_EQ(res->status, 200);
  auto o = Routes::body_of(*res);
  EXPECT_EQ(o.at("verdict").as_string(), "ok");
  EXPECT_EQ(o.at("stdout").as_string(), "hi\n");
  EXPECT_EQ(o.at("exit_code").as_int64(), 0);
  EXPECT_EQ(o.at("stderr_b64").as_string(), "//4=");  // not UTF-8: the bytes too
  EXPECT_DOUBLE_EQ(o.at("wall_ms").as_double(), 1.23);
  EXPECT_TRUE(o.at("compile").is_null());
}

TEST(FunctionRoutes, BadRequestsAreFourHundreds) {
  Routes t;
  for (const char* body : {R"J({"source":"x"})J", R"J({"language":"python"})J",
                           R"J({"language":"python","source":"x","timeout":-1})J",
                           R"J({"language":"python","source":"x","color":1})J",
                           R"J({"language":"cobol","source":"x"})J",
                           R"J({"language":"python","source":"x","stdin":"a","stdin_b64":"YQ=="})J",
                           R"J({"language":"python","source":"x","files":{"a":"!!"}})J", "[1]"}) {
    auto res = t.call("POST", "/v1/functions/run", body);
    ASSERT_TRUE(res->sent) << body;
    EXPECT_EQ(res->status, 400) << body << " " << res->body;
    EXPECT_TRUE(Routes::body_of(*res).contains("message"));
  }
  auto res = t.call("GET", "/v1/functions/run", "");
  EXPECT_EQ(res->status, 400);
}

TEST(FunctionRoutes, BatchOfCasesCompilesOnce) {
  Routes t;
  auto res = t.call(
      "POST", "/v1/functions/batch",
      R"J({"language":"cpp","source":"int main(){}","cases":[{"stdin":"1"},{"stdin":"2"},{"stdin":"3"}]})J");
  auto compile = t.worker->take();
  StepResult built = step_exited(0);
  built.files.push_back(function::File{"test", "BIN", 0644});
  compile.done(built);
  auto runs = t.worker->take_all();
  ASSERT_EQ(runs.size(), 3u);
  for (auto& r : runs) r.done(step_exited(0, r.payload.substr(r.payload.size() - 1)));
  ASSERT_TRUE(res->sent);
  auto results = Routes::body_of(*res).at("results").as_array();
  ASSERT_EQ(results.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(results[i].as_object().at("stdout").as_string(), std::to_string(i + 1));
  auto bad = t.call("POST", "/v1/functions/batch",
                    R"J({"runs":[{"language":"python","source":"x"},{"language":"x"}]})J");
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("run 1"), std::string::npos);
}

TEST(FunctionRoutes, LanguagesAndStatus) {
  Routes t;
  auto l = t.call("GET", "/v1/functions/languages", "");
  auto langs = Routes::body_of(*l).at("languages").as_array();
  bool cpp = false;
  for (const auto& x : langs) cpp = cpp || x.as_object().at("name").as_string() == "cpp";
  EXPECT_TRUE(cpp);
  auto s = t.call("GET", "/v1/functions", "");
  EXPECT_EQ(s->status, 200);
  EXPECT_TRUE(Routes::body_of(*s).contains("verdicts"));
}

TEST(FunctionRoutes, AClientThatLeavesCancelsItsRun) {
  Routes t;
  auto res = t.call("POST", "/v1/functions/run", R"J({"language":"bash","source":"sleep 100"})J");
  ASSERT_TRUE(res->on_abort);
  // Fired once and dropped, as the server does (kept, it would hold the run's answer
  // callback, which holds the responder: a cycle LeakSanitizer reports).
  auto abort = std::move(res->on_abort);
  res->on_abort = nullptr;
  abort();
  auto c = t.worker->take();
  EXPECT_TRUE(c.cancelled);
}

// -- SandboxFusion -----------------------------------------------------------------

TEST(SandboxFusion, SuccessAndFailure) {
  Routes t;
  // The request verl's sandbox_fusion client sends.
  auto res = t.call(
      "POST", "/run_code",
      R"J({"compile_timeout":10,"run_timeout":10,"code":"print(input())","stdin":"3","memory_limit_MB":1024,"language":"python","files":{},"fetch_files":[]})J");
  auto c = t.worker->take();
  EXPECT_EQ(c.meta.timeout_ms, 10000u);
  EXPECT_EQ(c.meta.memory_bytes, 1024ull << 20);
  StepResult s = step_exited(0, "3\n");
  s.wall_us = 15000;
  c.done(s);
  auto o = Routes::body_of(*res);
  EXPECT_EQ(o.at("status").as_string(), "Success");
  EXPECT_EQ(o.at("message").as_string(), "");
  EXPECT_TRUE(o.at("compile_result").is_null());
  EXPECT_TRUE(o.at("executor_pod_name").is_null());
  auto run = o.at("run_result").as_object();
  EXPECT_EQ(run.at("status").as_string(), "Finished");
  EXPECT_EQ(run.at("return_code").as_int64(), 0);
  EXPECT_EQ(run.at("stdout").as_string(), "3\n");
  EXPECT_DOUBLE_EQ(run.at("execution_time").as_double(), 0.015);
}

json::object sf_of(const StepResult& run, std::optional<StepResult> compile = std::nullopt) {
  RunResult r;
  r.run = run;
  r.compile = compile;
  return sandbox_fusion_response(r, {});
}

TEST(SandboxFusion, VerdictMapping) {
  // Runtime error: non-zero exit -> Failed, Finished with its code.
  auto o = sf_of(step_exited(1));
  EXPECT_EQ(o.at("status").as_string(), "Failed");
  EXPECT_EQ(o.at("run_result").as_object().at("return_code").as_int64(), 1);
  // Killed by a signal: -N, as asyncio reports it.
  StepResult seg;
  seg.signal = 11;
  o = sf_of(seg);
  EXPECT_EQ(o.at("run_result").as_object().at("return_code").as_int64(), -11);
  EXPECT_EQ(o.at("run_result").as_object().at("status").as_string(), "Finished");
  // Memory limit: SIGKILL.
  StepResult oom;
  oom.signal = 9;
  oom.oom_killed = true;
  o = sf_of(oom);
  EXPECT_EQ(o.at("run_result").as_object().at("return_code").as_int64(), -9);
  EXPECT_EQ(o.at("status").as_string(), "Failed");
  // Timeout: TimeLimitExceeded, no return code.
  StepResult tle;
  tle.timed_out = true;
  tle.signal = 9;
  tle.stdout_data = "partial";
  o = sf_of(tle);
  EXPECT_EQ(o.at("status").as_string(), "Failed");
  EXPECT_EQ(o.at("run_result").as_object().at("status").as_string(), "TimeLimitExceeded");
  EXPECT_TRUE(o.at("run_result").as_object().at("return_code").is_null());
  EXPECT_EQ(o.at("run_result").as_object().at("stdout").as_string(), "partial");
  // Could not start: 127 with the reason on stderr.
  StepResult noexec = step_exited(127);
  noexec.error = "execve ./test: No such file or directory";
  o = sf_of(noexec);
  EXPECT_EQ(o.at("run_result").as_object().at("return_code").as_int64(), 127);
  EXPECT_NE(std::string(o.at("run_result").as_object().at("stderr").as_string()).find("execve"),
            std::string::npos);
  // Wrong answer is the client's business: a clean exit is Success whatever it printed.
  EXPECT_EQ(sf_of(step_exited(0, "41\n")).at("status").as_string(), "Success");
}

TEST(SandboxFusion, CompileErrorLeavesNoRunResult) {
  RunResult r;
  r.verdict = Verdict::kCompileError;
  StepResult c = step_exited(1);
  c.stderr_data = "error: expected ';'";
  r.compile = c;
  auto o = sandbox_fusion_response(r, {});
  EXPECT_EQ(o.at("status").as_string(), "Failed");
  EXPECT_EQ(o.at("compile_result").as_object().at("status").as_string(), "Finished");
  EXPECT_EQ(o.at("compile_result").as_object().at("return_code").as_int64(), 1);
  EXPECT_TRUE(o.at("run_result").is_null());
  StepResult slow;
  slow.timed_out = true;
  r.compile = slow;
  o = sandbox_fusion_response(r, {});
  EXPECT_EQ(o.at("compile_result").as_object().at("status").as_string(), "TimeLimitExceeded");
}

TEST(SandboxFusion, InternalFailureIsSandboxError) {
  auto o = sandbox_fusion_response(fail(Code::kUnavailable, "function worker lost"), {});
  EXPECT_EQ(o.at("status").as_string(), "SandboxError");
  EXPECT_EQ(o.at("message").as_string(), "function worker lost");
}

TEST(SandboxFusion, FetchedFiles) {
  RunResult r;
  StepResult s = step_exited(0);
  s.files.push_back(function::File{"out.txt", "data", 0644});
  r.run = s;
  auto o = sandbox_fusion_response(r, {"out.txt", "missing.txt"});
  EXPECT_EQ(o.at("files").as_object().at("out.txt").as_string(), "ZGF0YQ==");
  EXPECT_FALSE(o.at("files").as_object().contains("missing.txt"));
}

TEST(SandboxFusion, RefusalsAreFastApiShaped) {
  Routes t;
  struct Case {
    const char* body;
    const char* type;
  } cases[] = {{R"J({"language":"python"})J", "missing"},
               {R"J({"code":"x"})J", "missing"},
               {R"J({"code":1,"language":"python"})J", "string_type"},
               {R"J({"code":"x","language":"klingon"})J", "literal_error"},
               {R"J({"code":"x","language":"python","run_timeout":"soon"})J", "float_parsing"},
               {"{not json", "json_invalid"}};
  for (const auto& c : cases) {
    auto res = t.call("POST", "/run_code", c.body);
    ASSERT_TRUE(res->sent);
    EXPECT_EQ(res->status, 422) << c.body;
    auto d = Routes::body_of(*res).at("detail").as_array();
    EXPECT_EQ(d.at(0).as_object().at("type").as_string(), c.type) << c.body;
  }
}

TEST(SandboxFusion, KnownButNotServedLanguageIsSandboxError) {
  Routes t;
  auto res =
      t.call("POST", "/run_code", R"J({"code":"package main","language":"go","unknown_field":1})J");
  ASSERT_TRUE(res->sent);
  EXPECT_EQ(res->status, 200);
  auto o = Routes::body_of(*res);
  EXPECT_EQ(o.at("status").as_string(), "SandboxError");
  EXPECT_NE(std::string(o.at("message").as_string()).find("not served"), std::string::npos);
  EXPECT_EQ(t.worker, nullptr);  // nothing started
}

TEST(SandboxFusion, TimeoutsAndStringNumbers) {
  Routes t;
  auto res = t.call(
      "POST", "/run_code",
      R"J({"code":"int main(){}","language":"cpp","compile_timeout":"2.5","run_timeout":0.25,"stdin":null,"files":{"x.h":null}})J");
  auto compile = t.worker->take();
  EXPECT_EQ(compile.meta.timeout_ms, 2500u);
  StepResult built = step_exited(0);
  built.files.push_back(function::File{"test", "BIN", 0644});
  compile.done(built);
  auto run = t.worker->take();
  EXPECT_EQ(run.meta.timeout_ms, 250u);
  run.done(step_exited(0));
  auto o = Routes::body_of(*res);
  EXPECT_EQ(o.at("status").as_string(), "Success");
  EXPECT_EQ(o.at("compile_result").as_object().at("status").as_string(), "Finished");
}

}  // namespace
}  // namespace tp::api
