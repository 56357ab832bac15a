// A step log (node/step_log.h) in a fresh temporary directory, removed afterwards.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "node/step_log.h"

namespace tp::node::testing {

struct TempStepLog {
  std::string dir;
  std::shared_ptr<StepLog> log;
  TempStepLog() {
    char tmpl[] = "/tmp/tp-steplog-XXXXXX";
    dir = mkdtemp(tmpl);
    StepLog::Options o;
    o.data_dir = dir;
    auto l = StepLog::open(o);
    EXPECT_TRUE(l) << (l ? "" : l.error().message());
    if (l) log = std::move(*l);
  }
  ~TempStepLog() {
    log.reset();
    std::filesystem::remove_all(dir);
  }
};

}  // namespace tp::node::testing
