#include "api/routes.h"

#include <boost/json.hpp>
#include <chrono>
#include <ctime>
#include <set>

#include "api/counting_responder.h"
#include "api/download.h"
#include "api/exec_stream.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/path.h"
#include "node/record_json.h"
#include "node/state.h"

namespace tp::api {

namespace json = boost::json;
using control::SandboxRecord;
using json_util::base64_encode;

namespace {

// Writes a spooled upload into a command's stdin one piece (1 MiB) at a time:
// the next piece is read from the file only once the one before it is in the
// command's stdin, so neither the daemon nor the agent holds more than a piece.
// `done` gets the first error, or success once the EOF is in.
using StdinWrite =
    std::function<void(std::string data, bool eof, std::function<void(Result<void>)> cb)>;
void feed_stdin(std::shared_ptr<const BodyFile> body, StdinWrite write,
                std::function<void(Result<void>)> done, uint64_t off = 0) {
  constexpr size_t kPiece = 1 << 20;
  auto piece = body->read(off, kPiece);
  if (!piece) return done(std::unexpected(piece.error()));
  uint64_t next = off + piece->size();
  bool eof = next >= body->size();
  auto w = write;
  w(std::move(*piece), eof,
    [body = std::move(body), write = std::move(write), done = std::move(done), next,
     eof](Result<void> r) mutable {
      if (!r || eof) return done(std::move(r));
      feed_stdin(std::move(body), std::move(write), std::move(done), next);
    });
}

json::object entry_json(const node::FileEntry& e) {
  json::object j;
  j["name"] = e.name;
  j["path"] = e.path;
  j["type"] = e.type;
  j["size"] = e.size;
  j["mode"] = e.mode;
  j["mtime"] = static_cast<double>(e.mtime_ns) / 1e9;
  j["uid"] = e.uid;
  j["gid"] = e.gid;
  if (!e.link_target.empty()) j["link_target"] = e.link_target;
  // A name that is not UTF-8 is shown with U+FFFD (JSON strings are UTF-8); its
  // bytes go along in base64, so that the client can address it again (the
  // `path` query parameter takes any bytes, percent-encoded).
  for (auto [key, value] : {std::pair<const char*, const std::string*>{"name_b64", &e.name},
                            {"path_b64", &e.path},
                            {"link_target_b64", &e.link_target}})
    if (!json_util::valid_utf8(*value)) j[key] = base64_encode(*value);
  return j;
}

// Path parameter of file routes: required, absolute, no NUL.
Result<std::string> file_path(const Request& req) {
  const std::string* p = req.q("path");
  if (!p || p->empty()) return fail(Code::kInvalidArgument, "query parameter 'path' is required");
  if ((*p)[0] != '/') return fail(Code::kInvalidArgument, "path must be absolute: " + *p);
  if (p->find('\0') != std::string::npos) return fail(Code::kInvalidArgument, "path contains NUL");
  if (p->size() > 4096) return fail(Code::kInvalidArgument, "path too long");
  return *p;
}

}  // namespace

Api::Api(node::Service& mgr, Metrics& metrics) : mgr_(mgr), metrics_(metrics) {
  metrics_.set_state_source([this] { return mgr_.count_by_state(); });
}

void Api::set_step_log(std::shared_ptr<node::StepLog> log) {
  idempotency_.set_log(std::move(log));
  idempotency_.set_sandbox_known([this](const std::string& id) {
    auto r = mgr_.get(id);
    return r || r.error().code != Code::kNotFound;
  });
}

void Api::set_trajectory_log(bool every_call) {
  if (!every_call) return idempotency_.record_unkeyed(nullptr);
  // Calls on a live sandbox: one that ended refuses them, and changes nothing.
  idempotency_.record_unkeyed([this](const std::string& id) {
    auto r = mgr_.get(id);
    return r && node::shown_live(r->state);
  });
}

const std::vector<Api::Route>& Api::table() {
  static const std::vector<Route> t = {
      {"GET", "/health", &Api::health},
      {"GET", "/version", &Api::version},
      {"GET", "/metrics", &Api::metrics},
      {"POST", "/v1/sandboxes", &Api::create},
      {"GET", "/v1/sandboxes", &Api::list},
      {"GET", "/v1/sandboxes/{id}", &Api::get},
      {"DELETE", "/v1/sandboxes/{id}", &Api::destroy},
      {"POST", "/v1/sandboxes/{id}/exec", &Api::exec},
      {"GET", "/v1/sandboxes/{id}/files", &Api::file_read},
      {"PUT", "/v1/sandboxes/{id}/files", &Api::file_write},
      {"DELETE", "/v1/sandboxes/{id}/files", &Api::file_remove},
      {"GET", "/v1/sandboxes/{id}/files/list", &Api::file_list},
      {"GET", "/v1/sandboxes/{id}/files/stat", &Api::file_stat},
      {"POST", "/v1/sandboxes/{id}/files/mkdir", &Api::file_mkdir},
      {"POST", "/v1/sandboxes/batch", &Api::create_batch},
      {"POST", "/v1/sandboxes/{id}/processes", &Api::process_start},
      {"GET", "/v1/sandboxes/{id}/processes", &Api::process_list},
      {"GET", "/v1/sandboxes/{id}/processes/{pid}", &Api::process_get},
      {"POST", "/v1/sandboxes/{id}/processes/{pid}/wait", &Api::process_wait},
      {"POST", "/v1/sandboxes/{id}/processes/{pid}/stdin", &Api::process_stdin},
      {"POST", "/v1/sandboxes/{id}/processes/{pid}/signal", &Api::process_signal},
      {"GET", "/v1/sandboxes/{id}/files/tar", &Api::tar_download},
      {"PUT", "/v1/sandboxes/{id}/files/tar", &Api::tar_upload},
      {"POST", "/v1/sandboxes/{id}/pause", &Api::pause},
      {"POST", "/v1/sandboxes/{id}/resume", &Api::resume},
  };
  return t;
}

std::vector<RouteInfo> Api::routes() {
  std::vector<RouteInfo> out;
  for (const auto& r : table()) out.push_back({r.method, r.pattern});
  return out;
}

bool Api::takes_upload(const std::string& method, const std::string& path) {
  auto s = path_segments(path);
  auto is = [&](std::initializer_list<std::string_view> want) {
    if (s.size() != want.size()) return false;
    size_t i = 0;
    for (auto w : want) {
      if (w != "*" && s[i] != w) return false;
      ++i;
    }
    return true;
  };
  if (method == "PUT")
    return is({"v1", "sandboxes", "*", "files"}) || is({"v1", "sandboxes", "*", "files", "tar"});
  if (method == "POST")
    return is({"v1", "images", "import"}) ||
           is({"v1", "sandboxes", "*", "processes", "*", "stdin"});
  return false;
}

void Api::handle(Request& req, std::shared_ptr<Responder> raw) {
  std::function<void()> done;
  if (client_request_ &&
      (req.path.starts_with("/v1/sandboxes") || req.path.starts_with("/v1/functions"))) {
    client_request_();  // at its start and at its end
    done = client_request_;
  }
  std::shared_ptr<Responder> res =
      std::make_shared<CountingResponder>(std::move(raw), metrics_, std::move(done));
  if (req.method == "POST" || req.method == "PUT" || req.method == "DELETE") {
    auto key = req.headers.find("idempotency-key");
    if (key != req.headers.end()) {
      res = idempotency_.begin(req, key->second, std::move(res));
      if (!res) return;  // answered from the record, waiting for the first, or refused
    } else {
      res = idempotency_.record(req, std::move(res));  // the trajectory log, when on
    }
  }
  for (auto& p : providers_)
    if (p->handle(req, res)) return;
  auto have = path_segments(req.path);
  bool path_matched = false;
  for (const auto& r : table()) {
    auto want = path_segments(r.pattern);
    if (want.size() != have.size()) continue;
    Params params;
    bool ok = true;
    for (size_t i = 0; i < want.size() && ok; ++i) {
      if (!want[i].empty() && want[i][0] == '{')
        params.emplace_back(have[i]);
      else
        ok = want[i] == have[i];
    }
    if (!ok) continue;
    path_matched = true;
    if (req.method != r.method && !(req.method == "HEAD" && std::string_view(r.method) == "GET"))
      continue;
    (this->*r.fn)(req, params, res);
    return;
  }
  if (path_matched)
    res->send_error(
        Error{Code::kInvalidArgument, 0, "method " + req.method + " not allowed on " + req.path});
  else
    res->send_error(Error{Code::kNotFound, 0, "no route " + req.method + " " + req.path});
}

void Api::health(Request&, const Params&, std::shared_ptr<Responder> res) {
  res->send_json(200, json::object{{"status", "ok"}});
}

void Api::version(Request&, const Params&, std::shared_ptr<Responder> res) {
  json::array tiers;
  for (const auto& t : tiers_) tiers.emplace_back(t);
  res->send_json(200,
                 json::object{{"version", TP_VERSION}, {"api", "v1"}, {"tiers", std::move(tiers)}});
}

void Api::metrics(Request&, const Params&, std::shared_ptr<Responder> res) {
  res->send(200, "text/plain; version=0.0.4", metrics_.render());
}

namespace {

// The sandbox fields of a create (and of a batch: its own keys are the caller's).
const std::vector<std::string_view> kCreateKeys = {
    "image",  "tier", "memory_mb", "cpus", "pids", "disk_mb", "ttl_seconds", "idle_timeout_seconds",
    "labels", "env",  "template",  "job",  "step", "priority"};

Result<void> check_name(const json::object& o, const char* key, size_t max) {
  auto v = json_util::get_string(o, key, "");
  if (!v) return std::unexpected(v.error());
  if (!o.contains(key)) return {};
  if (v->empty() || v->size() > max)
    return fail(Code::kInvalidArgument,
                std::string("field '") + key + "' must be 1 to " + std::to_string(max) + " bytes");
  for (unsigned char c : *v)
    if (c < 0x21 || c == 0x7f)
      return fail(Code::kInvalidArgument,
                  std::string("field '") + key + "' must not contain spaces or control bytes");
  return {};
}

}  // namespace

Result<node::CreateParams> parse_create(const json::object& o,
                                        std::initializer_list<std::string_view> extra) {
  node::CreateParams p;
  std::vector<std::string_view> keys = kCreateKeys;
  keys.insert(keys.end(), extra.begin(), extra.end());
  TP_TRY(json_util::only_keys(o, std::span<const std::string_view>(keys)));
  for (const auto& kv : o)
    if (!kv.value().is_null()) p.given.insert(std::string(kv.key()));
  TP_TRY(check_name(o, "template", 63));
  TP_TRY(check_name(o, "job", 128));
  TP_TRY(check_name(o, "step", 128));
  auto tpl = json_util::get_string(o, "template", "");
  auto job = json_util::get_string(o, "job", "");
  auto step = json_util::get_string(o, "step", "");
  auto prio = json_util::get_string(o, "priority", "normal");
  if (!prio) return std::unexpected(prio.error());
  if (*prio != "normal" && *prio != "best-effort")
    return fail(Code::kInvalidArgument,
                "field 'priority' must be 'normal' or 'best-effort', not '" + *prio + "'");
  if (!step->empty() && job->empty())
    return fail(Code::kInvalidArgument, "field 'step' needs a 'job'");
  p.template_name = *tpl;
  p.job = *job;
  p.step = *step;
  p.priority = *prio;
  auto image = json_util::get_string(o, "image", "host");
  if (!image) return std::unexpected(image.error());
  auto tier = json_util::get_string(o, "tier", "container");
  if (!tier) return std::unexpected(tier.error());
  auto mem = json_util::get_int(o, "memory_mb", 512, 16, 1 << 20);
  if (!mem) return std::unexpected(mem.error());
  auto cpus = json_util::get_number(o, "cpus", 1.0, 0.05, 256);
  if (!cpus) return std::unexpected(cpus.error());
  auto pids = json_util::get_int(o, "pids", 512, 8, 1 << 20);
  if (!pids) return std::unexpected(pids.error());
  auto disk = json_util::get_int(o, "disk_mb", 1024, 1, 1 << 20);
  if (!disk) return std::unexpected(disk.error());
  auto ttl = json_util::get_int(o, "ttl_seconds", 3600, 1, 30ll * 24 * 3600);
  if (!ttl) return std::unexpected(ttl.error());
  auto idle = json_util::get_int(o, "idle_timeout_seconds", 0, 0, 30ll * 24 * 3600);
  if (!idle) return std::unexpected(idle.error());
  auto labels = json_util::get_string_map(o, "labels");
  if (!labels) return std::unexpected(labels.error());
  auto env = json_util::get_string_map(o, "env");
  if (!env) return std::unexpected(env.error());
  for (const auto& [k, v] : *env)
    if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos ||
        v.find('\0') != std::string::npos)
      return fail(Code::kInvalidArgument, "invalid env variable name '" + k + "'");
  p.image = *image;
  p.tier = *tier;
  p.memory_mb = static_cast<uint64_t>(*mem);
  p.cpus = *cpus;
  p.pids = static_cast<uint64_t>(*pids);
  p.disk_mb = static_cast<uint64_t>(*disk);
  p.ttl_seconds = static_cast<uint64_t>(*ttl);
  p.idle_timeout_seconds = static_cast<uint64_t>(*idle);
  p.labels = std::move(*labels);
  p.env = std::move(*env);
  return p;
}

