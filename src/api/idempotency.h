// Idempotency: a repeated request with the same Idempotency-Key gets the answer
// recorded for the first one, and nothing runs twice (api/openapi.yaml, info).
//
// Every answer of a keyed request, 5xx included, is recorded durably in the step
// log (node/step_log.h) before it is sent, so a repeat is answered from the log
// also after a daemon restart, for as long as the log's retention keeps it. In
// memory there are only the log's key index and the requests still in flight;
// recorded answers are read from disk when replayed, and a big answer goes to
// disk as it is produced (a streamed one) or at once (a whole one).
//
// A repeat that arrives while the first request is still being answered waits
// for that answer. A key reused for a different request (method, path and
// query, or body) is refused with 409 naming both. Replays carry the header
// `Idempotent-Replayed: true`. New keys are refused (429) while max_in_flight
// keyed requests are in flight or the log's index is full.
//
// Without a step log (set_log not called) keyed requests run unrecorded.
//
// Thread rules: safe from any thread.
#pragma once

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

  // Handles a request carrying an Idempotency-Key. Returns a responder to
  // answer the request with (it records the answer), or nullptr when the
  // request was answered from the record, is waiting for the first one, or was
  // refused.
  std::shared_ptr<Responder> begin(const Request& req, const std::string& key,
                                   std::shared_ptr<Responder> res);
  // True while a repeat of `key` is waiting for the first request's answer.
  bool has_waiters(const std::string& key);
  size_t in_flight();

  // What identifies a request (method, target, sha256 and length of the body).
  static node::StepFingerprint fingerprint(const Request& req);

 private:
  struct Flight {
    node::StepFingerprint fp;
    std::vector<std::shared_ptr<Responder>> waiters;
  };
  class Recorder;
  // The first request's answer is recorded (or failed to be): wake its waiters.
  void finished(const std::string& key, const Result<void>& recorded);

  const size_t max_in_flight_;
  std::shared_ptr<node::StepLog> log_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Flight>> flights_;
};

}  // namespace tp::api
