#include "function/compile_cache.h"

#include <openssl/evp.h>

#include <algorithm>

namespace tp::function {

namespace {

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr); }
  ~Sha256() { EVP_MD_CTX_free(ctx_); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  // Length-prefixed, so that no two different field lists hash alike.
  void field(std::string_view s) {
    uint64_t n = s.size();
    EVP_DigestUpdate(ctx_, &n, sizeof(n));
    EVP_DigestUpdate(ctx_, s.data(), s.size());
  }
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx_, md, &len);
    static const char* kHex = "0123456789abcdef";
    std::string out;
    for (unsigned i = 0; i < len; ++i) {
      out.push_back(kHex[md[i] >> 4]);
      out.push_back(kHex[md[i] & 15]);
    }
    return out;
  }

 private:
  EVP_MD_CTX* ctx_;
};

}  // namespace

std::string CompileCache::key(const LanguageDef& lang, std::string_view source,
                              const std::vector<File>& files) {
  Sha256 h;
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
