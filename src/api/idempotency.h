// Idempotency and the trajectory log's HTTP side: every state-changing call's answer
// is recorded in the step log (node/step_log.h) before it is sent, and a repeated
// Idempotency-Key gets the recorded answer without anything running again
// (api/openapi.yaml, info; docs/trajectory-log.md).
//
// Keyed calls: every answer, 5xx included, is recorded durably before it is sent (in
// the log of the sandbox the path names, when the node knows it, else node-wide), so
// a repeat is answered from the log also after a daemon restart, for as long as the
// log's retention keeps it. Before the handler runs, the call's intent goes to that log
// (StepLog::append_intent, no sync): a daemon that dies before the answer is recorded
// leaves the intent, and the next one records the call as answered 503, so that its
// retry does not run it again (StepLog::answer_interrupted). A repeat that arrives while the first
// request is still being answered waits for that answer. A key reused for a different request
// (method, path and query, or body) is refused with 409 naming both. Replays carry the headers
// `Idempotent-Replayed: true` and `Server-Timing: replay;dur=<ms>` (the time from the
// request reaching this layer to the recorded answer handed to the connection, waiting
// for the first request included). New
// keys are refused (429) while max_in_flight keyed requests are in flight or the log's
// index is full.
//
// Calls without a key (record_unkeyed, --trajectory-log on): recorded the same way in
// the log of the sandbox their path names, when that sandbox exists; they are not
// indexed and never replayed. Calls about no sandbox are recorded only with a key.
//
// A record holds the request (method, target, body digest, the body itself up to the
// log's max_request_body), the caller, the answer (inline or in a side file), a summary
// of it (api/step_summary.h) and the times it arrived and was answered.
//
// In memory: the log's key index and the requests in flight; recorded answers are read
// from disk when replayed, and a big answer goes to disk as it is produced (a streamed
// one) or at once (a whole one). Without a step log (set_log not called) calls run
// unrecorded.
//
// Thread rules: safe from any thread.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "api/http_server.h"
#include "node/step_log.h"

namespace tp::api {

class IdempotencyCache {
 public:
  static constexpr size_t kMaxKeyLength = 200;

  explicit IdempotencyCache(size_t max_in_flight = 100000) : max_in_flight_(max_in_flight) {}
  // Drains the log's writer (its callbacks use this object) when this holds the last reference.
  ~IdempotencyCache();
  void set_log(std::shared_ptr<node::StepLog> log);
  // Records calls without a key too, on the sandboxes `known` says exist. Set before serving.
  void record_unkeyed(std::function<bool(const std::string& sandbox_id)> known);
  // Which sandboxes the node knows (live or ended): a keyed call whose path names
  // another goes to the node-wide log, so that no request makes a log for a sandbox
  // that never was. Unset: every sandbox id counts. Set before serving.
  void set_sandbox_known(std::function<bool(const std::string& sandbox_id)> exists);

  // Handles a request carrying an Idempotency-Key. Returns a responder to answer the
  // request with (it records the answer), or nullptr when the request was answered
  // from the record, is waiting for the first one, or was refused.
  std::shared_ptr<Responder> begin(const Request& req, const std::string& key,
                                   std::shared_ptr<Responder> res);
  // A state-changing request without a key: a responder that records its answer, or
  // `res` itself when it is not recorded.
  std::shared_ptr<Responder> record(const Request& req, std::shared_ptr<Responder> res);
  // Answers with the recorded answer of `key` in the log of sandbox `scope` (as a
  // repeat would get it), waiting for it while it is in flight; 404 when that log has
  // no call with that key.
  void fetch(const std::string& key, const std::string& scope, std::shared_ptr<Responder> res);
  // True while a repeat of `key` is waiting for the first request's answer.
  bool has_waiters(const std::string& key);
  size_t in_flight();

  // What identifies a request (method, target, sha256 and length of the body).
  static node::StepFingerprint fingerprint(const Request& req);
  // The note a keyed call's command carries (node::ExecParams::step_tag): its key and
  // what identifies the request, so that a restarted daemon can record its outcome
  // (node::step_lost_record). "" without a key.
  static std::string step_tag(const Request& req);
  // Who made a request, as the log records it: {"transport":"unix","uid":..,"gid":..}
  // or {"transport":"tcp","key_id":..,"scope":..}.
  static std::string caller_json(const Caller& c);

 private:
  struct Flight {
    node::StepFingerprint fp;
    std::string scope;
    struct Waiter {
      std::shared_ptr<Responder> res;
      std::chrono::steady_clock::time_point since;  // when the repeat arrived
    };
    std::vector<Waiter> waiters;
  };
  class Recorder;
  std::shared_ptr<Responder> recorder(const Request& req, const std::string& key, std::string scope,
                                      node::StepFingerprint fp, std::shared_ptr<Responder> res);
  // The first request's answer is recorded (or failed to be): wake its waiters.
  void finished(const std::string& key, const Result<void>& recorded);

  const size_t max_in_flight_;
  std::shared_ptr<node::StepLog> log_;
  std::function<bool(const std::string&)> known_;  // set: record calls without a key
  std::function<bool(const std::string&)> exists_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Flight>> flights_;
};

}  // namespace tp::api
