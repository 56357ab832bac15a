#include <gtest/gtest.h>

#include <boost/json/serialize.hpp>

#include "cli/commands.h"

namespace tp::cli {
namespace {

TEST(CliCreateFlags, OnlyGivenFieldsInApiUnits) {
  CreateFlags f;
  EXPECT_EQ(boost::json::serialize(f.to_request().value()), "{}");
  f.image = "host";
  f.memory = "512M";
  f.cpus = "0.5";
  f.disk = "2G";
  f.ttl = "10m";
  f.idle_timeout = "1.5s";
  f.pids = 64;
  f.labels = {"team=rl", "run=a=b"};
  f.env = {"FOO=bar", "EMPTY="};
  auto o = f.to_request().value();
  EXPECT_EQ(o.at("image").as_string(), "host");
  EXPECT_EQ(o.at("memory_mb").as_int64(), 512);
  EXPECT_DOUBLE_EQ(o.at("cpus").as_double(), 0.5);
  EXPECT_EQ(o.at("disk_mb").as_int64(), 2048);
  EXPECT_EQ(o.at("ttl_seconds").as_int64(), 600);
  EXPECT_EQ(o.at("idle_timeout_seconds").as_int64(), 2);  // never rounded down
  EXPECT_EQ(o.at("pids").as_int64(), 64);
  EXPECT_EQ(o.at("labels").at("run").as_string(), "a=b");
  EXPECT_EQ(o.at("env").at("EMPTY").as_string(), "");
  EXPECT_FALSE(o.contains("tier"));
}

TEST(CliCreateFlags, BadValuesNameTheFlag) {
  auto expect_bad = [](CreateFlags f, const std::string& flag) {
    auto r = f.to_request();
    ASSERT_FALSE(r.has_value()) << flag;
    EXPECT_EQ(r.error().code, Code::kInvalidArgument);
    EXPECT_EQ(r.error().message().rfind(flag + ":", 0), 0u) << r.error().message();
  };
  CreateFlags f;
  f.memory = "lots";
  expect_bad(f, "--memory");
  f = {};
  f.disk = "-1G";
  expect_bad(f, "--disk");
  for (const char* c : {"0", "-1", "x", "1x", "nan", "inf", ""}) {
    f = {};
    f.cpus = c;
    if (f.cpus.empty()) continue;  // empty means "not given"
    expect_bad(f, "--cpus");
  }
  f = {};
  f.pids = 0;
  expect_bad(f, "--pids");
  f = {};
  f.ttl = "0";
  expect_bad(f, "--ttl");
  f = {};
  f.ttl = "soon";
  expect_bad(f, "--ttl");
  f = {};
  f.idle_timeout = "-1";
  expect_bad(f, "--idle-timeout");
  f = {};
  f.labels = {"nolabel"};
  expect_bad(f, "--label");
  f = {};
  f.env = {"=x"};
  expect_bad(f, "--env");
}

TEST(CliExecFlags, BuildsAStreamingRequest) {
  ExecFlags f;
  f.cmd = {"python3", "-c", "print(6*7)"};
  f.timeout = "1m";
  f.env = {"A=1"};
  f.cwd = "/tmp";
  f.user = 1000;
  auto o = f.to_request().value();
  EXPECT_EQ(boost::json::serialize(o.at("cmd")), R"j(["python3","-c","print(6*7)"])j");
  EXPECT_TRUE(o.at("stream").as_bool());
  EXPECT_DOUBLE_EQ(o.at("timeout").as_double(), 60);
  EXPECT_EQ(o.at("env").at("A").as_string(), "1");
  EXPECT_EQ(o.at("cwd").as_string(), "/tmp");
  EXPECT_EQ(o.at("user").as_int64(), 1000);
  EXPECT_FALSE(o.contains("stdin"));
}

TEST(CliExecFlags, BadValues) {
  ExecFlags f;
  EXPECT_FALSE(f.to_request().has_value());  // no command
  f.cmd = {"true"};
  f.timeout = "0";
  EXPECT_FALSE(f.to_request().has_value());
  f.timeout = "-3s";
  EXPECT_FALSE(f.to_request().has_value());
  f.timeout = "";
  f.user = -1;
  EXPECT_FALSE(f.to_request().has_value());
  f.user.reset();
  f.env = {"novalue"};
  EXPECT_FALSE(f.to_request().has_value());
}

}  // namespace
}  // namespace tp::cli
