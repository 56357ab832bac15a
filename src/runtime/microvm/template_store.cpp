#include "runtime/microvm/template_store.h"

namespace tp::runtime::microvm {

Result<std::shared_ptr<const Template>> TemplateStore::get(const std::string& key,
                                                           const Builder& build) {
  std::unique_lock lk(mu_);
  for (;;) {
    Entry& e = entries_[key];
    if (e.ready) return e.ready;
    if (e.failed && now_() - e.failed_at < retry_after_) return std::unexpected(*e.failed);
    if (!e.building) break;
    cv_.wait(lk);  // another caller builds it
  }
  entries_[key].building = true;
  lk.unlock();
  Result<std::shared_ptr<const Template>> r = fail(Code::kInternal, "template build threw");
  try {
    r = build();
  } catch (...) {
    r = fail(Code::kInternal, "template build threw");
  }
  lk.lock();
  Entry& e = entries_[key];
  e.building = false;
  if (r && *r) {
    e.ready = *r;
    e.failed.reset();
  } else {
    e.failed = r ? Error{Code::kInternal, 0, "template build returned nothing"} : r.error();
    e.failed_at = now_();
  }
  cv_.notify_all();
  if (!e.ready) return std::unexpected(*e.failed);
  return e.ready;
}

void TemplateStore::drop(const std::string& key) {
  std::lock_guard lk(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end() && !it->second.building) entries_.erase(it);
}

size_t TemplateStore::size() {
  std::lock_guard lk(mu_);
  size_t n = 0;
  for (const auto& [k, e] : entries_) n += e.ready ? 1 : 0;
  return n;
}

}  // namespace tp::runtime::microvm