namespace {

struct ExecSpec {
  node::ExecParams params;
  bool stream = false;
  bool remove = false;  // the sandbox is removed when the command ends
};

// Parses an ExecRequest; `extra` names keys allowed beyond the common ones.
Result<ExecSpec> parse_exec(const json::object& o, bool background) {
  if (background) {
    TP_TRY(json_util::only_keys(o, {"cmd", "env", "cwd", "user", "timeout", "stdin",
                                    "max_output_bytes", "stream", "stdin_open"}));
  } else {
    TP_TRY(json_util::only_keys(o, {"cmd", "env", "cwd", "user", "timeout", "stdin",
                                    "max_output_bytes", "stream", "remove"}));
  }
  ExecSpec spec;
  node::ExecParams& ep = spec.params;
  auto argv = json_util::get_command(o, "cmd");
  if (!argv) return std::unexpected(argv.error());
  auto env = json_util::get_string_map(o, "env");
  if (!env) return std::unexpected(env.error());
  auto cwd = json_util::get_string(o, "cwd", "");
  if (!cwd) return std::unexpected(cwd.error());
  if (!cwd->empty() && (*cwd)[0] != '/')
    return fail(Code::kInvalidArgument, "field 'cwd' must be an absolute path");
  auto user = json_util::get_int(o, "user", 0, 0, 65535);
  if (!user) return std::unexpected(user.error());
  auto maxout = json_util::get_int(o, "max_output_bytes", 16ll << 20, 0, 1ll << 30);
  if (!maxout) return std::unexpected(maxout.error());
  auto stream = json_util::get_bool(o, "stream", false);
  if (!stream) return std::unexpected(stream.error());
  auto stdin_open = json_util::get_bool(o, "stdin_open", false);
  if (!stdin_open) return std::unexpected(stdin_open.error());
  auto stdin_b64 = json_util::get_string(o, "stdin", "");
  if (!stdin_b64) return std::unexpected(stdin_b64.error());
  auto stdin_data = json_util::base64_decode(*stdin_b64);
  if (!stdin_data) return fail(Code::kInvalidArgument, "field 'stdin' must be base64");
  if (auto it = o.find("timeout"); it != o.end() && !it->value().is_null()) {
    if (!it->value().is_number())
      return fail(Code::kInvalidArgument, "field 'timeout' must be a number of seconds");
    double t = it->value().to_number<double>();
    if (!(t > 0) || t > 30 * 24 * 3600)
      return fail(Code::kInvalidArgument, "field 'timeout' must be greater than 0 seconds");
    ep.timeout_ms = std::max<uint64_t>(1, static_cast<uint64_t>(t * 1000));
  }
  ep.argv = std::move(*argv);
  ep.env = std::move(*env);
  ep.cwd = *cwd;
  if (o.contains("user") && !o.at("user").is_null()) ep.uid = static_cast<uint32_t>(*user);
  ep.output_limit = static_cast<uint64_t>(*maxout);
  ep.stdin_data = std::move(*stdin_data);
  ep.stdin_open = *stdin_open;
  auto remove = json_util::get_bool(o, "remove", false);
  if (!remove) return std::unexpected(remove.error());
  if (*remove && !*stream)
    return fail(Code::kInvalidArgument, "field 'remove' needs \"stream\": true");
  spec.stream = *stream && !background;
  spec.remove = *remove;  // background: refused by only_keys above
  return spec;
}

json::object process_json(const node::ProcessInfo& i, bool with_output) {
  json::object j;
  j["pid"] = i.pid;
  if (i.os_pid) j["os_pid"] = i.os_pid;
  json::array cmd;
  for (const auto& a : i.argv) cmd.push_back(json::string(a));
  j["cmd"] = std::move(cmd);
  j["state"] = i.exited ? "exited" : "running";
  j["started_at"] = json_util::rfc3339(i.started_ms);
  if (with_output) {
    j["stdout"] = base64_encode(i.out);
    j["stderr"] = base64_encode(i.err);
  }
  if (i.outcome) j["result"] = exec_outcome_json(*i.outcome);
  if (i.error) {
    j["error"] = json::object{{"code", std::string(code_name(i.error->code))},
                              {"message", i.error->message()}};
  }
  return j;
}

Result<uint32_t> pid_param(const std::string& s) {
  if (s.empty() || s.size() > 10 || s.find_first_not_of("0123456789") != std::string::npos)
    return fail(Code::kInvalidArgument, "process id must be a number: " + s);
  unsigned long v = std::stoul(s);
  if (v > 0xffffffffu) return fail(Code::kInvalidArgument, "process id out of range: " + s);
  return static_cast<uint32_t>(v);
}

}  // namespace

