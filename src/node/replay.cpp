#include "node/replay.h"

#include <boost/json.hpp>
#include <condition_variable>
#include <mutex>
#include <set>

#include "common/json_util.h"
#include "common/log.h"
#include "common/path.h"
#include "node/trajectory_events.h"

namespace tp::node {

namespace json = boost::json;

namespace {

using Fields = std::vector<std::pair<std::string, std::string>>;

// Fields that differ run by run, whatever the command did.
const std::set<std::string_view> kVolatile = {"duration",   "max_rss_kb", "mtime",    "started_at",
                                              "created_at", "expires_at", "ended_at", "finished_at",
                                              "pid_host",   "os_pid"};

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty() || from == to) return;
  for (size_t i = s.find(from); i != std::string::npos; i = s.find(from, i + to.size()))
    s.replace(i, from.size(), to);
}

std::string scalar_text(const json::value& v) {
  if (v.is_string()) return std::string(v.get_string());
  return json::serialize(v);
}

bool base64_key(std::string_view k) { return k == "stdout" || k == "stderr" || k == "data"; }

void flatten(const json::object& o, const std::string& prefix, int depth, Fields& out) {
  for (const auto& [k, v] : o) {
    if (kVolatile.count(std::string_view(k))) continue;
    std::string name = prefix.empty() ? std::string(k) : prefix + "." + std::string(k);
    if (v.is_object()) {
      if (depth < 3) flatten(v.get_object(), name, depth + 1, out);
      continue;
    }
    if (v.is_string() && base64_key(k)) {
      auto d = json_util::base64_decode(v.get_string());
      out.emplace_back(name, d ? *d : std::string(v.get_string()));
      continue;
    }
    out.emplace_back(name, scalar_text(v));
  }
}

// An answer as named fields, in a stable order, without what differs run by run.
Fields normalize(int status, const std::string& ct, const std::string& body) {
  Fields f;
  f.emplace_back("status", std::to_string(status));
  if (ct.starts_with("application/x-ndjson")) {
    // An exec stream: its output joined, then its exit (or error) event.
    std::string out, err;
    Fields last;
    size_t i = 0;
    while (i < body.size()) {
      size_t nl = body.find('\n', i);
      std::string_view line(body.data() + i, (nl == std::string::npos ? body.size() : nl) - i);
      i = nl == std::string::npos ? body.size() : nl + 1;
      boost::system::error_code ec;
      auto v = json::parse(line, ec);
      if (ec || !v.is_object()) continue;
      const auto& o = v.get_object();
      const auto* type = o.if_contains("type");
      if (!type || !type->is_string()) continue;
      if (type->get_string() == "stdout" || type->get_string() == "stderr") {
        const auto* d = o.if_contains("data");
        if (d && d->is_string())
          if (auto raw = json_util::base64_decode(d->get_string()))
            (type->get_string() == "stdout" ? out : err) += *raw;
      } else if (type->get_string() == "exit" || type->get_string() == "error") {
        last.clear();
        flatten(o, "", 1, last);
      }
    }
    for (auto& kv : last) f.push_back(std::move(kv));
    f.emplace_back("stdout", std::move(out));
    f.emplace_back("stderr", std::move(err));
    return f;
  }
  if (ct.starts_with("application/json") && !body.empty()) {
    boost::system::error_code ec;
    auto v = json::parse(body, ec);
    if (!ec && v.is_object()) {
      flatten(v.get_object(), "", 1, f);
      return f;
    }
  }
  f.emplace_back("body", body);
  return f;
}

std::string clip(const std::string& s) {
  constexpr size_t kMax = 500;
  return s.size() <= kMax ? s : s.substr(0, kMax) + "... (" + std::to_string(s.size()) + " bytes)";
}

// Appends an event to the new sandbox's log and waits until it is written.
void event_sync(StepLog& log, const std::string& id, const std::string& event,
                const json::object& detail) {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  log.append_event(id, event, json::serialize(detail), false, [&](Result<void> r, std::string) {
    if (!r) TP_SB_WARN(id, "trajectory log: {}", r.error().message());
    std::lock_guard lk(m);
    done = true;
    cv.notify_all();
  });
  std::unique_lock lk(m);
  cv.wait(lk, [&] { return done; });
}

