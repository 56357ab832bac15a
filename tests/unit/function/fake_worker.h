// A Worker for unit tests of the function service: it records every call and completes
// one only when the test says so (never inline, as real workers promise).
#pragma once

#include <boost/json.hpp>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "function/worker.h"
#include "function/zygote_codec.h"

namespace tp::function::testing {

// The JSON head of a payload a child would read (zygote_codec.h encode_payload).
inline boost::json::object payload_head(const std::string& payload) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i)
    n |= static_cast<uint32_t>(static_cast<unsigned char>(payload[i])) << (8 * i);
  return boost::json::parse(payload.substr(4, n)).as_object();
}

class FakeWorker : public Worker {
 public:
  struct Call {
    uint32_t id;
    zygote::CallMeta meta;
    std::string payload;
    Done done;
    bool cancelled = false;
  };

  explicit FakeWorker(std::string id) : id_(std::move(id)) {}
  const std::string& id() const override { return id_; }
  uint32_t start(const zygote::CallMeta& meta, std::string payload, Done done) override {
    std::lock_guard l(mu_);
    uint32_t id = next_++;
    calls_.push_back(Call{id, meta, std::move(payload), std::move(done)});
    ++started_;
    return id;
  }
  void cancel(uint32_t call) override {
    std::lock_guard l(mu_);
    for (auto& c : calls_)
      if (c.id == call) c.cancelled = true;
  }
  void set_on_lost(std::function<void(const Error&)> cb) override {
    std::lock_guard l(mu_);
    on_lost_ = std::move(cb);
  }
  bool alive() const override {
    std::lock_guard l(mu_);
    return alive_;
  }
  void destroy() override {
    std::lock_guard l(mu_);
    destroyed_ = true;
    alive_ = false;
  }

  // Test side.
  size_t pending() const {
    std::lock_guard l(mu_);
    return calls_.size();
  }
  size_t started() const {
    std::lock_guard l(mu_);
    return started_;
  }
  bool destroyed() const {
    std::lock_guard l(mu_);
    return destroyed_;
  }
  std::vector<Call> take_all() {
    std::lock_guard l(mu_);
    std::vector<Call> out(std::make_move_iterator(calls_.begin()),
                          std::make_move_iterator(calls_.end()));
    calls_.clear();
    return out;
  }
  // Removes the call at `index` (order of start) and returns it, for the test to finish.
  Call take(size_t index = 0) {
    std::lock_guard l(mu_);
    Call c = std::move(calls_.at(index));
    calls_.erase(calls_.begin() + static_cast<long>(index));
    return c;
  }
  // The worker dies: its calls fail (as a real one's do), then on_lost runs.
  void lose() {
    std::deque<Call> calls;
    std::function<void(const Error&)> f;
    {
      std::lock_guard l(mu_);
      alive_ = false;
      calls.swap(calls_);
      f = on_lost_;
    }
    Error e{Code::kUnavailable, 0, "worker " + id_ + " lost"};
    for (auto& c : calls) c.done(std::unexpected(e));
    if (f) f(e);
  }

 private:
  const std::string id_;
  mutable std::mutex mu_;
  std::deque<Call> calls_;
  uint32_t next_ = 1;
  size_t started_ = 0;
  bool alive_ = true;
  bool destroyed_ = false;
  std::function<void(const Error&)> on_lost_;
};

// A step that ended with this exit code and stdout.
inline StepResult step_exited(int64_t code, std::string out = "") {
  StepResult s;
  s.exit_code = code;
  s.stdout_data = std::move(out);
  s.verdict = verdict_of(s);
  return s;
}

}  // namespace tp::function::testing