void Api::create_one(node::CreateParams p,
                     std::function<void(Result<SandboxRecord>, bool from_pool)> cb) {
  if (creator_) return creator_(std::move(p), std::move(cb));
  if (!p.template_name.empty())
    return cb(fail(Code::kNotFound, "template '" + p.template_name + "' not found"), false);
  mgr_.create(std::move(p), [cb](Result<SandboxRecord> r) { cb(std::move(r), false); });
}

void Api::create(Request& req, const Params&, std::shared_ptr<Responder> res) {
  auto body = json_util::parse_object(req.body);
  if (!body) return res->send_error(body.error());
  auto p = parse_create(*body);
  if (!p) return res->send_error(p.error());
  create_one(std::move(*p), [res](Result<SandboxRecord> r, bool from_pool) {
    if (!r) return res->send_error(r.error());
    res->add_header("Tidepool-From-Pool", from_pool ? "true" : "false");
    res->send_json(201, node::sandbox_json(*r));
  });
}

namespace {

// One batch in flight: its items' outcomes, and (streamed) the lines not yet written.
struct Batch {
  std::mutex mu;
  std::vector<std::optional<Result<SandboxRecord>>> items;
  std::vector<bool> pooled;
  size_t left = 0;
  bool gang = false, stream = false;
  bool failed = false;  // gang: an item failed, the rest is released as it comes
  std::shared_ptr<Responder> res;
};

json::object item_error(size_t i, const Error& e) {
  return json::object{
      {"index", i}, {"code", std::string(code_name(e.code))}, {"message", e.message()}};
}

}  // namespace

