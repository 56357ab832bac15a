#include "api/idempotency.h"

#include <fmt/format.h>

#include <boost/json.hpp>
#include <chrono>

#include "api/step_summary.h"
#include "common/log.h"
#include "common/sha256.h"
#include "node/trajectory_events.h"

namespace tp::api {

namespace json = boost::json;

namespace {

using SteadyClock = std::chrono::steady_clock;

// Replays carry the recorded answer whole (a stream becomes one body).
void replay(Responder& res, int status, const std::string& ct, std::string body,
            SteadyClock::time_point since) {
  res.add_header("Idempotent-Replayed", "true");
  double ms = std::chrono::duration<double, std::milli>(SteadyClock::now() - since).count();
  res.add_header("Server-Timing", fmt::format("replay;dur={:.3f}", ms));
  res.send(status, ct, std::move(body));
}

void replay_record(Responder& res, Result<node::StepRecord>& rec, SteadyClock::time_point since) {
  if (!rec) {
    res.send_error(
        Error{Code::kInternal, 0, "the recorded answer cannot be read: " + rec.error().message()});
    return;
  }
  replay(res, rec->status, rec->content_type, std::move(rec->answer), since);
}

constexpr const char* kIncomplete =
    R"({"code":"unavailable","message":"the first request with this key did not complete"})"
    "\n";

std::string scope_of_target(const std::string& target) {
  return node::StepLog::scope_of(std::string_view(target).substr(0, target.find('?')));
}

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
  fp.body_sha256 = sha256(req.body);
  fp.body_len = req.body.size();
  return fp;
}

std::string IdempotencyCache::step_tag(const Request& req) {
  auto key = req.headers.find("idempotency-key");
  if (key == req.headers.end() || key->second.empty() || key->second.size() > kMaxKeyLength)
    return "";
  return node::step_tag(key->second, fingerprint(req), caller_json(req.caller));
}

std::string IdempotencyCache::caller_json(const Caller& c) {
  json::object o;
  if (c.unix_socket()) {
    o["transport"] = "unix";
    o["uid"] = c.uid;
    o["gid"] = c.gid;
  } else {
    o["transport"] = "tcp";
    if (!c.key_id.empty()) o["key_id"] = c.key_id;
    if (!c.scope.empty()) o["scope"] = c.scope;
  }
  return json::serialize(o);
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
        log_(cache.log_.get()),
        key_(std::move(key)),
        scope_(std::move(scope)),
        rec_(std::move(rec)),
        inner_(std::move(inner)) {
    if (!scope_.empty()) log_->hold(scope_);
  }
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
    if (rec_.content_type.starts_with("application/json")) rec_.summary = summarize_json(body);
    commit(std::move(body), false);
  }
  void start_stream(int status, std::string ct) override {
    std::lock_guard lk(mu_);
    if (done_ || rec_.status) return;
    rec_.status = status;
    rec_.content_type = ct;
    events_ = ct.starts_with("application/x-ndjson");
    inner_->start_stream(status, std::move(ct));
  }
  void write_chunk(std::string d) override {
    std::lock_guard lk(mu_);
    if (done_ || d.empty()) return;
    keep(d);
    if (events_) stream_summary_.feed(d);
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
    if (!d.empty()) keep(d);
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
    kept_.clear();
    held_.clear();
    commit(kIncomplete, false);
  }
  void set_on_abort(std::function<void()> cb) override { inner_->set_on_abort(std::move(cb)); }
  void add_header(std::string n, std::string v) override {
    inner_->add_header(std::move(n), std::move(v));
  }

 private:
  // What a stream sent, for its record: in memory up to kStreamInline (it goes inline
  // with the record: no side file to make and sync, which cost a streamed exec about
  // a millisecond), then in a side file (a failure there is seen at commit).
  void keep(std::string_view d) {
    if (side_failed_) return;
    if (!side_ && kept_.size() + d.size() <= kStreamInline) {
      kept_.append(d);
      return;
    }
    if (!side_) {
      auto side = log_->new_side(scope_);
      if (!side) {
        spdlog::error("step log: key {}: {}", key_, side.error().message());
        side_failed_ = true;
        kept_ = std::string();
        return;
      }
      side_ = std::move(*side);
      (void)side_->write(kept_);
      kept_ = std::string();
    }
    (void)side_->write(d);
  }
  // Appends the record; the answer goes to the client (and the waiters) when it is durable.
  void commit(std::string body, bool stream) {
    rec_.finished_us = log_->now_us();
    if (stream && events_) rec_.summary = stream_summary_.json();
    if (stream && !side_ && !side_failed_) body = std::move(kept_);  // a short stream: inline
    if (stream && side_failed_) {
      // The side file could not be made: nothing can be recorded; the client gets its answer.
      if (!held_.empty()) inner_->write_chunk(std::move(held_));
      inner_->end_stream();
      if (!key_.empty())
        cache_.finished(key_, fail(Code::kInternal, "streamed answer could not be recorded"));
      if (!scope_.empty()) log_->release(scope_);
      return;
    }
    auto* cache = &cache_;
    int status = rec_.status;
    std::string ct = rec_.content_type;
    // The append (which may sync the log on the calling thread) runs on the client's
    // connection: the thread that produced the answer (an agent's) goes on at once.
    // Nothing of this Recorder is used there; it may be gone by then.
    auto done = [cache, key = key_, inner = inner_, stream, status, ct = std::move(ct),
                 held = std::move(held_)](Result<void> r, std::string answer) mutable {
      if (stream) {
        if (!held.empty()) inner->write_chunk(std::move(held));
        inner->end_stream();
      } else {
        inner->send(status, std::move(ct), std::move(answer));
      }
      if (!key.empty()) cache->finished(key, r);
    };
    // One allocation for what the append takes (the side file is move-only, and the
    // posted function must be copyable).
    struct Pending {
      node::StepRecord rec;
      std::string body;
      std::unique_ptr<node::StepSideFile> side;
      node::StepLog::Done done;
    };
    auto p = std::make_shared<Pending>(
        Pending{std::move(rec_), std::move(body), std::move(side_), std::move(done)});
    inner_->run_on_connection([log = log_, scope = scope_, p] {
      log->append(scope, std::move(p->rec), std::move(p->body), std::move(p->side),
                  std::move(p->done),
                  /*release_hold=*/!scope.empty());  // a sandbox's "ended" event may follow
    });
  }