std::string rewrite_target(const std::string& target, const std::string& from,
                           const std::string& to) {
  std::string prefix = "/v1/sandboxes/" + from;
  if (!target.starts_with(prefix)) return target;
  return "/v1/sandboxes/" + to + target.substr(prefix.size());
}

// An exec that removed its sandbox when it ended ("remove": true) replays without
// that: the replay's sandbox outlives the step (a branch goes on from it). Its exit
// event is compared as any exec's; the "removed" event after it is not.
std::string without_remove(const std::string& method, const std::string& target, std::string body) {
  if (method != "POST" || !target.substr(0, target.find('?')).ends_with("/exec")) return body;
  boost::system::error_code ec;
  auto v = json::parse(body, ec);
  if (ec || !v.is_object() || !v.get_object().erase("remove")) return body;
  return json::serialize(v);
}

}  // namespace

bool Replayer::replayable(const std::string& method, const std::string& target) {
  auto s = path_segments(std::string_view(target).substr(0, target.find('?')));
  if (s.size() < 4 || s[0] != "v1" || s[1] != "sandboxes") return false;
  auto rest = std::vector<std::string_view>(s.begin() + 3, s.end());
  auto is = [&](std::initializer_list<std::string_view> want) {
    if (rest.size() != want.size()) return false;
    size_t i = 0;
    for (auto w : want) {
      if (w != "*" && rest[i] != w) return false;
      ++i;
    }
    return true;
  };
  if (method == "POST")
    return is({"exec"}) || is({"files", "mkdir"}) || is({"processes"}) ||
           is({"processes", "*", "stdin"}) || is({"processes", "*", "signal"}) ||
           is({"processes", "*", "wait"});
  if (method == "PUT") return is({"files"}) || is({"files", "tar"});
  if (method == "DELETE") return is({"files"});
  return false;
}

std::optional<Divergence> Replayer::compare(const StepRecord& rec, const ReplayAnswer& got,
                                            const std::string& source, const std::string& sandbox) {
  Fields want = normalize(rec.status, rec.content_type, rec.answer);
  Fields have = normalize(got.status, got.content_type, got.body);
  for (auto& kv : have) replace_all(kv.second, sandbox, source);
  std::map<std::string, std::string> by_name(have.begin(), have.end());
  auto diverge = [&](const std::string& field, const std::string& a, const std::string& b) {
    Divergence d;
    d.seq = rec.seq;
    d.key = rec.key;
    d.call = rec.request.method + " " + rec.request.target;
    d.field = field;
    d.recorded = clip(a);
    d.replayed = clip(b);
    return d;
  };
  for (const auto& [name, value] : want) {
    auto it = by_name.find(name);
    if (it == by_name.end()) return diverge(name, value, "(missing)");
    if (it->second != value) return diverge(name, value, it->second);
    by_name.erase(it);
  }
  for (const auto& [name, value] : have)
    if (by_name.count(name)) return diverge(name, "(missing)", value);
  return std::nullopt;
}

