// Idempotency: a repeated request with the same Idempotency-Key gets the answer
// recorded for the first one, and nothing runs twice (api/openapi.yaml, info).
//
// Keys live in memory for kKeep (10 minutes) after their answer; the trajectory
// log will make them durable across restarts. A repeat that arrives while the
// first request is still being answered waits for that answer. A key reused with
// a different method or path is refused with 409. Replays carry the header
// `Idempotent-Replayed: true`. When kMaxEntries keys are kept, the oldest
// answered ones are forgotten first; only when that many are still in flight
// are new keys refused (429).
//
// Thread rules: safe from any thread.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "api/http_server.h"

namespace tp::api {

class IdempotencyCache {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kKeep = std::chrono::minutes(10);
  static constexpr size_t kMaxKeyLength = 200;

  explicit IdempotencyCache(size_t max_entries = 100000) : max_entries_(max_entries) {}

  // Handles a request carrying an Idempotency-Key. Returns a responder to
  // answer the request with (it records the answer), or nullptr when the
  // request was answered from the record, is waiting for the first one, or was
  // refused.
  std::shared_ptr<Responder> begin(const Request& req, const std::string& key,
                                   std::shared_ptr<Responder> res);
  // True while a repeat of `key` is waiting for the first request's answer.
  bool has_waiters(const std::string& key);
  size_t size();

 private:
  struct Recorded {
    int status = 0;
    std::string content_type;
    std::string body;
  };
  struct Entry {
    std::string method, path;
    bool done = false;
    Recorded answer;
    std::vector<std::shared_ptr<Responder>> waiters;
  };
  class Recorder;
  void finish(const std::string& key, Recorded r);
  // Drops answered keys older than kKeep. Amortised O(1) per call.
  void expire_locked(Clock::time_point now);

  const size_t max_entries_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Entry>> entries_;
  std::deque<std::pair<Clock::time_point, std::string>> answered_;  // in answer order
};

}  // namespace tp::api
