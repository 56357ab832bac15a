#include "api/idempotency.h"

namespace tp::api {

namespace {
void replay(Responder& res, int status, const std::string& ct, const std::string& body) {
  // Replays carry the recorded answer whole (a stream becomes one body).
  res.send(status, ct, body);
}
}  // namespace

// Forwards the answer to the client and records it for later repeats.
class IdempotencyCache::Recorder : public Responder {
 public:
  Recorder(IdempotencyCache& cache, std::string key, std::shared_ptr<Responder> inner)
      : cache_(cache), key_(std::move(key)), inner_(std::move(inner)) {}
  ~Recorder() override {
    // An answer that never completed (client vanished mid-stream) still
    // releases waiters with what was produced.
    if (!done_) finish();
  }
  void send(int status, std::string ct, std::string body) override {
    rec_.status = status;
    rec_.content_type = ct;
    rec_.body = body;
    inner_->send(status, std::move(ct), std::move(body));
    finish();
  }
  void start_stream(int status, std::string ct) override {
    rec_.status = status;
    rec_.content_type = ct;
    inner_->start_stream(status, std::move(ct));
  }
  void write_chunk(std::string d) override {
    {
      std::lock_guard lk(mu_);
      rec_.body += d;
    }
    inner_->write_chunk(std::move(d));
  }
  void end_stream() override {
    inner_->end_stream();
    finish();
  }
  void set_on_abort(std::function<void()> cb) override { inner_->set_on_abort(std::move(cb)); }

 private:
  void finish() {
    Recorded r;
    {
      std::lock_guard lk(mu_);
      if (done_) return;
      done_ = true;
      r = rec_;
    }
    if (r.status == 0) {
      r.status = 503;
      r.content_type = "application/json";
      r.body = R"({"code":"unavailable","message":"the first request with this key did not complete"})";
    }
    cache_.finish(key_, std::move(r));
  }
  IdempotencyCache& cache_;
  std::string key_;
  std::shared_ptr<Responder> inner_;
  std::mutex mu_;
  Recorded rec_;
  bool done_ = false;
};

std::shared_ptr<Responder> IdempotencyCache::begin(const Request& req, const std::string& key,
                                                   std::shared_ptr<Responder> res) {
  if (key.empty() || key.size() > kMaxKeyLength) {
    res->send_error(Error{Code::kInvalidArgument, 0, "Idempotency-Key must be 1-200 characters"});
    return nullptr;
  }
  std::unique_lock lk(mu_);
  expire_locked();
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    auto e = it->second;
    if (e->method != req.method || e->path != req.path) {
      lk.unlock();
      res->send_error(Error{Code::kConflict, 0,
                            "Idempotency-Key was used for " + e->method + " " + e->path});
      return nullptr;
    }
    if (!e->done) {
      e->waiters.push_back(std::move(res));
      return nullptr;
    }
    Recorded a = e->answer;
    lk.unlock();
    replay(*res, a.status, a.content_type, a.body);
    return nullptr;
  }
  if (entries_.size() >= kMaxEntries) {
    lk.unlock();
    res->send_error(Error{Code::kResourceExhausted, 0, "too many idempotency keys in flight"});
    return nullptr;
  }
  auto e = std::make_shared<Entry>();
  e->method = req.method;
  e->path = req.path;
  entries_[key] = e;
  return std::make_shared<Recorder>(*this, key, std::move(res));
}

void IdempotencyCache::finish(const std::string& key, Recorded r) {
  std::vector<std::shared_ptr<Responder>> waiters;
  {
    std::lock_guard lk(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return;
    auto& e = *it->second;
    e.done = true;
    e.finished = std::chrono::steady_clock::now();
    // Server errors are not recorded as final: a retry may succeed.
    if (r.status >= 500) {
      waiters.swap(e.waiters);
      entries_.erase(it);
    } else {
      e.answer = r;
      waiters.swap(e.waiters);
    }
  }
  for (auto& w : waiters) replay(*w, r.status, r.content_type, r.body);
}

void IdempotencyCache::expire_locked() {
  auto now = std::chrono::steady_clock::now();
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second->done && now - it->second->finished > kKeep) it = entries_.erase(it);
    else ++it;
  }
}

size_t IdempotencyCache::size() {
  std::lock_guard lk(mu_);
  return entries_.size();
}

}  // namespace tp::api
