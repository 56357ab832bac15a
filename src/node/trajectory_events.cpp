#include "node/trajectory_events.h"

#include <boost/json.hpp>
#include <condition_variable>
#include <mutex>

#include "common/ids.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/sha256.h"
#include "node/record_json.h"

namespace tp::node {

namespace json = boost::json;

std::string created_detail(const control::SandboxRecord& r) {
  json::object o = sandbox_json(r);
  json::array layers;
  for (const auto& l : r.layers) layers.emplace_back(l);
  o["layers"] = std::move(layers);
  return json_util::serialize_utf8(o);
}

Result<control::SandboxRecord> record_of_created(std::string_view detail) {
  auto v = json_util::parse_object(detail);
  if (!v) return std::unexpected(v.error());
  const json::object& o = *v;
  control::SandboxRecord r;
  auto str = [&](const char* k) -> Result<std::string> { return json_util::get_string(o, k, ""); };
  auto num = [&](const char* k) -> Result<int64_t> {
    return json_util::get_int(o, k, 0, 0, int64_t{1} << 40);
  };
  auto id = str("id");
  auto tier = str("tier");
  auto image = str("image");
  auto mem = num("memory_mb");
  auto cpus = json_util::get_number(o, "cpus", 1, 0, 1024);
  auto pids = num("pids");
  auto disk = num("disk_mb");
  auto ttl = num("ttl_seconds");
  auto idle = num("idle_timeout_seconds");
  auto layers = json_util::get_string_list(o, "layers");
  auto labels = json_util::get_string_map(o, "labels");
  auto env = json_util::get_string_map(o, "env");
  for (auto* e : {&id, &tier, &image})
    if (!*e) return std::unexpected(e->error());
  for (auto* e : {&mem, &pids, &disk, &ttl, &idle})
    if (!*e) return std::unexpected(e->error());
  if (!cpus) return std::unexpected(cpus.error());
  if (!layers) return std::unexpected(layers.error());
  if (!labels) return std::unexpected(labels.error());
  if (!env) return std::unexpected(env.error());
  r.id = *id;
  r.tier = *tier;
  r.image = *image;
  r.layers = *layers;
  r.memory_mb = static_cast<uint64_t>(*mem);
  r.cpus = *cpus;
  r.pids = static_cast<uint64_t>(*pids);
  r.disk_mb = static_cast<uint64_t>(*disk);
  r.ttl_seconds = static_cast<uint64_t>(*ttl);
  r.idle_timeout_seconds = static_cast<uint64_t>(*idle);
  r.labels = *labels;
  r.env = *env;
  return r;
}

std::string process_exit_detail(const ProcessInfo& i) {
  json::object o;
  o["pid"] = i.pid;
  json::array cmd;
  for (const auto& a : i.argv) cmd.emplace_back(a);
  o["cmd"] = std::move(cmd);
  if (i.outcome) {
    const auto& r = i.outcome->result;
    o["exit_code"] = r.exit_code;
    o["signal"] = r.signal;
    o["timed_out"] = r.timed_out;
    o["oom_killed"] = i.outcome->oom_killed;
    o["duration"] = static_cast<double>(r.wall_us) / 1e6;
  }
  if (i.error) {
    o["error"] = json::object{{"code", std::string(code_name(i.error->code))},
                              {"message", i.error->message()}};
  }
  return json_util::serialize_utf8(o);
}

std::string ended_detail(const control::SandboxRecord& r) {
  json::object o;
  o["state"] = r.state;
  o["end_reason"] = r.end_reason;
  o["ended_at"] = json_util::rfc3339(r.ended_at_ms);
  return json_util::serialize_utf8(o);
}

std::string step_tag(const std::string& key, const StepFingerprint& fp, const std::string& caller) {
  json::object o{{"key", key},
                 {"method", fp.method},
                 {"target", fp.target},
                 {"sha256", hex_encode(fp.body_sha256)},
                 {"len", fp.body_len}};
  boost::system::error_code ec;
  auto c = json::parse(caller, ec);
  if (!ec) o["caller"] = std::move(c);
  return json_util::serialize_utf8(o);
}

Result<StepRecord> step_lost_record(const std::string& tag, uint32_t pid, int64_t now_us) {
  auto o = json_util::parse_object(tag);
  if (!o) return std::unexpected(o.error());
  auto key = json_util::get_string(*o, "key", "");
  auto method = json_util::get_string(*o, "method", "");
  auto target = json_util::get_string(*o, "target", "");
  auto sha = json_util::get_string(*o, "sha256", "");
  auto len = json_util::get_int(*o, "len", 0, 0, int64_t{1} << 50);
  if (!key || key->empty() || !method || !target || !sha || sha->size() != 64 || !len)
    return fail(Code::kInvalidArgument, "not a step tag: " + tag);
  StepRecord r;
  r.key = *key;
  r.request.method = *method;
  r.request.target = *target;
  r.request.body_sha256 = bytes_of_hex(*sha);
  r.request.body_len = static_cast<uint64_t>(*len);
  if (const auto* c = o->if_contains("caller"); c && c->is_object()) r.caller = json::serialize(*c);
  r.status = 503;
  r.content_type = "application/json";
  std::string what = pid ? "it runs on as background process " + std::to_string(pid)
                         : "its command was stopped; its result is lost";
  json::object err{{"code", "unavailable"},
                   {"message", "the daemon restarted while this call was being answered: " + what}};
  r.answer = json::serialize(err) + "\n";
  r.summary = json::serialize(err);
  r.started_us = r.finished_us = now_us;
  return r;
}

void TrajectoryEvents::attach(ManagerOptions& opts) {
  // A sandbox whose log starts with its created event gets an id whose log is made
  // already (StepLog's spares): no file system metadata on its create's path.
  opts.new_id = [st = st_, node = opts.node_name] {
    StepLog* log = st->log.load();
    if (log && st->events)
      if (auto id = log->take_spare()) return *id;
    return ids::new_sandbox_id(node);
  };
  opts.drop_id = [st = st_](const std::string& id, bool unseen) {
    if (StepLog* log = st->log.load()) log->return_spare(id, unseen);
  };
  opts.on_created = [st = st_](const control::SandboxRecord& r) {
    StepLog* log = st->log.load();
    if (!log || !st->events) return;
    // In the log before the create is answered (so a replay finds what to recreate,
    // and a reader of the log its first entry); durable with the sandbox's first call
    // record (or its end), which is synced anyway: no fdatasync of its own.
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    log->append_event(
        r.id, "created", created_detail(r), false,
        [&](Result<void> res, std::string) {
          if (!res) TP_SB_WARN(r.id, "trajectory log: {}", res.error().message());
          std::lock_guard lk(m);
          done = true;
          cv.notify_all();
        },
        /*lazy=*/true);
    std::unique_lock lk(m);
    cv.wait(lk, [&] { return done; });
  };
  opts.on_process_exit = [st = st_](const std::string& id, const ProcessInfo& info) {
    StepLog* log = st->log.load();
    if (log && st->events) log->append_event(id, "process_exit", process_exit_detail(info), false);
  };
  opts.on_step_lost = [st = st_](const std::string& id, const std::string& tag, uint32_t pid) {
    StepLog* log = st->log.load();
    if (!log) return;
    auto rec = step_lost_record(tag, pid, log->now_us());
    if (!rec) return TP_SB_WARN(id, "trajectory log: {}", rec.error().message());
    if (log->find(rec->key)) return;  // answered and recorded before the restart
    std::string answer = std::move(rec->answer);
    TP_SB_WARN(id, "keyed call {} was unanswered at the restart: recorded as 503", rec->key);
    if (auto r = log->append_sync(id, std::move(*rec), std::move(answer)); !r)
      TP_SB_WARN(id, "trajectory log: {}", r.error().message());
  };
  opts.on_ended = [st = st_](const control::SandboxRecord& r) {
    StepLog* log = st->log.load();
    if (!log) return;
    if (st->events) log->append_event(r.id, "ended", ended_detail(r), true);
    log->sandbox_ended(r.id);
  };
}

void TrajectoryEvents::set_log(StepLog* log, bool events) {
  st_->events = events;
  st_->log = log;
}

}  // namespace tp::node
