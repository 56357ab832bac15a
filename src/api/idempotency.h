// Idempotency: a repeated request with the same Idempotency-Key gets the answer
// recorded for the first one, and nothing runs twice (api/openapi.yaml, info).
//
// Keys live in memory for at least kKeep (10 minutes); the trajectory log will
// make them durable across restarts. A repeat that arrives while the first
// request is still being answered waits for that answer. A key reused with a
// different method or path is refused with 409.
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

namespace tp::api {

class IdempotencyCache {
 public:
  static constexpr auto kKeep = std::chrono::minutes(10);
  static constexpr size_t kMaxKeyLength = 200;
  static constexpr size_t kMaxEntries = 100000;

  // Handles a request carrying an Idempotency-Key. Returns a responder to
  // answer the request with (it records the answer), or nullptr when the
  // request was answered from the cache, is waiting for the first one, or was
  // refused.
  std::shared_ptr<Responder> begin(const Request& req, const std::string& key,
                                   std::shared_ptr<Responder> res);
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
    std::chrono::steady_clock::time_point finished{};
  };
  class Recorder;
  void finish(const std::string& key, Recorded r);
  void expire_locked();

  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Entry>> entries_;
};

}  // namespace tp::api