// A batch: N creates of one shape (pool first, then cold), at once. Plain: one
// answer with every item. Streamed (NDJSON): a line per item as it is ready or
// failed, then a summary line. Gang: all or nothing; on the first failure every
// created item is deleted again (and those still creating when they arrive), and
// the answer is the failure (streamed: a summary with ok=false and the released ids).
void Api::create_batch(Request& req, const Params&, std::shared_ptr<Responder> res) {
  auto body = json_util::parse_object(req.body);
  if (!body) return res->send_error(body.error());
  auto count = json_util::get_int(*body, "count", 0, 1, 1000);
  if (!count) return res->send_error(count.error());
  if (!body->contains("count"))
    return res->send_error(Error{Code::kInvalidArgument, 0, "field 'count' is required"});
  auto gang = json_util::get_bool(*body, "gang", false);
  if (!gang) return res->send_error(gang.error());
  auto stream = json_util::get_bool(*body, "stream", false);
  if (!stream) return res->send_error(stream.error());
  auto p = parse_create(*body, {"count", "gang", "stream"});
  if (!p) return res->send_error(p.error());
  for (const char* k : {"count", "gang", "stream"}) p->given.erase(k);
  auto b = std::make_shared<Batch>();
  b->items.resize(static_cast<size_t>(*count));
  b->pooled.resize(b->items.size());
  b->left = b->items.size();
  b->gang = *gang;
  b->stream = *stream;
  b->res = res;
  if (b->stream) res->start_stream(200, "application/x-ndjson");
  if (client_work_) client_work_(+1);
  auto release = [this](const std::string& id) {
    mgr_.destroy(id, node::EndReason::kDeleted, [id](Result<SandboxRecord> r) {
      if (!r) TP_SB_WARN(id, "releasing a gang batch's sandbox: {}", r.error().message());
    });
  };
  for (size_t i = 0; i < b->items.size(); ++i) {
    create_one(*p, [this, b, i, release](Result<SandboxRecord> r, bool from_pool) {
      std::unique_lock lk(b->mu);
      bool first_failure = !r && b->gang && !b->failed;
      if (!r) b->failed = true;
      if (r && b->gang && b->failed) release(r->id);  // the gang already failed
      if (first_failure)                              // what the gang took so far goes back
        for (auto& it : b->items)
          if (it && *it) release((*it)->id);
      if (b->stream) {
        json::object line;
        line["index"] = i;
        if (r && b->gang && b->failed) {
          line["released"] = r->id;  // made after the gang failed: deleted at once
        } else if (r) {
          line["sandbox"] = node::sandbox_json(*r);
          line["from_pool"] = from_pool;
        } else {
          line["error"] = json::object{{"code", std::string(code_name(r.error().code))},
                                       {"message", r.error().message()}};
        }
        b->res->write_chunk(json::serialize(line) + "\n");
      }
      b->items[i] = std::move(r);
      b->pooled[i] = from_pool;
      if (--b->left) return;
      if (client_work_) client_work_(-1);
      size_t ok_n = 0, pool_n = 0;
      const Error* first = nullptr;
      size_t first_i = 0;
      for (size_t k = 0; k < b->items.size(); ++k) {
        if (*b->items[k]) {
          ok_n++;
          pool_n += b->pooled[k];
        } else if (!first) {
          first = &b->items[k]->error();
          first_i = k;
        }
      }
      if (b->gang && b->failed) {
        json::array released;
        for (auto& it : b->items)
          if (*it) released.emplace_back((*it)->id);
        std::string msg = "gang batch of " + std::to_string(b->items.size()) + ": item " +
                          std::to_string(first_i) + " failed (" + first->message() +
                          "); released the " + std::to_string(ok_n) + " created";
        if (b->stream) {
          b->res->write_chunk(
              json::serialize(
                  json::object{{"done", true},
                               {"ok", false},
                               {"created", 0},
                               {"failed", b->items.size() - ok_n},
                               {"released", std::move(released)},
                               {"error", json::object{{"code", std::string(code_name(first->code))},
                                                      {"message", msg}}}}) +
              "\n");
          return b->res->end_stream();
        }
        return b->res->send_error(Error{first->code, 0, msg});
      }
      if (b->stream) {
        b->res->write_chunk(json::serialize(json::object{{"done", true},
                                                         {"ok", ok_n == b->items.size()},
                                                         {"created", ok_n},
                                                         {"from_pool", pool_n},
                                                         {"failed", b->items.size() - ok_n}}) +
                            "\n");
        return b->res->end_stream();
      }
      json::array ok, errors;
      for (size_t k = 0; k < b->items.size(); ++k) {
        const auto& it = *b->items[k];
        if (it)
          ok.push_back(node::sandbox_json(*it));
        else
          errors.push_back(item_error(k, it.error()));
      }
      b->res->send_json(200, json::object{{"sandboxes", std::move(ok)},
                                          {"errors", std::move(errors)},
                                          {"from_pool", pool_n}});
    });
  }
}