Result<ReplayReport> Replayer::run(const Env& env, const std::string& source,
                                   const ReplayRequest& rq) {
  ReplayReport rep;
  rep.source = source;
  // The whole log of the source (records only: answers are read one by one below).
  std::vector<StepRecord> all;
  for (uint64_t after = 0;;) {
    auto part = env.log->list(source, after, 1000, false);
    if (!part) return std::unexpected(part.error());
    if (part->empty()) break;
    after = part->back().seq;
    for (auto& r : *part) all.push_back(std::move(r));
  }
  if (all.empty() && env.get) {
    if (auto r = env.get(source); !r) return std::unexpected(r.error());
  }
  uint64_t last = all.empty() ? 0 : all.back().seq;
  uint64_t to = rq.to_step ? rq.to_step : last;
  if (!rq.to_key.empty()) {
    auto it = std::find_if(all.begin(), all.end(), [&](const StepRecord& r) {
      return r.kind == StepKind::kCall && r.key == rq.to_key;
    });
    if (it == all.end())
      return fail(Code::kNotFound,
                  "the log of sandbox " + source + " has no call with key '" + rq.to_key + "'");
    to = it->seq;
  }
  if (to > last)
    return fail(Code::kInvalidArgument, "step " + std::to_string(to) +
                                            " is past the end of the log of " + source + " (" +
                                            std::to_string(last) + " records)");
  rep.to_step = to;

  // What to recreate: the "created" event, else the source's stored record.
  std::optional<control::SandboxRecord> made;
  for (const auto& r : all)
    if (r.kind == StepKind::kEvent && r.event == "created") {
      auto m = record_of_created(r.detail);
      if (!m) return fail(Code::kInternal, "the log's created event: " + m.error().message());
      made = *m;
      break;
    }
  if (!made) {
    if (!env.get)
      return fail(Code::kNotFound, "the log of " + source + " does not say how it was created");
    auto r = env.get(source);
    if (!r) return std::unexpected(r.error());
    made = *r;
    rep.notes.push_back("the log has no created event: the sandbox's stored record was used");
  }
  CreateParams p;
  p.image = made->image;
  if (!made->layers.empty()) {
    auto now = env.layers_of ? env.layers_of(made->image) : fail(Code::kNotFound, "");
    if (!now || *now != made->layers) {
      std::string stack = "layers:";
      for (size_t i = 0; i < made->layers.size(); ++i) stack += (i ? "," : "") + made->layers[i];
      p.image = stack;
      rep.notes.push_back("image " + made->image +
                          " names other layers now (or is gone): replayed on the recorded layers, "
                          "without the image's defaults");
    }
  }
  p.tier = made->tier.empty() ? "container" : made->tier;
  p.memory_mb = made->memory_mb;
  p.cpus = made->cpus;
  p.pids = made->pids;
  p.disk_mb = made->disk_mb;
  p.ttl_seconds = made->ttl_seconds;
  p.idle_timeout_seconds = made->idle_timeout_seconds;
  p.labels = made->labels;
  p.labels["replay_of"] = source;
  p.env = made->env;
  auto sb = env.create(std::move(p));
  if (!sb) return std::unexpected(sb.error());
  rep.sandbox = *sb;
  const std::string& id = sb->id;
  event_sync(*env.log, id, "replay", {{"source", source}, {"to_step", to}, {"branch", rq.branch}});

  for (const auto& r : all) {
    if (r.seq > to) break;
    if (r.kind != StepKind::kCall) continue;
    if (!replayable(r.request.method, r.request.target)) {
      rep.skipped.push_back(r.seq);
      continue;
    }
    auto body = env.log->request_body(source, r);
    if (!body)
      return fail(Code::kInternal, "reading the request of step " + std::to_string(r.seq) + " of " +
                                       source + ": " + body.error().message());
    auto full = env.log->list(source, r.seq - 1, 1, true);
    if (!full || full->empty() || full->front().seq != r.seq)
      return fail(Code::kInternal, "reading step " + std::to_string(r.seq) + " of " + source +
                                       ": " +
                                       (full ? std::string("it is gone") : full.error().message()));
    if (!*body) {
      Divergence d;
      d.seq = r.seq;
      d.key = r.key;
      d.call = r.request.method + " " + r.request.target;
      d.field = "request";
      d.recorded = "a body of " + std::to_string(r.request.body_len) + " bytes, not kept";
      d.replayed = "(not run)";
      if (!rep.first) rep.first = d;
      rep.divergences++;
      rep.skipped.push_back(r.seq);
      continue;
    }
    ReplayCall c;
    c.method = r.request.method;
    c.target = rewrite_target(r.request.target, source, id);
    c.body = without_remove(c.method, c.target, std::move(**body));
    if (!rq.rekey_from.empty() && r.key.starts_with(rq.rekey_from))
      c.key = rq.rekey_to + r.key.substr(rq.rekey_from.size());
    ReplayAnswer a = env.dispatch(c);
    rep.replayed++;
    StepRecord& rec = full->front();
    rec.seq = r.seq;
    if (auto d = compare(rec, a, source, id)) {
      if (!rep.first) rep.first = *d;
      rep.divergences++;
    }
  }
  rep.kept = rq.branch || rq.keep;
  event_sync(*env.log, id, "replay_finished",
             {{"source", source},
              {"to_step", to},
              {"replayed", rep.replayed},
              {"divergences", rep.divergences},
              {"first_divergence", rep.first ? json::value(rep.first->seq) : json::value()}});
  if (!rep.kept) env.destroy(id);
  return rep;
}

}  // namespace tp::node
