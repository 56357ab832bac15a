// TrajectoryEvents: what the node itself does to a sandbox, as events in its trajectory
// log (node/step_log.h): "created" (the record a replay recreates it from: image, its
// layer digests, limits, env, labels), "process_exit" (a background process ended:
// pid, command, exit status) and "ended" (end reason and time). It installs the
// manager's hooks (ManagerOptions::on_created, on_process_exit, on_ended) and
// hands out new sandboxes' ids from the log's spares (ManagerOptions::new_id; an id
// whose create was refused goes back, ManagerOptions::drop_id).
//
// A keyed call whose command a restarted daemon found still unanswered (the daemon
// died while it ran) is recorded as answered 503 naming what happened to it (stopped;
// or, a background process, running as pid N), unless its key is recorded already:
// its retry gets that answer and the step never runs twice.
//
// "created" is durable before the create is answered; "process_exit" is appended as the
// process ends; "ended" once every call of the sandbox that was being answered is in
// the log, so it is the last record of every call that ran. Without events
// (--trajectory-log off) only the retention clock starts at the end.
//
// The log is set after the manager exists (it asks the manager what is live): until
// set_log, and after set_log(nullptr), the hooks do nothing.
//
// Thread rules: the hooks run on any thread; set_log from one thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "common/result.h"
#include "control/sandbox_store.h"
#include "node/sandbox_manager.h"
#include "node/step_log.h"

namespace tp::node {

// The detail of a "created" event, and the sandbox description read back from one.
std::string created_detail(const control::SandboxRecord& r);
Result<control::SandboxRecord> record_of_created(std::string_view detail);
std::string process_exit_detail(const ProcessInfo& info);
std::string ended_detail(const control::SandboxRecord& r);
// A keyed call's note for its command (ExecParams::step_tag): key, request, caller.
std::string step_tag(const std::string& key, const StepFingerprint& fp, const std::string& caller);
// The record of a keyed call whose command a restarted daemon found unanswered (see
// ManagerOptions::on_step_lost): answered 503, so that its retry is not run again.
Result<StepRecord> step_lost_record(const std::string& step_tag, uint32_t pid, int64_t now_us);

class TrajectoryEvents {
 public:
  // Installs the hooks into opts (replacing on_created, on_process_exit, on_ended).
  void attach(ManagerOptions& opts);
  // events: record events (else only the retention clock at a sandbox's end).
  void set_log(StepLog* log, bool events);

 private:
  struct State {
    std::atomic<StepLog*> log{nullptr};
    bool events = false;
  };
  std::shared_ptr<State> st_ = std::make_shared<State>();
};

}  // namespace tp::node
