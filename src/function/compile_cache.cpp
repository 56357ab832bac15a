#include "function/compile_cache.h"

#include <algorithm>

#include "common/sha256.h"

namespace tp::function {

namespace {

// Length-prefixed fields, so that no two different field lists hash alike.
class FieldHash {
 public:
  void field(std::string_view s) {
    uint64_t n = s.size();
    h_.update(&n, sizeof(n));
    h_.update(s);
  }
  std::string hex() { return h_.hex_digest(); }

 private:
  Sha256 h_;
};

}  // namespace

std::string CompileCache::key(const LanguageDef& lang, std::string_view source,
                              const std::vector<File>& files) {
  FieldHash h;
  h.field("tidepool-fn-compile-v1");
  h.field(lang.image);
  for (const auto& a : lang.compile) h.field(a);
  h.field(lang.file);
  h.field(lang.binary);
  for (const auto& [k, v] : lang.env) {
    h.field(k);
    h.field(v);
  }
  h.field(source);
  std::vector<const File*> sorted;
  for (const auto& f : files) sorted.push_back(&f);
  std::sort(sorted.begin(), sorted.end(),
            [](const File* a, const File* b) { return a->path < b->path; });
  for (const File* f : sorted) {
    h.field(f->path);
    h.field(std::to_string(f->mode));
    h.field(f->data);
  }
  return h.hex();
}

CompileCache::Lookup CompileCache::lookup(const std::string& key, Waiter w, EntryPtr* hit) {
  std::lock_guard lock(mu_);
  if (auto it = entries_.find(key); it != entries_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    ++hits_;
    *hit = it->second.entry;
    return Lookup::kHit;
  }
  auto [it, fresh] = compiling_.try_emplace(key);
  it->second.push_back(std::move(w));
  if (fresh) {
    ++misses_;
    return Lookup::kLead;
  }
  ++hits_;  // served by a compile someone else started
  return Lookup::kWait;
}

std::vector<CompileCache::Waiter> CompileCache::finish(const std::string& key, Result<EntryPtr> r) {
  std::lock_guard lock(mu_);
  std::vector<Waiter> waiters;
  if (auto it = compiling_.find(key); it != compiling_.end()) {
    waiters = std::move(it->second);
    compiling_.erase(it);
  }
  if (r && *r) {
    const StepResult& c = (*r)->compile;
    bool cacheable = c.verdict == Verdict::kOk ||
                     (c.verdict == Verdict::kRuntimeError && c.error.empty() && c.signal == 0);
    uint64_t bytes = (*r)->binary.size() + c.stdout_data.size() + c.stderr_data.size() + 256;
    if (cacheable && bytes <= max_bytes_ && !entries_.count(key)) {
      lru_.push_front(key);
      entries_[key] = Slot{*r, bytes, lru_.begin()};
      bytes_ += bytes;
      evict_locked();
    }
  }
  return waiters;
}

void CompileCache::evict_locked() {
  while (bytes_ > max_bytes_ && !lru_.empty()) {
    auto it = entries_.find(lru_.back());
    bytes_ -= it->second.bytes;
    entries_.erase(it);
    lru_.pop_back();
  }
}

CompileCache::Stats CompileCache::stats() const {
  std::lock_guard lock(mu_);
  return Stats{hits_, misses_, entries_.size(), bytes_};
}

}  // namespace tp::function
