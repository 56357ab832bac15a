#include "api/idempotency.h"

namespace tp::api {

namespace {
// Replays carry the recorded answer whole (a stream becomes one body).
void replay(Responder& res, int status, const std::string& ct, const std::string& body) {
  res.add_header("Idempotent-Replayed", "true");
  res.send(status, ct, body);
}
}  // namespace

// Forwards the answer to the client and records it for later repeats.
class IdempotencyCache::Recorder : public Responder {
 public:
  Recorder(IdempotencyCache& cache, std::string key, std::shared_ptr<Responder> inner)
      : cache_(cache), key_(std::move(key)), inner_(std::move(inner)) {}
  ~Recorder() override {
    // An answer that never completed still releases its waiters.
    if (!done_) finish();
  }
  void send(int status, std::string ct, std::string body) override {
    {
      std::lock_guard lk(mu_);
      rec_.status = status;
      rec_.content_type = ct;
      rec_.body = body;
    }
    inner_->send(status, std::move(ct), std::move(body));
    finish();
  }
  void start_stream(int status, std::string ct) override {
    {
      std::lock_guard lk(mu_);
      rec_.status = status;
      rec_.content_type = ct;
    }
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
  void add_header(std::string n, std::string v) override { inner_->add_header(std::move(n), std::move(v)); }

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
  expire_locked(Clock::now());
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
  // Room for a new key: forget the oldest answers first.
  while (entries_.size() >= max_entries_ && !answered_.empty()) {
    auto old = entries_.find(answered_.front().second);
    if (old != entries_.end() && old->second->done) entries_.erase(old);
    answered_.pop_front();
  }
  if (entries_.size() >= max_entries_) {  // every kept key is still in flight
    lk.unlock();
    res->send_error(Error{Code::kResourceExhausted, 0, "too many keyed requests in flight"});
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
    waiters.swap(it->second->waiters);
    if (r.status >= 500) {
      // Server errors are not recorded as final: a retry may succeed.
      entries_.erase(it);
    } else {
      it->second->done = true;
      it->second->answer = r;
      answered_.emplace_back(Clock::now(), key);
    }
  }
  for (auto& w : waiters) replay(*w, r.status, r.content_type, r.body);
}

bool IdempotencyCache::has_waiters(const std::string& key) {
  std::lock_guard lk(mu_);
  auto it = entries_.find(key);
  return it != entries_.end() && !it->second->waiters.empty();
}

void IdempotencyCache::expire_locked(Clock::time_point now) {
  while (!answered_.empty() && now - answered_.front().first > kKeep) {
    auto it = entries_.find(answered_.front().second);
    if (it != entries_.end() && it->second->done) entries_.erase(it);
    answered_.pop_front();
  }
}

size_t IdempotencyCache::size() {
  std::lock_guard lk(mu_);
  return entries_.size();
}

}  // namespace tp::api
