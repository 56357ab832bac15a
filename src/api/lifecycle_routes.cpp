#include "api/lifecycle_routes.h"

#include <boost/json.hpp>
#include <chrono>

#include "common/json_util.h"
#include "common/path.h"

namespace tp::api {

namespace json = boost::json;
using control::JobRecord;
using control::TemplateRecord;

namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

json::object map_json(const std::map<std::string, std::string>& m) {
  json::object o;
  for (const auto& [k, v] : m) o[k] = v;
  return o;
}

json::object pool_json(const node::PoolStatus& s) {
  uint64_t asked = s.hits + s.misses;
  return json::object{{"template", s.template_name},
                      {"ready", s.ready},
                      {"creating", s.creating},
                      {"target", s.target},
                      {"min", s.min},
                      {"max", s.max},
                      {"hits", s.hits},
                      {"misses", s.misses},
                      {"hit_rate", asked ? static_cast<double>(s.hits) / asked : 0.0},
                      {"rate_per_second", s.rate},
                      {"cold_create_seconds", s.cold_seconds}};
}

json::object template_json(const TemplateRecord& t, const node::PoolStatus* pool) {
  json::object o{{"name", t.name},
                 {"image", t.image},
                 {"tier", t.tier},
                 {"memory_mb", t.memory_mb},
                 {"cpus", t.cpus},
                 {"pids", t.pids},
                 {"disk_mb", t.disk_mb},
                 {"ttl_seconds", t.ttl_seconds},
                 {"idle_timeout_seconds", t.idle_timeout_seconds},
                 {"env", map_json(t.env)},
                 {"labels", map_json(t.labels)},
                 {"priority", t.priority},
                 {"pool_min", t.pool_min},
                 {"pool_max", t.pool_max},
                 {"version", t.version}};
  if (t.created_ms) o["created_at"] = json_util::rfc3339(t.created_ms);
  if (t.updated_ms) o["updated_at"] = json_util::rfc3339(t.updated_ms);
  if (pool) o["pool"] = pool_json(*pool);
  return o;
}

// `with_use`: what its sandboxes hold now (GET), else left out.
json::object job_json(const node::JobView& v, bool with_use = true) {
  const JobRecord& j = v.job;
  json::object o{{"id", j.id},
                 {"name", j.name},
                 {"state", j.state},
                 {"lease_seconds", j.lease_seconds},
                 {"grace_seconds", j.grace_seconds},
                 {"created_at", json_util::rfc3339(j.created_ms)},
                 {"lease_expires_at", json_util::rfc3339(j.lease_expires_ms)},
                 {"quota", json::object{{"sandboxes", j.quota.sandboxes},
                                        {"memory_mb", j.quota.memory_mb},
                                        {"cpus", j.quota.cpus}}},
                 {"labels", map_json(j.labels)}};
  if (with_use)
    o["use"] = json::object{{"sandboxes", v.use.sandboxes},
                            {"memory_mb", v.use.memory_mb},
                            {"cpus", v.use.cpus},
                            {"paused", v.paused}};
  if (j.lapsed_at_ms) o["lapsed_at"] = json_util::rfc3339(j.lapsed_at_ms);
  if (j.ended_ms) {
    o["ended_at"] = json_util::rfc3339(j.ended_ms);
    o["end_reason"] = j.end_reason;
  }
  return o;
}

// A template body: the sandbox fields of a create, the pool's bounds, and (PUT) the
// version to replace.
Result<TemplateRecord> parse_template(const json::object& o, const std::string& name) {
  auto p = parse_create(o, {"name", "pool_min", "pool_max", "version"});
  if (!p) return std::unexpected(p.error());
  for (const char* k : {"template", "job", "step"})
    if (p->given.count(k))
      return fail(Code::kInvalidArgument, std::string("a template has no field '") + k + "'");
  auto n = json_util::get_string(o, "name", name);
  if (!n) return std::unexpected(n.error());
  if (!name.empty() && *n != name)
    return fail(Code::kInvalidArgument,
                "field 'name' ('" + *n + "') differs from the path's ('" + name + "')");
  auto pmin = json_util::get_int(o, "pool_min", 0, 0, 100000);
  if (!pmin) return std::unexpected(pmin.error());
  auto pmax = json_util::get_int(o, "pool_max", 0, 0, 100000);
  if (!pmax) return std::unexpected(pmax.error());
  auto ver = json_util::get_int(o, "version", 0, 0, INT64_MAX);
  if (!ver) return std::unexpected(ver.error());
  TemplateRecord t;
  t.name = *n;
  t.image = p->image;
  t.tier = p->tier;
  t.memory_mb = p->memory_mb;
  t.cpus = p->cpus;
  t.pids = p->pids;
  t.disk_mb = p->disk_mb;
  t.ttl_seconds = p->ttl_seconds;
  t.idle_timeout_seconds = p->idle_timeout_seconds;
  t.env = p->env;
  t.labels = p->labels;
  t.priority = p->priority;
  t.pool_min = static_cast<uint32_t>(*pmin);
  t.pool_max = static_cast<uint32_t>(*pmax);
  t.version = static_cast<uint64_t>(*ver);
  return t;
}

Result<JobRecord> parse_job(const json::object& o) {
  TP_TRY(json_util::only_keys(o, {"name", "lease_seconds", "grace_seconds", "quota", "labels"}));
  JobRecord j;
  auto name = json_util::get_string(o, "name", "");
  if (!name) return std::unexpected(name.error());
  auto lease = json_util::get_int(o, "lease_seconds", 60, 1, INT64_MAX);
  if (!lease) return std::unexpected(lease.error());
  auto grace = json_util::get_int(o, "grace_seconds", 600, 0, INT64_MAX);
  if (!grace) return std::unexpected(grace.error());
  auto labels = json_util::get_string_map(o, "labels");
  if (!labels) return std::unexpected(labels.error());
  if (auto* q = o.if_contains("quota"); q && !q->is_null()) {
    if (!q->is_object()) return fail(Code::kInvalidArgument, "field 'quota' must be an object");
    const auto& qo = q->as_object();
    TP_TRY(json_util::only_keys(qo, {"sandboxes", "memory_mb", "cpus"}));
    auto s = json_util::get_int(qo, "sandboxes", 0, 0, 1 << 24);
    if (!s) return std::unexpected(s.error());
    auto m = json_util::get_int(qo, "memory_mb", 0, 0, 1ll << 40);
    if (!m) return std::unexpected(m.error());
    auto c = json_util::get_number(qo, "cpus", 0, 0, 1 << 20);
    if (!c) return std::unexpected(c.error());
    j.quota.sandboxes = static_cast<uint64_t>(*s);
    j.quota.memory_mb = static_cast<uint64_t>(*m);
    j.quota.cpus = *c;
  }
  j.name = *name;
  j.lease_seconds = static_cast<uint64_t>(*lease);
  j.grace_seconds = static_cast<uint64_t>(*grace);
  j.labels = std::move(*labels);
  return j;
}

std::string name_of(const json::object& o) {
  auto* v = o.if_contains("name");
  return v && v->is_string() ? std::string(v->as_string()) : "";
}

}  // namespace

