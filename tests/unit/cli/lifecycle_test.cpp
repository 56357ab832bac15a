#include "cli/lifecycle.h"

#include <gtest/gtest.h>

#include <boost/json/parse.hpp>

#include "cli/commands.h"

namespace tp::cli {
namespace {

namespace json = boost::json;

json::array array_of(std::string_view text) { return json::parse(text).as_array(); }

TEST(CliPlacementFlags, TemplateJobStepPriorityGoToTheBody) {
  CreateFlags f;
  f.template_name = "py";
  f.job = "j-1";
  f.step = "12";
  f.priority = "best-effort";
  auto o = f.to_request().value();
  EXPECT_EQ(o.at("template").as_string(), "py");
  EXPECT_EQ(o.at("job").as_string(), "j-1");
  EXPECT_EQ(o.at("step").as_string(), "12");
  EXPECT_EQ(o.at("priority").as_string(), "best-effort");
  EXPECT_FALSE(o.contains("image"));  // the template's fields are the daemon's to fill in
}

TEST(CliPlacementFlags, BadPriorityAndStepWithoutJobAreUsageErrors) {
  CreateFlags f;
  f.priority = "urgent";
  auto r = f.to_request();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message().rfind("--priority:", 0), 0u) << r.error().message();
  f = {};
  f.step = "3";
  r = f.to_request();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message(), "--step: needs --job");
}

TEST(CliPrometheus, ParsesSamplesLabelsAndSkipsTheRest) {
  auto s = parse_prometheus(
      "# HELP tidepool_sandboxes Sandboxes by state.\n"
      "# TYPE tidepool_sandboxes gauge\n"
      "tidepool_sandboxes{state=\"running\"} 3\n"
      "tidepool_sandboxes{state=\"paused\"} 1\r\n"
      "tidepool_sandboxes{state=\"running\",node=\"n\\\"1\"} 2\n"
      "tidepool_exec_total 17 1700000000000\n"
      "garbage line\n"
      "tidepool_broken{state=\"x} 4\n"
      "tidepool_http_requests_total{code=\"200\"} 10\n"
      "tidepool_http_requests_total{code=\"404\"} 2.5\n");
  ASSERT_EQ(s.size(), 6u);
  EXPECT_EQ(s[2].labels.at("node"), "n\"1");
  EXPECT_DOUBLE_EQ(metric_sum(s, "tidepool_exec_total"), 17);
  EXPECT_DOUBLE_EQ(metric_sum(s, "tidepool_http_requests_total"), 12.5);
  EXPECT_DOUBLE_EQ(metric_sum(s, "tidepool_absent"), 0);
  auto by = metric_by(s, "tidepool_sandboxes", "state");
  EXPECT_DOUBLE_EQ(by.at("running"), 5);
  EXPECT_DOUBLE_EQ(by.at("paused"), 1);
  EXPECT_EQ(by.size(), 2u);
}

TEST(CliTop, RatesNeedTwoSamplesAndARisingCounter) {
  TopSample a, b;
  a.at = 10;
  a.metrics = parse_prometheus("tidepool_exec_total 100\n");
  b.at = 12;
  b.metrics = parse_prometheus("tidepool_exec_total 130\n");
  EXPECT_FALSE(counter_rate(b, nullptr, "tidepool_exec_total"));
  EXPECT_DOUBLE_EQ(counter_rate(b, &a, "tidepool_exec_total").value(), 15);
  EXPECT_FALSE(counter_rate(a, &b, "tidepool_exec_total"));  // went down: restarted
  EXPECT_FALSE(counter_rate(a, &a, "tidepool_exec_total"));  // no time passed
}

TEST(CliTop, FrameShowsStatesRatesPoolsAndJobs) {
  TopSample a, b;
  a.at = 0;
  a.url = b.url = "http://127.0.0.1:7070";
  a.metrics = parse_prometheus("tidepool_sandbox_creations_total 4\n");
  b.at = 2;
  b.metrics = parse_prometheus(
      "tidepool_sandboxes{state=\"running\"} 2\ntidepool_sandboxes{state=\"stopped\"} 7\n"
      "tidepool_sandbox_creations_total 10\n");
  b.pools = array_of(R"([{"template":"py","ready":3,"creating":1,"target":4,"min":2,"max":8,
                         "hits":9,"misses":1,"hit_rate":0.9,"rate_per_second":0.5,
                         "cold_create_seconds":0.25}])");
  b.jobs = array_of(R"([{"id":"j-1","name":"run7","state":"active",
                         "quota":{"sandboxes":4,"memory_mb":0,"cpus":0},
                         "use":{"sandboxes":2,"memory_mb":1024,"cpus":2,"paused":0}}])");
  std::string first = render_top(b, nullptr);
  std::string next = render_top(b, &a);
  EXPECT_NE(first.find("running 2"), std::string::npos) << first;
  EXPECT_NE(first.find("paused 0"), std::string::npos) << first;
  EXPECT_NE(first.find("stopped 7"), std::string::npos) << first;
  EXPECT_NE(next.find("creates        10     3.00"), std::string::npos) << next;
  EXPECT_NE(first.find("creates        10     -"), std::string::npos) << first;
  EXPECT_NE(first.find("Pools (1)"), std::string::npos);
  EXPECT_NE(first.find("90%"), std::string::npos) << first;
  EXPECT_NE(first.find("0.25s"), std::string::npos) << first;
  EXPECT_NE(first.find("Jobs (1)"), std::string::npos);
  EXPECT_NE(first.find("2/4"), std::string::npos) << first;  // used/quota
  EXPECT_NE(first.find("1G"), std::string::npos) << first;   // no memory quota: use alone
  EXPECT_EQ(first.find('\x1b'), std::string::npos);          // no terminal codes in a frame
}

TEST(CliTables, MissingFieldsShowAsDash) {
  auto rows = template_rows(array_of(R"([{"name":"t"}, 5])"));
  ASSERT_EQ(rows.size(), 2u);  // header + the object (a non-object is skipped)
  EXPECT_EQ(rows[1][0], "t");
  EXPECT_EQ(rows[1][1], "-");
  EXPECT_EQ(rows[1][6], "-..-");
  auto jobs = job_rows(array_of(R"([{"id":"j","state":"ended","end_reason":"expired"}])"), 0);
  EXPECT_EQ(jobs[1][7], "ended (expired)");
  EXPECT_EQ(jobs[1][3], "-");
  auto lapsed = job_rows(
      array_of(R"([{"id":"j","state":"active","lease_expires_at":"2000-01-01T00:00:00Z"}])"),
      std::time(nullptr));
  EXPECT_EQ(lapsed[1][7], "lapsed");
}

TEST(CliTables, PathSegmentEscapesSlashes) { EXPECT_EQ(path_segment("a/b c"), "a%2Fb%20c"); }

}  // namespace
}  // namespace tp::cli
