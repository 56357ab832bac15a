// Replay and branch: a fresh sandbox made like the one a trajectory log recorded (its
// image, by the recorded layer digests, its limits, env and labels), the log's calls
// re-run into it in order up to step k (a seq) or the end, each answer checked against
// the recorded one, and the first divergence reported. A branch is the same replay
// whose sandbox then stays and continues live; a plain replay removes its sandbox at
// the end unless asked to keep it.
//
// What is re-run: the calls that change a sandbox's contents (exec, file write, remove
// and mkdir, tar upload, background process start, stdin, signal and wait). Calls that
// end or copy the sandbox (DELETE of the sandbox, replay) and events are skipped. A
// call whose request body was not kept (larger than the log's maximum) cannot be re-run:
// it is reported as a divergence and skipped.
//
// What is compared: the status, and the answer's fields without those that differ run
// by run (duration, max_rss_kb, mtime, started_at, ...): for a command its exit code,
// signal, timeout and its stdout and stderr bytes (streamed or not), for a file its
// type, size, mode and owner. The sandbox's id (it is also its hostname) is read as
// the source's id wherever it appears in an answer.
//
// Keys: a replayed call is sent without a key, unless rekey_from is set: then a
// recorded key starting with it is sent as rekey_to + the rest (a branch of trajectory
// "T" recorded as "T/1", "T/2", ... becomes "B/1", "B/2", ... so that its own trainer
// fast-forwards through them).
//
// The replay runs on the calling thread and blocks (Env's functions block); run it on
// a thread of its own, never on an io thread.
//
// Thread rules: run() may be called from several threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "control/sandbox_store.h"
#include "node/service.h"
#include "node/step_log.h"

namespace tp::node {

struct ReplayRequest {
  uint64_t to_step = 0;  // 0: to the end
  std::string to_key;    // instead: up to and including the call with this key
  bool branch = false;   // keep the sandbox live afterwards
  bool keep = false;     // keep it after a plain replay too
  std::string rekey_from, rekey_to;
};

struct ReplayCall {
  std::string method, target, body, key;
};

struct ReplayAnswer {
  int status = 0;
  std::string content_type, body;
};

struct Divergence {
  uint64_t seq = 0;
  std::string key;
  std::string call;   // "POST /v1/sandboxes/<source>/exec"
  std::string field;  // "status", "exit_code", "stdout", ..., "request"
  std::string recorded, replayed;
};

struct ReplayReport {
  std::string source;
  control::SandboxRecord sandbox;  // the new sandbox (its record when created)
  bool kept = false;
  uint64_t to_step = 0;
  uint64_t replayed = 0;          // calls re-run
  std::vector<uint64_t> skipped;  // seqs of calls not re-run
  std::optional<Divergence> first;
  uint64_t divergences = 0;
  std::vector<std::string> notes;
};

class Replayer {
 public:
  struct Env {
    StepLog* log = nullptr;
    // The source's record, when its log has no "created" event (a log of an older daemon).
    std::function<Result<control::SandboxRecord>(const std::string& id)> get;
    std::function<Result<control::SandboxRecord>(CreateParams p)> create;
    std::function<ReplayAnswer(const ReplayCall& call)> dispatch;
    std::function<void(const std::string& id)> destroy;
    // The layer digests an image reference names now; unset: always use the digests.
    std::function<Result<std::vector<std::string>>(const std::string& image)> layers_of;
  };

  static Result<ReplayReport> run(const Env& env, const std::string& source,
                                  const ReplayRequest& rq);
  // Whether a recorded call is re-run: its method and its path below /v1/sandboxes/<id>.
  static bool replayable(const std::string& method, const std::string& target);
  // The first field where `got` differs from the recorded answer of `rec`. `source` and
  // `sandbox` are the two ids (the second is read as the first in `got`).
  static std::optional<Divergence> compare(const StepRecord& rec, const ReplayAnswer& got,
                                           const std::string& source, const std::string& sandbox);
};

}  // namespace tp::node