LifecycleRoutes::LifecycleRoutes(node::WarmPools& pools, node::JobManager& jobs)
    : pools_(pools), jobs_(jobs) {}

std::vector<RouteInfo> LifecycleRoutes::routes() {
  return {{"POST", "/v1/templates"},
          {"GET", "/v1/templates"},
          {"GET", "/v1/templates/{name}"},
          {"PUT", "/v1/templates/{name}"},
          {"DELETE", "/v1/templates/{name}"},
          {"GET", "/v1/pools"},
          {"POST", "/v1/jobs"},
          {"GET", "/v1/jobs"},
          {"GET", "/v1/jobs/{id}"},
          {"DELETE", "/v1/jobs/{id}"},
          {"POST", "/v1/jobs/{id}/heartbeat"},
          {"DELETE", "/v1/jobs/{id}/steps/{step}"}};
}

bool LifecycleRoutes::handle(Request& req, std::shared_ptr<Responder> res) {
  auto seg = path_segments(req.path);
  if (seg.size() < 2 || seg[0] != "v1") return false;
  std::vector<std::string> s(seg.begin(), seg.end());
  if (s[1] == "templates") {
    templates(req, s, std::move(res));
    return true;
  }
  if (s[1] == "jobs") {
    jobs(req, s, std::move(res));
    return true;
  }
  if (s[1] == "pools" && s.size() == 2) {
    if (req.method != "GET" && req.method != "HEAD") {
      res->send_error(
          Error{Code::kInvalidArgument, 0, "method " + req.method + " not allowed on " + req.path});
      return true;
    }
    json::array arr;
    for (const auto& p : pools_.status()) arr.push_back(pool_json(p));
    res->send_json(200, json::object{{"pools", std::move(arr)}});
    return true;
  }
  return false;
}

