#include "common/rate_limited_log.h"

namespace tp::log {

bool RateLimit::allow(uint64_t* suppressed) {
  std::lock_guard lk(mu_);
  auto now = now_();
  if (last_ && now - *last_ < interval_) {
    ++held_;
    if (suppressed) *suppressed = 0;
    return false;
  }
  last_ = now;
  if (suppressed) *suppressed = held_;
  held_ = 0;
  return true;
}

uint64_t RateLimit::pending() const {
  std::lock_guard lk(mu_);
  return held_;
}

}  // namespace tp::log
