// FairQueue: who runs next when every worker slot of the function tier is busy.
//
// Calls wait per client (an API key, a unix-socket uid or a peer address); the next
// free slot goes to the next client in round-robin order that has a call waiting and
// fewer than `per_client_in_flight` calls running. A client whose queue was empty joins
// at the front (it is the one served least recently), a served client goes to the back. So a client
// that sends a batch of 10,000 calls shares the workers with one that sends one call at a time
// instead of queueing it behind the batch, and no client holds more slots than its limit. Within a
// client, calls run in the order they came.
//
// Pure bookkeeping (ids only), unit-tested with random interleavings
// (tests/unit/function/fair_queue_test.cpp).
// Thread rules: not thread-safe; the function service calls it under its mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>

#include "common/result.h"

namespace tp::function {

class FairQueue {
 public:
  struct Options {
    size_t per_client_in_flight = 16;  // 0 = no limit
    size_t per_client_queued = 100'000;
    size_t total_queued = 1'000'000;
  };
  using Id = uint64_t;

  explicit FairQueue(Options o) : opts_(o) {}

  // Queues call `id` of `client`; kResourceExhausted when the client's or the total
  // queue is full (nothing queued then). Ids are unique while queued or running.
  Result<void> push(const std::string& client, Id id);
  // Takes a queued call out (cancelled); false when it is not queued (running or unknown).
  bool remove(Id id);
  // The next call to run, now counted as running for its client; none when no client
  // with a queued call is below its in-flight limit.
  std::optional<Id> pop();
  // A running call of `client` ended (or failed to start).
  void done(const std::string& client);

  size_t queued() const { return queued_; }
  size_t in_flight() const { return in_flight_; }
  size_t queued_of(const std::string& client) const;
  size_t in_flight_of(const std::string& client) const;

 private:
  struct Client {
    std::deque<Id> queue;
    size_t in_flight = 0;
    bool in_ring = false;
  };
  void drop_if_idle(const std::string& name);

  Options opts_;
  std::map<std::string, Client> clients_;
  std::list<std::string> ring_;                // clients with queued calls, in serving order
  std::unordered_map<Id, std::string> owner_;  // queued ids -> client
  size_t queued_ = 0;
  size_t in_flight_ = 0;
};

}  // namespace tp::function