void LifecycleRoutes::templates(Request& req, const std::vector<std::string>& s,
                                std::shared_ptr<Responder> res) {
  const bool get = req.method == "GET" || req.method == "HEAD";
  auto not_allowed = [&] {
    res->send_error(
        Error{Code::kInvalidArgument, 0, "method " + req.method + " not allowed on " + req.path});
  };
  auto pool_of = [&](const std::string& name) -> std::optional<node::PoolStatus> {
    for (auto& p : pools_.status())
      if (p.template_name == name) return p;
    return std::nullopt;
  };
  if (s.size() == 2) {
    if (get) {
      auto all = pools_.templates();
      if (!all) return res->send_error(all.error());
      auto st = pools_.status();
      json::array arr;
      for (const auto& t : *all) {
        const node::PoolStatus* ps = nullptr;
        for (const auto& p : st)
          if (p.template_name == t.name) ps = &p;
        arr.push_back(template_json(t, ps));
      }
      return res->send_json(200, json::object{{"templates", std::move(arr)}});
    }
    if (req.method != "POST") return not_allowed();
    auto body = json_util::parse_object(req.body);
    if (!body) return res->send_error(body.error());
    if (!body->contains("name"))
      return res->send_error(Error{Code::kInvalidArgument, 0, "field 'name' is required"});
    auto t = parse_template(*body, "");
    if (!t) return res->send_error(t.error());
    if (t->version != 0)
      return res->send_error(
          Error{Code::kInvalidArgument, 0, "field 'version' is for PUT /v1/templates/{name}"});
    t->created_ms = t->updated_ms = now_ms();
    auto put = pools_.put_template(std::move(*t));
    if (!put) {
      if (put.error().code == Code::kConflict)
        return res->send_error(Error{
            Code::kConflict, 0,
            "template '" + name_of(*body) + "' exists (PUT /v1/templates/{name} replaces it)"});
      return res->send_error(put.error());
    }
    auto ps = pool_of(put->name);
    return res->send_json(201, template_json(*put, ps ? &*ps : nullptr));
  }
  if (s.size() != 3)
    return res->send_error(Error{Code::kNotFound, 0, "no route " + req.method + " " + req.path});
  const std::string& name = s[2];
  if (get) {
    auto t = pools_.get_template(name);
    if (!t) return res->send_error(t.error());
    auto ps = pool_of(name);
    return res->send_json(200, template_json(*t, ps ? &*ps : nullptr));
  }
  if (req.method == "DELETE") {
    auto t = pools_.get_template(name);
    if (!t) return res->send_error(t.error());
    auto r = pools_.remove_template(name);
    if (!r) return res->send_error(r.error());
    return res->send_json(200, template_json(*t, nullptr));
  }
  if (req.method != "PUT") return not_allowed();
  auto body = json_util::parse_object(req.body);
  if (!body) return res->send_error(body.error());
  auto t = parse_template(*body, name);
  if (!t) return res->send_error(t.error());
  auto cur = pools_.get_template(name);
  bool exists = cur.has_value();
  if (!cur && cur.error().code != Code::kNotFound) return res->send_error(cur.error());
  if (t->version == 0 && exists) t->version = cur->version;  // no version: last writer wins
  if (t->version != 0 && !exists)
    return res->send_error(
        Error{Code::kConflict, 0,
              "template '" + name + "' does not exist at version " + std::to_string(t->version)});
  if (exists && t->version != cur->version)
    return res->send_error(Error{Code::kConflict, 0,
                                 "template '" + name + "' is at version " +
                                     std::to_string(cur->version) + ", not " +
                                     std::to_string(t->version)});
  t->created_ms = exists ? cur->created_ms : now_ms();
  t->updated_ms = now_ms();
  auto put = pools_.put_template(std::move(*t));
  if (!put) return res->send_error(put.error());
  auto ps = pool_of(name);
  res->send_json(exists ? 200 : 201, template_json(*put, ps ? &*ps : nullptr));
}

