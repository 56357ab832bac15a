#include "api/idempotency.h"

#include <openssl/evp.h>

#include <chrono>

#include "common/log.h"

namespace tp::api {

namespace {

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Replays carry the recorded answer whole (a stream becomes one body).
void replay(Responder& res, int status, const std::string& ct, std::string body) {
  res.add_header("Idempotent-Replayed", "true");
  res.send(status, ct, std::move(body));
}

void replay_record(Responder& res, Result<node::StepRecord>& rec) {
  if (!rec) {
    res.send_error(
        Error{Code::kInternal, 0, "the recorded answer cannot be read: " + rec.error().message()});
    return;
  }
  replay(res, rec->status, rec->content_type, std::move(rec->answer));
}

constexpr const char* kIncomplete =
    R"({"code":"unavailable","message":"the first request with this key did not complete"})"
    "\n";

}  // namespace

node::StepFingerprint IdempotencyCache::fingerprint(const Request& req) {
  node::StepFingerprint fp;
  fp.method = req.method;
  fp.target = req.target;
  if (req.upload) {  // hashed as it was spooled
    fp.body_sha256 = req.upload->sha256();
    fp.body_len = req.upload->size();
    return fp;
  }
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(req.body.data(), req.body.size(), d, &len, EVP_sha256(), nullptr);
  fp.body_sha256.assign(reinterpret_cast<const char*>(d), len);
  fp.body_len = req.body.size();
  return fp;
}

// Forwards the answer to the client once it is recorded; a streamed answer goes
// to a side file chunk by chunk and to the client at once, but its end (and the
// terminal exit/error event of an exec stream) only once the record is durable,
// so the client never sees a complete answer that is not recorded.
class IdempotencyCache::Recorder : public Responder {
 public:
  Recorder(IdempotencyCache& cache, std::string key, std::string scope, node::StepRecord rec,
           std::shared_ptr<Responder> inner)
      : cache_(cache),
        key_(std::move(key)),
        scope_(std::move(scope)),
        rec_(std::move(rec)),
        inner_(std::move(inner)) {}
  ~Recorder() override {
    // An answer that never completed is recorded as such; it also releases the waiters.
    std::lock_guard lk(mu_);
    if (done_) return;
    done_ = true;
    if (rec_.status == 0) {
      rec_.status = 503;
      rec_.content_type = "application/json";
      side_.reset();
      commit(kIncomplete, false);
    } else {
      commit("", true);  // a stream that was not ended: what it sent is recorded
    }
  }
  void send(int status, std::string ct, std::string body) override {
    std::lock_guard lk(mu_);
    if (done_) return;
    done_ = true;
    rec_.status = status;
    rec_.content_type = std::move(ct);
    commit(std::move(body), false);
  }
  void start_stream(int status, std::string ct) override {
    std::lock_guard lk(mu_);
    if (done_ || rec_.status) return;
    rec_.status = status;
    rec_.content_type = ct;
    auto side = cache_.log_->new_side(scope_);
    if (side)
      side_ = std::move(*side);
    else
      spdlog::error("step log: key {}: {}", key_, side.error().message());
    inner_->start_stream(status, std::move(ct));
  }
  void write_chunk(std::string d) override {
    std::lock_guard lk(mu_);
    if (done_ || d.empty()) return;
    if (side_) (void)side_->write(d);  // a failure is seen at commit
    if (!held_.empty()) inner_->write_chunk(std::move(held_));
    held_.clear();
    // Output goes on at once (a stream must not lag); the terminal event of an exec
    // stream (its last line) waits for the record.
    // (Output lines carry base64, so these fields cannot appear in them.)
    if (d.find(R"("type":"exit")") != std::string::npos ||
        d.find(R"("type":"error")") != std::string::npos)
      held_ = std::move(d);
    else
      inner_->write_chunk(std::move(d));
  }
  // Bulk data (no exec events among it): recorded and passed on with its flow control.
  void write_chunk(std::string d, std::function<void(bool)> written) override {
    std::lock_guard lk(mu_);
    if (done_) {
      if (written) written(false);
      return;
    }
    if (side_ && !d.empty()) (void)side_->write(d);
    if (!held_.empty()) inner_->write_chunk(std::move(held_));
    held_.clear();
    inner_->write_chunk(std::move(d), std::move(written));
  }
  void end_stream() override {
    std::lock_guard lk(mu_);
    if (done_) return;
    done_ = true;
    commit("", true);
  }
  // A truncated answer must not be replayed as a complete one: the record says
  // the first request did not complete (the client already has its 200 head).
  void abort_stream() override {
    std::lock_guard lk(mu_);
    if (done_) return;
    done_ = true;
    inner_->abort_stream();
    rec_.status = 503;
    rec_.content_type = "application/json";
    side_.reset();
    held_.clear();
    commit(kIncomplete, false);
  }
  void set_on_abort(std::function<void()> cb) override { inner_->set_on_abort(std::move(cb)); }
  void add_header(std::string n, std::string v) override {
    inner_->add_header(std::move(n), std::move(v));
  }

