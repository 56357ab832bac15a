// Templates of the microvm tier: one booted-and-saved VM per image and shape,
// the source of every copy-on-write clone (backend.h).
//
// A template is the guest's RAM in a sealed memfd (F_SEAL_WRITE, SHRINK, GROW:
// clones map it privately and can never change it, even by reopening it
// through /proc) plus the saved device state. TemplateStore decides when to
// build one: the first get() of a key builds it with the given function while
// later callers of that key wait for that one build (one boot per key, however
// many creates arrive at once); a failed build is remembered for `retry_after`
// so that a broken image does not cost a boot per create (callers then cold
// boot). Templates live as long as the store (the daemon's run): a restarted
// daemon builds them again on first use; clones already running keep their
// own mappings of the old memory.
//
// Thread rules: get() and drop() from any thread; `build` runs on the thread
// of the first caller of its key, without the store's lock held.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/result.h"
#include "sys/fd.h"

namespace tp::runtime::microvm {

struct Template {
  sys::UniqueFd memory;  // sealed memfd: the guest's RAM
  std::string state;     // device state (QEMU migration stream without the RAM)
  uint64_t memory_bytes = 0;
};

class TemplateStore {
 public:
  using Clock = std::chrono::steady_clock;
  using Builder = std::function<Result<std::shared_ptr<const Template>>()>;
  explicit TemplateStore(std::chrono::milliseconds retry_after = std::chrono::seconds(60),
                         std::function<Clock::time_point()> now = Clock::now)
      : retry_after_(retry_after), now_(std::move(now)) {}

  // The template of `key`, built with `build` if there is none yet.
  Result<std::shared_ptr<const Template>> get(const std::string& key, const Builder& build);
  // Forgets the template of `key` (a clone of it failed): the next get() builds anew.
  void drop(const std::string& key);
  size_t size();

 private:
  struct Entry {
    bool building = false;
    std::shared_ptr<const Template> ready;
    std::optional<Error> failed;
    Clock::time_point failed_at{};
  };
  std::chrono::milliseconds retry_after_;
  std::function<Clock::time_point()> now_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Entry> entries_;
};

}  // namespace tp::runtime::microvm