  IdempotencyCache& cache_;
  node::StepLog* log_;  // the cache's, which outlives every recorder
  const std::string key_, scope_;
  std::mutex mu_;
  node::StepRecord rec_;
  std::shared_ptr<Responder> inner_;
  // A stream's answer up to this size stays in memory until its record (bounded: one
  // such buffer per stream in flight).
  static constexpr size_t kStreamInline = 4096;
  std::unique_ptr<node::StepSideFile> side_;
  std::string kept_;          // a stream's answer until it outgrows kStreamInline
  bool side_failed_ = false;  // its side file could not be made: not recorded
  std::string held_;
  bool events_ = false;  // an NDJSON exec stream
  StreamSummary stream_summary_;
  bool done_ = false;
};

IdempotencyCache::~IdempotencyCache() { log_.reset(); }

void IdempotencyCache::set_log(std::shared_ptr<node::StepLog> log) { log_ = std::move(log); }

void IdempotencyCache::record_unkeyed(std::function<bool(const std::string&)> known) {
  known_ = std::move(known);
}

void IdempotencyCache::set_sandbox_known(std::function<bool(const std::string&)> exists) {
  exists_ = std::move(exists);
}

std::shared_ptr<Responder> IdempotencyCache::recorder(const Request& req, const std::string& key,
                                                      std::string scope, node::StepFingerprint fp,
                                                      std::shared_ptr<Responder> res) {
  node::StepRecord rec;
  rec.key = key;
  rec.request = std::move(fp);
  // A spooled upload is not kept (replay reports such a step as not replayable).
  if (!req.upload && req.body.size() <= log_->max_request_body()) rec.request_body = req.body;
  rec.caller = caller_json(req.caller);
  rec.started_us = log_->now_us();
  // A keyed call's intent goes first: if the daemon dies before its answer is recorded,
  // the next one answers the key 503 instead of running the call again.
  if (!key.empty()) log_->append_intent(scope, rec);
  return std::make_shared<Recorder>(*this, key, std::move(scope), std::move(rec), std::move(res));
}

std::shared_ptr<Responder> IdempotencyCache::begin(const Request& req, const std::string& key,
                                                   std::shared_ptr<Responder> res) {
  auto t0 = SteadyClock::now();
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
  std::string scope = node::StepLog::scope_of(req.path);
  if (!scope.empty() && exists_ && !exists_(scope)) scope.clear();
  std::unique_lock lk(mu_);
  if (auto it = flights_.find(key); it != flights_.end()) {
    if (!(it->second->fp == fp)) {
      auto first = it->second->fp;
      lk.unlock();
      return conflict(first);
    }
    it->second->waiters.push_back({std::move(res), t0});
    return nullptr;
  }
  // Flights end only after their record is in the index, so a key is always in one of the two.
  if (auto loc = log_->find(key)) {
    lk.unlock();
    auto rec = log_->read(*loc, true);
    if (rec && !(rec->request == fp)) return conflict(rec->request);
    replay_record(*res, rec, t0);
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
  f->scope = scope;
  flights_[key] = f;
  lk.unlock();
  return recorder(req, key, std::move(scope), std::move(fp), std::move(res));
}

std::shared_ptr<Responder> IdempotencyCache::record(const Request& req,
                                                    std::shared_ptr<Responder> res) {
  if (!log_ || !known_) return res;
  std::string scope = node::StepLog::scope_of(req.path);
  if (scope.empty() || !known_(scope)) return res;
  return recorder(req, "", std::move(scope), fingerprint(req), std::move(res));
}

void IdempotencyCache::fetch(const std::string& key, const std::string& scope,
                             std::shared_ptr<Responder> res) {
  auto t0 = SteadyClock::now();
  auto none = [&] {
    res->send_error(Error{Code::kNotFound, 0,
                          "the log of sandbox " + scope + " has no call with key '" + key + "'"});
  };
  if (!log_) return none();
  std::unique_lock lk(mu_);
  if (auto it = flights_.find(key); it != flights_.end()) {
    if (it->second->scope != scope) {
      lk.unlock();
      return none();
    }
    it->second->waiters.push_back({std::move(res), t0});
    return;
  }
  auto loc = log_->find(key);
  lk.unlock();
  if (!loc) return none();
  auto rec = log_->read(*loc, true);
  if (rec && scope_of_target(rec->request.target) != scope) return none();
  replay_record(*res, rec, t0);
}

void IdempotencyCache::finished(const std::string& key, const Result<void>& recorded) {
  std::vector<Flight::Waiter> waiters;
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
      w.res->send_error(Error{
          Code::kUnavailable, 0,
          "the first request with this key could not be recorded: " + recorded.error().message()});
    return;
  }
  auto loc = log_->find(key);
  for (auto& w : waiters) {
    Result<node::StepRecord> rec =
        loc ? log_->read(*loc, true) : fail(Code::kInternal, "key not in the step log");
    replay_record(*w.res, rec, w.since);
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