void LifecycleRoutes::jobs(Request& req, const std::vector<std::string>& s,
                           std::shared_ptr<Responder> res) {
  const bool get = req.method == "GET" || req.method == "HEAD";
  auto not_allowed = [&] {
    res->send_error(
        Error{Code::kInvalidArgument, 0, "method " + req.method + " not allowed on " + req.path});
  };
  if (s.size() == 2) {
    if (get) {
      auto all = req.q_bool("all", false);
      if (!all) return res->send_error(all.error());
      auto list = jobs_.list(*all);
      if (!list) return res->send_error(list.error());
      json::array arr;
      for (const auto& v : *list) arr.push_back(job_json(v));
      return res->send_json(200, json::object{{"jobs", std::move(arr)}});
    }
    if (req.method != "POST") return not_allowed();
    auto body = json_util::parse_object(req.body.empty() ? std::string("{}") : req.body);
    if (!body) return res->send_error(body.error());
    auto spec = parse_job(*body);
    if (!spec) return res->send_error(spec.error());
    auto j = jobs_.create(std::move(*spec));
    if (!j) return res->send_error(j.error());
    return res->send_json(201, job_json(node::JobView{*j, {}, 0}, false));
  }
  const std::string& id = s[2];
  if (s.size() == 3) {
    if (get) {
      auto v = jobs_.get(id);
      if (!v) return res->send_error(v.error());
      return res->send_json(200, job_json(*v));
    }
    if (req.method != "DELETE") return not_allowed();
    return jobs_.end(id, [res](Result<JobRecord> r) {
      if (!r) return res->send_error(r.error());
      res->send_json(200, job_json(node::JobView{*r, {}, 0}, false));
    });
  }
  if (s.size() == 4 && s[3] == "heartbeat") {
    if (req.method != "POST") return not_allowed();
    auto j = jobs_.heartbeat(id);
    if (!j) return res->send_error(j.error());
    return res->send_json(200, job_json(node::JobView{*j, {}, 0}, false));
  }
  if (s.size() == 5 && s[3] == "steps") {
    if (req.method != "DELETE") return not_allowed();
    std::string step = s[4];
    return jobs_.end_step(id, step, [res, id, step](Result<uint64_t> n) {
      if (!n) return res->send_error(n.error());
      res->send_json(200, json::object{{"job", id}, {"step", step}, {"reclaimed", *n}});
    });
  }
  res->send_error(Error{Code::kNotFound, 0, "no route " + req.method + " " + req.path});
}

}  // namespace tp::api
