#include "api/log_routes.h"

#include <boost/asio/post.hpp>
#include <boost/json.hpp>
#include <condition_variable>
#include <mutex>

#include "common/json_util.h"
#include "common/log.h"
#include "common/sha256.h"
#include "node/replay.h"
#include "node/state.h"

namespace tp::api {

namespace json = boost::json;
namespace asio = boost::asio;

namespace {

constexpr size_t kDefaultLimit = 1000;
constexpr size_t kMaxLimit = 10000;
constexpr size_t kFollowBatch = 64;
// Answers (output=true) in one listing or one followed chunk at most, beyond the first.
constexpr uint64_t kMaxAnswerBytes = 32u << 20;

json::value parsed_or_null(const std::string& s) {
  if (s.empty()) return nullptr;
  boost::system::error_code ec;
  auto v = json::parse(s, ec);
  return ec ? json::value(nullptr) : v;
}

std::string rfc3339_us(int64_t us) { return json_util::rfc3339(us / 1000); }

// One record of a sandbox's log as the API shows it (api/openapi.yaml, LogEntry).
json::object entry_json(const node::StepRecord& r, bool output) {
  json::object o;
  o["seq"] = r.seq;
  o["time"] = rfc3339_us(r.finished_us);
  if (r.kind == node::StepKind::kEvent) {
    o["kind"] = "event";
    o["event"] = r.event;
    o["detail"] = parsed_or_null(r.detail);
    return o;
  }
  o["kind"] = "call";
  o["key"] = r.key.empty() ? json::value(nullptr) : json::value(r.key);
  o["method"] = r.request.method;
  o["target"] = r.request.target;
  o["started_at"] = rfc3339_us(r.started_us);
  o["duration_ms"] = static_cast<double>(r.finished_us - r.started_us) / 1000.0;
  o["status"] = r.status;
  o["caller"] = parsed_or_null(r.caller);
  json::object req{{"bytes", r.request.body_len}, {"sha256", hex_encode(r.request.body_sha256)}};
  if (r.request_body && !r.request_body->empty() && (*r.request_body)[0] == '{') {
    if (auto b = json_util::parse_object(*r.request_body)) req["body"] = std::move(*b);
  }
  req["kept"] = r.request_body.has_value() || !r.request_side.empty();
  o["request"] = std::move(req);
  o["result"] = parsed_or_null(r.summary);
  o["content_type"] = r.content_type;
  o["answer_bytes"] = r.answer_len;
  if (output) o["answer"] = json_util::base64_encode(r.answer);
  return o;
}

Result<uint64_t> uint_param(const Request& req, const char* name, uint64_t dflt, uint64_t max) {
  const std::string* v = req.q(name);
  if (!v) return dflt;
  if (v->empty() || v->size() > 19 || v->find_first_not_of("0123456789") != std::string::npos)
    return fail(Code::kInvalidArgument, std::string(name) + " must be a whole number: " + *v);
  uint64_t n = std::stoull(*v);
  if (n > max)
    return fail(Code::kInvalidArgument,
                std::string(name) + " must be at most " + std::to_string(max));
  return n;
}

// The answer of a call served in process, captured whole. A handler that drops its
// responder without answering is an answer too (503), so dispatch never hangs on it.
struct Capture {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  node::ReplayAnswer a;
  void complete(int status, std::string ct, std::string body, bool append) {
    std::lock_guard lk(mu);
    if (done) return;
    done = true;
    if (status) a.status = status;
    if (!ct.empty()) a.content_type = std::move(ct);
    if (append)
      a.body += body;
    else
      a.body = std::move(body);
    cv.notify_all();
  }
};

class CaptureResponder : public Responder {
 public:
  explicit CaptureResponder(std::shared_ptr<Capture> c) : c_(std::move(c)) {}
  ~CaptureResponder() override {
    c_->complete(503, "application/json",
                 R"({"code":"unavailable","message":"the call was not answered"})", false);
  }
  void send(int status, std::string ct, std::string body) override {
    c_->complete(status, std::move(ct), std::move(body), false);
  }
  void start_stream(int status, std::string ct) override {
    std::lock_guard lk(c_->mu);
    c_->a.status = status;
    c_->a.content_type = std::move(ct);
  }
  void write_chunk(std::string d) override {
    std::lock_guard lk(c_->mu);
    if (!c_->done) c_->a.body += d;
  }
  void write_chunk(std::string d, std::function<void(bool)> written) override {
    write_chunk(std::move(d));
    if (written) written(true);
  }
  void end_stream() override { c_->complete(0, "", "", true); }
  void abort_stream() override { c_->complete(503, "", "", true); }
  void set_on_abort(std::function<void()>) override {}
  void add_header(std::string, std::string) override {}

