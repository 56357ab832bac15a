#include "node/sandbox.h"

#include <unistd.h>

namespace tp::node {

BgProc::~BgProc() { close_files(); }

void BgProc::close_files() {
  if (out_fd >= 0) ::close(out_fd);
  if (err_fd >= 0) ::close(err_fd);
  out_fd = err_fd = -1;
}

Sandbox::Sandbox(control::SandboxRecord r, State s) : rec(std::move(r)), state(s), id_(rec.id) {
  if (auto n = stored_name(s)) rec.state = std::string(*n);
}

bool Sandbox::apply(Event e) {
  auto to = next_state(state, e);
  if (!to) return false;
  state = *to;
  if (auto n = stored_name(state)) rec.state = std::string(*n);
  return true;
}

void Sandbox::enqueue(Op op) {
  ops_in_flight_.fetch_add(1);
  {
    std::lock_guard lk(qmu_);
    queue_.push_back(std::move(op));
    if (busy_) return;
    busy_ = true;
  }
  drain();
}

void Sandbox::drain() {
  for (;;) {
    Op op;
    {
      std::lock_guard lk(qmu_);
      if (queue_.empty()) {
        busy_ = false;
        return;
      }
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    // 0: op running, 1: Done called while it ran, 2: op returned first.
    auto phase = std::make_shared<std::atomic<int>>(0);
    op([self = shared_from_this(), phase] {
      ops_in_flight_.fetch_sub(1);
      if (phase->exchange(1) == 2) self->drain();
    });
    if (phase->exchange(2) == 0) return;  // Done comes later and drains then
  }
}

}  // namespace tp::node