 private:
  // Appends the record; the answer goes to the client (and the waiters) when it is durable.
  void commit(std::string body, bool stream) {
    rec_.finished_us = now_us();
    if (stream && !side_) {
      // The side file could not be made: nothing can be recorded; the client gets its answer.
      if (!held_.empty()) inner_->write_chunk(std::move(held_));
      inner_->end_stream();
      cache_.finished(key_, fail(Code::kInternal, "streamed answer could not be recorded"));
      return;
    }
    auto* cache = &cache_;
    int status = rec_.status;
    std::string ct = rec_.content_type;
    cache_.log_->append(scope_, std::move(rec_), std::move(body), std::move(side_),
                        [cache, key = key_, inner = inner_, stream, status, ct = std::move(ct),
                         held = std::move(held_)](Result<void> r, std::string answer) mutable {
                          if (stream) {
                            if (!held.empty()) inner->write_chunk(std::move(held));
                            inner->end_stream();
                          } else {
                            inner->send(status, std::move(ct), std::move(answer));
                          }
                          cache->finished(key, r);
                        });
  }

  IdempotencyCache& cache_;
  const std::string key_, scope_;
  std::mutex mu_;
  node::StepRecord rec_;
  std::shared_ptr<Responder> inner_;
  std::unique_ptr<node::StepSideFile> side_;
  std::string held_;
  bool done_ = false;
};

IdempotencyCache::~IdempotencyCache() { log_.reset(); }

void IdempotencyCache::set_log(std::shared_ptr<node::StepLog> log) { log_ = std::move(log); }

std::shared_ptr<Responder> IdempotencyCache::begin(const Request& req, const std::string& key,
                                                   std::shared_ptr<Responder> res) {
  if (key.empty() || key.size() > kMaxKeyLength) {
    res->send_error(Error{Code::kInvalidArgument, 0, "Idempotency-Key must be 1-200 characters"});
    return nullptr;
  }
  if (!log_) return res;
  auto fp = fingerprint(req);
  auto conflict = [&](const node::StepFingerprint& first) {
    res->send_error(Error{
        Code::kConflict, 0,
        "Idempotency-Key was used for " + first.describe() + "; this request is " + fp.describe()});
    return nullptr;
  };
  std::unique_lock lk(mu_);
  if (auto it = flights_.find(key); it != flights_.end()) {
    if (!(it->second->fp == fp)) {
      auto first = it->second->fp;
      lk.unlock();
      return conflict(first);
    }
    it->second->waiters.push_back(std::move(res));
    return nullptr;
  }
  // Flights end only after their record is in the index, so a key is always in one of the two.
  if (auto loc = log_->find(key)) {
    lk.unlock();
    auto rec = log_->read(*loc, true);
    if (rec && !(rec->request == fp)) return conflict(rec->request);
    replay_record(*res, rec);
    return nullptr;
  }
  if (flights_.size() >= max_in_flight_) {
    lk.unlock();
    res->send_error(Error{Code::kResourceExhausted, 0, "too many keyed requests in flight"});
    return nullptr;
  }
  if (log_->full()) {
    lk.unlock();
    res->send_error(
        Error{Code::kResourceExhausted, 0,
              "too many recorded Idempotency-Keys; they are forgotten after the step retention"});
    return nullptr;
  }
  auto f = std::make_shared<Flight>();
  f->fp = fp;
  flights_[key] = f;
  lk.unlock();
  node::StepRecord rec;
  rec.key = key;
  rec.request = std::move(fp);
  if (!req.upload && req.body.size() <= log_->inline_max()) rec.request_body = req.body;
  rec.started_us = now_us();
  return std::make_shared<Recorder>(*this, key, node::StepLog::scope_of(req.path), std::move(rec),
                                    std::move(res));
}

void IdempotencyCache::finished(const std::string& key, const Result<void>& recorded) {
  std::vector<std::shared_ptr<Responder>> waiters;
  {
    std::lock_guard lk(mu_);
    auto it = flights_.find(key);
    if (it == flights_.end()) return;
    waiters.swap(it->second->waiters);
    flights_.erase(it);
  }
  if (waiters.empty()) return;
  if (!recorded) {
    for (auto& w : waiters)
      w->send_error(Error{
          Code::kUnavailable, 0,
          "the first request with this key could not be recorded: " + recorded.error().message()});
    return;
  }
  auto loc = log_->find(key);
  for (auto& w : waiters) {
    Result<node::StepRecord> rec =
        loc ? log_->read(*loc, true) : fail(Code::kInternal, "key not in the step log");
    replay_record(*w, rec);
  }
}

bool IdempotencyCache::has_waiters(const std::string& key) {
  std::lock_guard lk(mu_);
  auto it = flights_.find(key);
  return it != flights_.end() && !it->second->waiters.empty();
}

size_t IdempotencyCache::in_flight() {
  std::lock_guard lk(mu_);
  return flights_.size();
}

}  // namespace tp::api