 private:
  std::shared_ptr<Capture> c_;
};

// Waits for pred under lk, giving up (false) once *stopping is set.
template <typename Pred>
bool wait_or_stop(std::condition_variable& cv, std::unique_lock<std::mutex>& lk,
                  const std::atomic<bool>& stopping, Pred pred) {
  while (!pred()) {
    if (stopping) return false;
    cv.wait_for(lk, std::chrono::milliseconds(100));
  }
  return true;
}

// Serves one call through the API (as if a client had sent it) and waits for its answer.
node::ReplayAnswer dispatch_sync(Api& api, const Caller& caller, const node::ReplayCall& c,
                                 const std::atomic<bool>& stopping) {
  Request req;
  req.method = c.method;
  req.target = c.target;
  decode_target(req);
  req.body = c.body;
  req.caller = caller;
  if (!c.key.empty()) req.headers["idempotency-key"] = c.key;
  auto cap = std::make_shared<Capture>();
  api.handle(req, std::make_shared<CaptureResponder>(cap));
  std::unique_lock lk(cap->mu);
  if (!wait_or_stop(cap->cv, lk, stopping, [&] { return cap->done; }))
    return {503, "application/json", R"({"code":"unavailable","message":"daemon is stopping"})"};
  return cap->a;
}

}  // namespace

// Streams a sandbox's log from a cursor: batches of entries as the client takes them,
// then waits for new records, until the sandbox's end is in the stream.
class LogRoutes::Follower : public std::enable_shared_from_this<Follower> {
 public:
  Follower(LogRoutes& owner, std::string id, uint64_t after, bool output,
           std::shared_ptr<Responder> res)
      : owner_(owner), id_(std::move(id)), cursor_(after), output_(output), res_(std::move(res)) {}

  void start() {
    res_->set_on_abort([w = weak_from_this()] {
      if (auto s = w.lock()) s->gone_ = true;
    });
    schedule();
  }

 private:
  void schedule() {
    if (owner_.stopping_) return;
    asio::post(owner_.readers_, [self = shared_from_this()] { self->pump(); });
  }
  void pump() {
    std::lock_guard lk(mu_);  // one pump at a time: the cursor moves under it
    if (gone_) return;
    auto recs = owner_.log_->list(id_, cursor_, kFollowBatch, output_, kMaxAnswerBytes);
    if (!recs) {
      if (!started_) return res_->send_error(recs.error());
      spdlog::error("[{}] log follow: {}", id_, recs.error().message());
      return res_->abort_stream();
    }
    if (!started_) {
      started_ = true;
      res_->start_stream(200, "application/x-ndjson");
    }
    if (!recs->empty()) {
      std::string chunk;
      bool end = false;
      for (const auto& r : *recs) {
        chunk += json_util::serialize_utf8(entry_json(r, output_)) + "\n";
        cursor_ = r.seq;
        end = end || (r.kind == node::StepKind::kEvent && r.event == "ended");
      }
      res_->write_chunk(std::move(chunk), [self = shared_from_this(), end](bool ok) {
        if (!ok) {
          self->gone_ = true;
          return;
        }
        if (end) return self->res_->end_stream();
        self->schedule();
      });
      return;
    }
    // Caught up: the stream ends with the sandbox's end, else it waits for the next record.
    auto info = owner_.log_->info(id_);
    if (info.ended || info.closed) return res_->end_stream();
    auto rec = owner_.mgr_.get(id_);
    // Live (stopping included): its ended event is still to come.
    bool live = rec && node::shown_live(rec->state);
    if (!live && !info.busy) {
      // Ended, and nothing of it is being answered: its ended event (if events are
      // logged) is on its way for a moment; a log that gets none ends here.
      if (grace_) return res_->end_stream();
      grace_ = true;
      owner_.mgr_.after(kEndGrace, [self = shared_from_this()] { self->schedule(); });
      return;
    }
    owner_.log_->when_after(id_, cursor_, [self = shared_from_this()] { self->schedule(); });
  }
  static constexpr std::chrono::milliseconds kEndGrace{500};