void Api::pause(Request&, const Params& p, std::shared_ptr<Responder> res) {
  mgr_.pause(p[0], [res](Result<SandboxRecord> r) {
    if (!r) return res->send_error(r.error());
    res->send_json(200, node::sandbox_json(*r));
  });
}

void Api::resume(Request&, const Params& p, std::shared_ptr<Responder> res) {
  mgr_.resume(p[0], [res](Result<SandboxRecord> r) {
    if (!r) return res->send_error(r.error());
    res->send_json(200, node::sandbox_json(*r));
  });
}

void Api::list(Request& req, const Params&, std::shared_ptr<Responder> res) {
  std::map<std::string, std::string> labels;
  for (const auto& l : req.q_all("label")) {
    auto eq = l.find('=');
    if (eq == std::string::npos || eq == 0)
      return res->send_error(Error{Code::kInvalidArgument, 0, "label filter must be k=v: " + l});
    labels[l.substr(0, eq)] = l.substr(eq + 1);
  }
  std::string state = req.q("state") ? *req.q("state") : "";
  static const std::set<std::string> kStates = {"",         "creating", "running", "paused",
                                                "stopping", "stopped",  "lost"};
  if (!kStates.count(state))
    return res->send_error(Error{Code::kInvalidArgument, 0, "unknown state '" + state + "'"});
  auto all = req.q_bool("all", false);
  if (!all) return res->send_error(all.error());
  node::ListFilter f;
  f.labels = std::move(labels);
  f.state = state;
  f.all = *all;
  if (const std::string* j = req.q("job")) f.job = *j;
  if (const std::string* s = req.q("step")) f.step = *s;
  auto recs = mgr_.list(f);
  if (!recs) return res->send_error(recs.error());
  json::array arr;
  for (const auto& r : *recs) arr.push_back(node::sandbox_json(r));
  res->send_json(200, json::object{{"sandboxes", std::move(arr)}});
}

void Api::get(Request&, const Params& p, std::shared_ptr<Responder> res) {
  auto r = mgr_.get(p[0]);
  if (!r) return res->send_error(r.error());
  res->send_json(200, node::sandbox_json(*r));
}

void Api::destroy(Request& req, const Params& p, std::shared_ptr<Responder> res) {
  auto wait = req.q_bool("wait", true);
  if (!wait) return res->send_error(wait.error());
  if (*wait)
    return mgr_.destroy(p[0], node::EndReason::kDeleted, [res](Result<SandboxRecord> r) {
      if (!r) return res->send_error(r.error());
      res->send_json(200, node::sandbox_json(*r));
    });
  // Answered once the stop is durable; the teardown goes on (202, state "stopping").
  mgr_.destroy_nowait(p[0], node::EndReason::kDeleted, [res](Result<SandboxRecord> r) {
    if (!r) return res->send_error(r.error());
    res->send_json(r->state == "stopping" ? 202 : 200, node::sandbox_json(*r));
  });
}

void Api::exec(Request& req, const Params& p, std::shared_ptr<Responder> res) {
  auto body = json_util::parse_object(req.body);
  if (!body) return res->send_error(body.error());
  auto spec = parse_exec(*body, false);
  if (!spec) return res->send_error(spec.error());
  bool finish = false;
  if (auto d = req.headers.find("tidepool-on-disconnect"); d != req.headers.end()) {
    if (d->second != "finish" && d->second != "kill")
      return res->send_error(
          Error{Code::kInvalidArgument, 0,
                "Tidepool-On-Disconnect must be finish or kill, not '" + d->second + "'"});
    finish = d->second == "finish";
  }
  node::ExecParams ep = std::move(spec->params);
  ep.step_tag = IdempotencyCache::step_tag(req);
  auto stream = &spec->stream;
  std::string id = p[0];
  node::ExecCallbacks cb;
  std::shared_ptr<ExecStream> paced;
  if (*stream) {
    ExecControl::Fns ctl;
    ctl.credit = [this, id](uint32_t eid, uint64_t n) { mgr_.credit_exec(id, eid, n); };
    ctl.kill = [this, id](uint32_t eid) { mgr_.signal_exec(id, eid, 9); };
    paced = std::make_shared<ExecStream>(res, std::move(ctl));
    ep.window = ExecStream::kWindow;
    cb = paced->callbacks();
  } else {
    struct Acc {
      std::string out, err;
    };
    auto acc = std::make_shared<Acc>();
    cb.on_output = [acc](int stream, std::string_view data) {
      (stream == 2 ? acc->err : acc->out).append(data);
    };
    cb.on_done = [res, acc](Result<node::ExecOutcome> r) {
      if (!r) return res->send_error(r.error());
      json::object j = exec_outcome_json(*r);
      // The raw output goes as soon as it is encoded: a big answer is held once, not twice.
      j["stdout"] = base64_encode(std::exchange(acc->out, {}));
      j["stderr"] = base64_encode(std::exchange(acc->err, {}));
      res->send_json(200, j);
    };
  }
  if (spec->remove) {
    // The sandbox's stop is stored before the exit is answered (as DELETE ?wait=false
    // answers), whatever ended the command: its end, its timeout, a client gone.
    cb.on_done = [this, id, paced, done = std::move(cb.on_done)](Result<node::ExecOutcome> r) {
      mgr_.destroy_nowait(id, node::EndReason::kDeleted,
                          [paced, done, r = std::move(r)](Result<SandboxRecord> s) mutable {
                            json::object e{{"type", "removed"}};
                            if (s) {
                              e["sandbox"] = node::sandbox_json(*s);
                            } else {
                              e["code"] = std::string(code_name(s.error().code));
                              e["message"] = s.error().message();
                            }
                            paced->set_epilogue(std::move(e));
                            done(std::move(r));
                          });
    };
  }
  auto exec_id = mgr_.exec(id, std::move(ep), std::move(cb));
  if (!exec_id) return res->send_error(exec_id.error());
  if (paced) paced->attach(*exec_id);
  // A client that goes away mid-command must not leave the command running. With an
  // Idempotency-Key the client may be retrying after a network fault: the command
  // keeps running for a grace period and is killed only if no repeat of the key came
  // to wait for its result; with `Tidepool-On-Disconnect: finish` too (a trajectory's
  // step) it runs to its end (its timeout, the sandbox's end), its result recorded
  // for the client to fetch by key however late it comes back. Either way a step is
  // neither lost nor run twice.
  auto key = req.headers.find("idempotency-key");
  if (key == req.headers.end()) {
    res->set_on_abort([this, id, eid = *exec_id] { mgr_.signal_exec(id, eid, 9); });
  } else if (!finish) {
    res->set_on_abort([this, id, eid = *exec_id, k = key->second] {
      mgr_.after(kRetryGrace, [this, id, eid, k] {
        if (!idempotency_.has_waiters(k)) mgr_.signal_exec(id, eid, 9);
      });
    });
  }
}

void Api::file_read(Request& req, const Params& p, std::shared_ptr<Responder> res) {
  auto path = file_path(req);
  if (!path) return res->send_error(path.error());
  if (auto sb = mgr_.ref(p[0]); !sb) return res->send_error(sb.error());
  // Each piece asks for the sandbox again: a download keeps it active (idle
  // timeout) and ends when it stops.
  auto read = [this, id = p[0], path = *path](uint64_t offset, uint64_t length,
                                              std::function<void(Result<node::FileChunk>)> done) {
    auto sb = mgr_.ref(id);
    if (!sb) return done(std::unexpected(sb.error()));
    sb->agent->read_chunk(path, offset, length, std::move(done));
  };
  FileDownload::start(*path, max_download_, std::move(read), std::move(res));
}

void Api::file_write(Request& req, const Params& p, std::shared_ptr<Responder> res) {
  auto path = file_path(req);
  if (!path) return res->send_error(path.error());
  uint32_t mode = 0644;
  if (const std::string* m = req.q("mode")) {
    char* end = nullptr;
    unsigned long v = std::strtoul(m->c_str(), &end, 8);
    if (m->empty() || *end || v > 07777)
      return res->send_error(Error{Code::kInvalidArgument, 0, "mode must be octal, e.g. 755"});
    mode = static_cast<uint32_t>(v);
  }
  auto sb = mgr_.ref(p[0]);
  if (!sb) return res->send_error(sb.error());
  if (req.body_size() > sb->disk_bytes)
    return res->send_error(Error{Code::kPayloadTooLarge, 0,
                                 "upload of " + std::to_string(req.body_size()) +
                                     " bytes exceeds the sandbox's disk limit of " +
                                     std::to_string(sb->disk_bytes) + " bytes"});
  std::string path_copy = *path;
  auto agent = sb->agent;
  auto written = [res, agent, path_copy](Result<uint64_t> r) {
    if (!r) return res->send_error(r.error());
    agent->stat(path_copy, [res](Result<node::FileEntry> e) {
      if (!e) return res->send_error(e.error());
      res->send_json(200, entry_json(*e));
    });
  };
  if (req.upload) {
    // A spooled upload goes to the agent a chunk at a time, read from its file.
    node::ByteSource src;
    src.size = req.upload->size();
    src.read = [body = req.upload](uint64_t off, size_t n) { return body->read(off, n); };
    return agent->write_file_from(*path, std::move(src), mode, true, std::move(written));
  }
  agent->write_file(*path, std::move(req.body), mode, true, std::move(written));
}

void Api::file_remove(Request& req, const Params& p, std::shared_ptr<Responder> res) {
  auto path = file_path(req);
  if (!path) return res->send_error(path.error());
  if (*path == "/")
    return res->send_error(Error{Code::kInvalidArgument, 0, "refusing to remove /"});
  auto recursive = req.q_bool("recursive", false);
  if (!recursive) return res->send_error(recursive.error());
  auto sb = mgr_.ref(p[0]);
  if (!sb) return res->send_error(sb.error());
  sb->agent->remove(*path, *recursive, [res](Result<void> r) {
    if (!r) return res->send_error(r.error());
    res->send(204, "application/json", "");
  });
}