  LogRoutes& owner_;
  const std::string id_;
  uint64_t cursor_;
  const bool output_;
  std::shared_ptr<Responder> res_;
  std::atomic<bool> gone_{false};
  std::mutex mu_;
  bool started_ = false;
  bool grace_ = false;
};

LogRoutes::LogRoutes(Api& api, node::Service& mgr, std::shared_ptr<node::StepLog> log,
                     LayersOf layers_of)
    : api_(api),
      mgr_(mgr),
      log_(std::move(log)),
      layers_of_(std::move(layers_of)),
      readers_(2),
      replayers_(kMaxReplays) {}

LogRoutes::~LogRoutes() {
  stopping_ = true;
  log_->drop_waiters();
  readers_.join();
  replayers_.join();
}

std::vector<RouteInfo> LogRoutes::routes() {
  return {{"GET", "/v1/sandboxes/{id}/log"},
          {"GET", "/v1/sandboxes/{id}/log/result"},
          {"POST", "/v1/sandboxes/{id}/replay"}};
}

bool LogRoutes::handle(Request& req, std::shared_ptr<Responder> res) {
  std::string_view p = req.path;
  constexpr std::string_view kPrefix = "/v1/sandboxes/";
  if (!p.starts_with(kPrefix)) return false;
  p.remove_prefix(kPrefix.size());
  auto slash = p.find('/');
  if (slash == std::string_view::npos) return false;
  std::string id(p.substr(0, slash));
  std::string_view rest = p.substr(slash);
  bool get = req.method == "GET" || req.method == "HEAD";
  if (rest == "/log" || rest == "/log/") {
    if (!get) return false;
    list(req, id, std::move(res));
    return true;
  }
  if (rest == "/log/result") {
    if (!get) return false;
    const std::string* key = req.q("key");
    if (!key || key->empty()) {
      res->send_error(Error{Code::kInvalidArgument, 0, "query parameter 'key' is required"});
      return true;
    }
    api_.idempotency().fetch(*key, id, std::move(res));
    return true;
  }
  if (rest == "/replay") {
    if (req.method != "POST") return false;
    replay(req, id, std::move(res));
    return true;
  }
  return false;
}

void LogRoutes::list(Request& req, const std::string& id, std::shared_ptr<Responder> res) {
  auto after = uint_param(req, "after", 0, UINT64_MAX >> 1);
  auto limit = uint_param(req, "limit", kDefaultLimit, kMaxLimit);
  auto output = req.q_bool("output", false);
  auto follow = req.q_bool("follow", false);
  for (auto* e : {&after, &limit})
    if (!*e) return res->send_error(e->error());
  for (auto* e : {&output, &follow})
    if (!*e) return res->send_error(e->error());
  if (*limit == 0)
    return res->send_error(Error{Code::kInvalidArgument, 0, "limit must be at least 1"});
  asio::post(readers_,
             [this, id, after = *after, limit = *limit, output = *output, follow = *follow, res] {
               auto info = log_->info(id);
               if (!info.exists) {
                 auto r = mgr_.get(id);
                 if (!r) return res->send_error(r.error());
               }
               if (follow) {
                 std::make_shared<Follower>(*this, id, after, output, res)->start();
                 return;
               }
               auto recs = log_->list(id, after, limit, output, kMaxAnswerBytes);
               if (!recs) return res->send_error(recs.error());
               json::array entries;
               uint64_t next = after;
               for (const auto& r : *recs) {
                 entries.push_back(entry_json(r, output));
                 next = r.seq;
               }
               json::object o;
               o["sandbox"] = id;
               o["entries"] = std::move(entries);
               o["next"] = next;
               o["last_seq"] = info.last_seq;
               o["records"] = info.records;
               o["bytes"] = info.bytes;
               o["ended"] = info.ended;
               res->send_json(200, o);
             });
}

void LogRoutes::replay(Request& req, const std::string& id, std::shared_ptr<Responder> res) {
  json::object body;
  if (!req.body.empty()) {
    auto b = json_util::parse_object(req.body);
    if (!b) return res->send_error(b.error());
    body = std::move(*b);
  }
  if (auto r = json_util::only_keys(body, {"to_step", "to_key", "branch", "keep", "rekey"}); !r)
    return res->send_error(r.error());
  node::ReplayRequest rq;
  auto to = json_util::get_int(body, "to_step", 0, 1, INT64_MAX);
  auto key = json_util::get_string(body, "to_key", "");
  auto branch = json_util::get_bool(body, "branch", false);
  auto keep = json_util::get_bool(body, "keep", false);
  if (!to) return res->send_error(to.error());
  if (!key) return res->send_error(key.error());
  if (!branch) return res->send_error(branch.error());
  if (!keep) return res->send_error(keep.error());
  if (body.contains("to_step") && !key->empty())
    return res->send_error(Error{Code::kInvalidArgument, 0, "give to_step or to_key, not both"});
  rq.to_step = static_cast<uint64_t>(*to);
  rq.to_key = *key;
  rq.branch = *branch;
  rq.keep = *keep;
  if (const auto* rk = body.if_contains("rekey"); rk && !rk->is_null()) {
    if (!rk->is_object())
      return res->send_error(
          Error{Code::kInvalidArgument, 0, "field 'rekey' must be an object {from, to}"});
    const auto& o = rk->get_object();
    if (auto r = json_util::only_keys(o, {"from", "to"}); !r) return res->send_error(r.error());
    auto from = json_util::get_string(o, "from", "");
    auto dest = json_util::get_string(o, "to", "");
    if (!from || from->empty())
      return res->send_error(
          Error{Code::kInvalidArgument, 0, "rekey.from must be a non-empty string"});
    if (!dest || dest->empty() || dest->size() > 100)
      return res->send_error(
          Error{Code::kInvalidArgument, 0, "rekey.to must be a string of 1-100 characters"});
    rq.rekey_from = *from;
    rq.rekey_to = *dest;
  }
  if (replays_.fetch_add(1) >= kMaxReplays) {
    replays_--;
    return res->send_error(
        Error{Code::kResourceExhausted, 0,
              "too many replays at once (at most " + std::to_string(kMaxReplays) + ")"});
  }
  asio::post(replayers_, [this, id, rq, caller = req.caller, res] {
    struct Done {
      std::atomic<int>& n;
      ~Done() { n--; }
    } done{replays_};
    node::Replayer::Env env;
    env.log = log_.get();
    env.get = [this](const std::string& sid) { return mgr_.get(sid); };
    env.create = [this](node::CreateParams p) {
      std::mutex m;
      std::condition_variable cv;
      std::optional<Result<control::SandboxRecord>> out;
      mgr_.create(std::move(p), [&](Result<control::SandboxRecord> r) {
        std::lock_guard lk(m);
        out = std::move(r);
        cv.notify_all();
      });
      std::unique_lock lk(m);
      if (!wait_or_stop(cv, lk, stopping_, [&] { return out.has_value(); }))
        return Result<control::SandboxRecord>(fail(Code::kUnavailable, "daemon is stopping"));
      return *out;
    };
    env.dispatch = [this, caller](const node::ReplayCall& c) {
      return dispatch_sync(api_, caller, c, stopping_);
    };
    env.destroy = [this](const std::string& sid) {
      std::mutex m;
      std::condition_variable cv;
      bool fin = false;
      mgr_.destroy(sid, node::EndReason::kDeleted, [&](Result<control::SandboxRecord>) {
        std::lock_guard lk(m);
        fin = true;
        cv.notify_all();
      });
      std::unique_lock lk(m);
      wait_or_stop(cv, lk, stopping_, [&] { return fin; });
    };
    env.layers_of = layers_of_;
    if (!log_->info(id).exists) {
      if (auto r = mgr_.get(id); !r) return res->send_error(r.error());
    }
    auto rep = node::Replayer::run(env, id, rq);
    if (!rep) return res->send_error(rep.error());
    json::object o;
    o["source"] = rep->source;
    // The new sandbox as GET /v1/sandboxes/{id} describes it now.
    auto got =
        dispatch_sync(api_, caller, {"GET", "/v1/sandboxes/" + rep->sandbox.id, "", ""}, stopping_);
    o["sandbox"] = got.status == 200 ? parsed_or_null(got.body) : json::value(nullptr);
    o["kept"] = rep->kept;
    o["to_step"] = rep->to_step;
    o["replayed"] = rep->replayed;
    json::array skipped;
    for (auto s : rep->skipped) skipped.push_back(s);
    o["skipped"] = std::move(skipped);
    o["divergences"] = rep->divergences;
    o["matched"] = rep->divergences == 0;
    if (rep->first) {
      const auto& d = *rep->first;
      o["first_divergence"] = json::object{
          {"seq", d.seq},           {"key", d.key.empty() ? json::value() : json::value(d.key)},
          {"call", d.call},         {"field", d.field},
          {"recorded", d.recorded}, {"replayed", d.replayed}};
    } else {
      o["first_divergence"] = nullptr;
    }
    json::array notes;
    for (const auto& n : rep->notes) notes.emplace_back(n);
    o["notes"] = std::move(notes);
    res->send_json(200, o);
  });
}

}  // namespace tp::api