void Api::file_list(Request& req, const Params& p, std::shared_ptr<Responder> res) {
  auto path = file_path(req);
  if (!path) return res->send_error(path.error());
  auto sb = mgr_.ref(p[0]);
  if (!sb) return res->send_error(sb.error());
  sb->agent->list(*path, [res](Result<std::vector<node::FileEntry>> r) {
    if (!r) return res->send_error(r.error());
    json::array arr;
    for (const auto& e : *r) arr.push_back(entry_json(e));
    res->send_json(200, json::object{{"entries", std::move(arr)}});
  });
}

void Api::file_stat(Request& req, const Params& p, std::shared_ptr<Responder> res) {
  auto path = file_path(req);
  if (!path) return res->send_error(path.error());
  auto sb = mgr_.ref(p[0]);
  if (!sb) return res->send_error(sb.error());
  sb->agent->stat(*path, [res](Result<node::FileEntry> r) {
    if (!r) return res->send_error(r.error());
    res->send_json(200, entry_json(*r));
  });
}

void Api::file_mkdir(Request& req, const Params& p, std::shared_ptr<Responder> res) {
  auto path = file_path(req);
  if (!path) return res->send_error(path.error());
  auto sb = mgr_.ref(p[0]);
  if (!sb) return res->send_error(sb.error());
  auto parents = req.q_bool("parents", false);
  if (!parents) return res->send_error(parents.error());
  auto agent = sb->agent;
  std::string path_copy = *path;
  agent->mkdir(*path, 0755, *parents, [res, agent, path_copy](Result<void> r) {
    if (!r) return res->send_error(r.error());
    agent->stat(path_copy, [res](Result<node::FileEntry> e) {
      if (!e) return res->send_error(e.error());
      res->send_json(201, entry_json(*e));
    });
  });
}

void Api::process_start(Request& req, const Params& p, std::shared_ptr<Responder> res) {
  auto body = json_util::parse_object(req.body);
  if (!body) return res->send_error(body.error());
  auto spec = parse_exec(*body, true);
  if (!spec) return res->send_error(spec.error());
  spec->params.step_tag = IdempotencyCache::step_tag(req);
  mgr_.start_process(p[0], std::move(spec->params), [res](Result<node::ProcessInfo> info) {
    if (!info) return res->send_error(info.error());
    res->send_json(201, process_json(*info, false));
  });
}

void Api::process_list(Request&, const Params& p, std::shared_ptr<Responder> res) {
  auto procs = mgr_.list_processes(p[0]);
  if (!procs) return res->send_error(procs.error());
  json::array arr;
  for (const auto& i : *procs) arr.push_back(process_json(i, false));
  res->send_json(200, json::object{{"processes", std::move(arr)}});
}

void Api::process_get(Request&, const Params& p, std::shared_ptr<Responder> res) {
  auto pid = pid_param(p[1]);
  if (!pid) return res->send_error(pid.error());
  auto info = mgr_.get_process(p[0], *pid);
  if (!info) return res->send_error(info.error());
  res->send_json(200, process_json(*info, false));
}

void Api::process_wait(Request& req, const Params& p, std::shared_ptr<Responder> res) {
  auto pid = pid_param(p[1]);
  if (!pid) return res->send_error(pid.error());
  int64_t timeout_ms = -1;
  if (const std::string* t = req.q("timeout")) {
    char* end = nullptr;
    double v = std::strtod(t->c_str(), &end);
    if (t->empty() || *end || !(v >= 0) || v > 30 * 24 * 3600)
      return res->send_error(Error{Code::kInvalidArgument, 0, "timeout must be seconds >= 0"});
    timeout_ms = static_cast<int64_t>(v * 1000);
  }
  mgr_.wait_process(p[0], *pid, timeout_ms, [res](Result<node::ProcessInfo> r) {
    if (!r) return res->send_error(r.error());
    res->send_json(200, process_json(*r, true));
  });
}

void Api::process_stdin(Request& req, const Params& p, std::shared_ptr<Responder> res) {
  auto pid = pid_param(p[1]);
  if (!pid) return res->send_error(pid.error());
  auto eof_param = req.q_bool("eof", false);
  if (!eof_param) return res->send_error(eof_param.error());
  const bool eof = *eof_param;
  if (req.upload) {
    // Large: paced, answered once all of it is in the process's stdin.
    StdinWrite write = [this, id = p[0], pid = *pid, eof](std::string d, bool last,
                                                          std::function<void(Result<void>)> cb) {
      mgr_.write_process_stdin(id, pid, std::move(d), last && eof, std::move(cb));
    };
    return feed_stdin(req.upload, std::move(write), [res](Result<void> r) {
      if (!r) return res->send_error(r.error());
      res->send(204, "application/json", "");
    });
  }
  auto r = mgr_.process_stdin(p[0], *pid, std::move(req.body), eof);
  if (!r) return res->send_error(r.error());
  res->send(204, "application/json", "");
}

void Api::process_signal(Request& req, const Params& p, std::shared_ptr<Responder> res) {
  auto pid = pid_param(p[1]);
  if (!pid) return res->send_error(pid.error());
  int64_t signo = 9;
  if (!req.body.empty()) {
    auto body = json_util::parse_object(req.body);
    if (!body) return res->send_error(body.error());
    auto s = json_util::get_int(*body, "signal", 9, 1, 64);
    if (!s) return res->send_error(s.error());
    signo = *s;
  }
  auto r = mgr_.signal_process(p[0], *pid, static_cast<int>(signo));
  if (!r) return res->send_error(r.error());
  res->send(204, "application/json", "");
}

// Trees move as tar archives, packed and unpacked by tar inside the sandbox: the
// archive is then handled with the sandbox's own privileges and limits, never the
// daemon's, and paths resolve inside its root. Images must ship tar (host does).
namespace {
constexpr uint64_t kTarTimeoutMs = 600'000;

// `extract`: the error of an upload. Its target directory is made first, so a
// missing file there is a fault of the archive (an entry tar could not create),
// not a missing path: 400 saying the tree may be partly extracted, never 404.
Error tar_error(const node::ExecOutcome& o, const std::string& err, const std::string& path,
                bool extract) {
  if (err.find("No space left") != std::string::npos)
    return Error{Code::kInsufficientStorage, 0,
                 "the sandbox's disk limit was reached under " + path +
                     (extract ? " (the archive may be partly extracted)" : "")};
  if (o.result.exit_code == 127 && err.find("tar") != std::string::npos &&
      err.find("not found") != std::string::npos)
    return Error{Code::kInvalidArgument, 0, "this sandbox's image has no tar"};
  if (extract)
    return Error{Code::kInvalidArgument, 0,
                 "extracting the archive under " + path +
                     " failed (it may be partly extracted): " + err.substr(0, 300)};
  if (err.find("No such file") != std::string::npos ||
      err.find("Cannot open") != std::string::npos || err.find("Cannot chdir") != std::string::npos)
    return Error{Code::kNotFound, 0, "tar " + path + ": " + err.substr(0, 300)};
  if (o.result.exit_code == 127)
    return Error{Code::kInvalidArgument, 0, "this sandbox's image has no tar"};
  return Error{Code::kInvalidArgument, 0, "tar " + path + " failed: " + err.substr(0, 300)};
}
}  // namespace

// The archive streams from tar's stdout to the client (api/download.h): the
// agent reads tar's output no further ahead than the window the client's socket
// gives back, and tar is killed when the client goes away. A tree larger than
// the download limit is cut off once that much was sent. No time limit: a
// 100 GB sparse file is a long stream (the client may leave), not a memory cost.
void Api::tar_download(Request& req, const Params& p, std::shared_ptr<Responder> res) {
  auto path = file_path(req);
  if (!path) return res->send_error(path.error());
  CommandDownload::Options o;
  o.content_type = "application/x-tar";
  o.max_bytes = max_download_;
  o.what = "the tar of " + *path;
  o.failure = [path = *path](const node::ExecOutcome& r, const std::string& err) {
    return tar_error(r, err, path, false);
  };
  std::string id = p[0];
  CommandDownload::Control ctl;
  ctl.credit = [this, id](uint32_t eid, uint64_t n) { mgr_.credit_exec(id, eid, n); };
  ctl.kill = [this, id](uint32_t eid) { mgr_.signal_exec(id, eid, 9); };
  node::ExecParams ep;
  ep.argv = {"tar", "-c", "-f", "-", "-C", *path, "."};
  ep.window = o.window;
  // One byte over the limit tells the download it was exceeded; the agent drops the rest.
  ep.output_limit = max_download_ + 1;
  auto dl = std::make_shared<CommandDownload>(res, std::move(o), std::move(ctl));
  auto eid = mgr_.exec(id, std::move(ep), dl->callbacks());
  if (!eid) return res->send_error(eid.error());
  dl->attach(*eid);
}

void Api::tar_upload(Request& req, const Params& p, std::shared_ptr<Responder> res) {
  auto path = file_path(req);
  if (!path) return res->send_error(path.error());
  auto sb = mgr_.ref(p[0]);
  if (!sb) return res->send_error(sb.error());
  if (req.body_size() > sb->disk_bytes)
    return res->send_error(Error{Code::kPayloadTooLarge, 0,
                                 "archive of " + std::to_string(req.body_size()) +
                                     " bytes exceeds the sandbox's disk limit"});
  uint64_t bytes = req.body_size();
  node::ExecParams ep;
  ep.argv = {"/bin/sh", "-c", "mkdir -p -- \"$1\" && exec tar -x -f - -C \"$1\"", "sh", *path};
  ep.timeout_ms = kTarTimeoutMs;
  ep.output_limit = 64 << 10;
  // A spooled archive is fed to tar's stdin a piece at a time once it runs.
  std::shared_ptr<const BodyFile> spooled = req.upload;
  if (spooled)
    ep.stdin_open = true;
  else
    ep.stdin_data = std::move(req.body);
  auto err = std::make_shared<std::string>();
  node::ExecCallbacks cb;
  cb.on_output = [err](int stream, std::string_view d) {
    if (stream == 2 && err->size() < 4096) err->append(d);
  };
  cb.on_done = [res, err, bytes, path = *path](Result<node::ExecOutcome> r) {
    if (!r) return res->send_error(r.error());
    if (r->result.exit_code != 0) return res->send_error(tar_error(*r, *err, path, true));
    res->send_json(200, json::object{{"path", path}, {"bytes", bytes}});
  };
  auto eid = mgr_.exec(p[0], std::move(ep), std::move(cb));
  if (!eid) return res->send_error(eid.error());
  if (spooled) {
    StdinWrite write = [this, id = p[0], eid = *eid](std::string d, bool eof,
                                                     std::function<void(Result<void>)> cb) {
      mgr_.write_exec_stdin(id, eid, std::move(d), eof, std::move(cb));
    };
    // A failure here (tar stopped reading, the sandbox ended) shows in tar's own end,
    // which answers the request; a feed that cannot go on stops tar.
    feed_stdin(std::move(spooled), std::move(write), [this, id = p[0], eid = *eid](Result<void> r) {
      if (!r) mgr_.signal_exec(id, eid, 9);
    });
  }
}

}  // namespace tp::api
