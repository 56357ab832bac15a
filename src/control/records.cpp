// The JSON bodies of the document stores (templates, jobs).
#include <boost/json.hpp>

#include "common/json_util.h"
#include "control/job_store.h"
#include "control/template_store.h"

namespace tp::control {
namespace json = boost::json;
namespace {

json::object map_json(const std::map<std::string, std::string>& m) {
  json::object o;
  for (const auto& [k, v] : m) o[k] = v;
  return o;
}

std::map<std::string, std::string> json_map(const json::object& o, const char* key) {
  std::map<std::string, std::string> m;
  if (auto* v = o.if_contains(key); v && v->is_object())
    for (const auto& [k, x] : v->as_object())
      if (x.is_string()) m[std::string(k)] = std::string(x.as_string());
  return m;
}

std::string str(const json::object& o, const char* key, std::string def = "") {
  auto* v = o.if_contains(key);
  return v && v->is_string() ? std::string(v->as_string()) : def;
}

template <class T>
T num(const json::object& o, const char* key, T def) {
  auto* v = o.if_contains(key);
  if (!v || !(v->is_int64() || v->is_uint64() || v->is_double())) return def;
  return v->to_number<T>();
}

Result<json::object> parse_body(const Doc& d) {
  boost::system::error_code ec;
  json::value v = json::parse(d.body, ec);
  if (ec || !v.is_object())
    return fail(Code::kInternal, "stored document " + d.key + " is damaged");
  return std::move(v.as_object());
}

}  // namespace

std::string TemplateStore::to_body(const TemplateRecord& t) {
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
                 {"created_ms", t.created_ms},
                 {"updated_ms", t.updated_ms}};
  return json::serialize(o);
}

Result<TemplateRecord> TemplateStore::from_doc(const Doc& d) {
  auto o = parse_body(d);
  if (!o) return std::unexpected(o.error());
  TemplateRecord t;
  t.name = d.key;
  t.image = str(*o, "image", t.image);
  t.tier = str(*o, "tier", t.tier);
  t.memory_mb = num<uint64_t>(*o, "memory_mb", t.memory_mb);
  t.cpus = num<double>(*o, "cpus", t.cpus);
  t.pids = num<uint64_t>(*o, "pids", t.pids);
  t.disk_mb = num<uint64_t>(*o, "disk_mb", t.disk_mb);
  t.ttl_seconds = num<uint64_t>(*o, "ttl_seconds", t.ttl_seconds);
  t.idle_timeout_seconds = num<uint64_t>(*o, "idle_timeout_seconds", 0);
  t.env = json_map(*o, "env");
  t.labels = json_map(*o, "labels");
  t.priority = str(*o, "priority", t.priority);
  t.pool_min = num<uint32_t>(*o, "pool_min", 0);
  t.pool_max = num<uint32_t>(*o, "pool_max", 0);
  t.created_ms = num<int64_t>(*o, "created_ms", 0);
  t.updated_ms = num<int64_t>(*o, "updated_ms", 0);
  t.version = d.version;
  return t;
}

Result<uint64_t> TemplateStore::put(const TemplateRecord& t) {
  return docs_.put(Doc{t.name, to_body(t), true, 0, t.version});
}

Result<std::optional<TemplateRecord>> TemplateStore::get(const std::string& name) {
  auto d = docs_.get(name);
  if (!d) return std::unexpected(d.error());
  if (!*d) return std::optional<TemplateRecord>{};
  auto t = from_doc(**d);
  if (!t) return std::unexpected(t.error());
  return std::optional<TemplateRecord>{std::move(*t)};
}

Result<std::vector<TemplateRecord>> TemplateStore::list() {
  auto docs = docs_.list(false);
  if (!docs) return std::unexpected(docs.error());
  std::vector<TemplateRecord> out;
  for (const auto& d : *docs)
    if (auto t = from_doc(d)) out.push_back(std::move(*t));
  return out;
}

Result<void> TemplateStore::remove(const std::string& name, uint64_t version) {
  return docs_.remove(name, version);
}

std::string JobStore::to_body(const JobRecord& j) {
  json::object o{{"id", j.id},
                 {"name", j.name},
                 {"state", j.state},
                 {"lease_seconds", j.lease_seconds},
                 {"grace_seconds", j.grace_seconds},
                 {"created_ms", j.created_ms},
                 {"lease_expires_ms", j.lease_expires_ms},
                 {"lapsed_at_ms", j.lapsed_at_ms},
                 {"ended_ms", j.ended_ms},
                 {"end_reason", j.end_reason},
                 {"quota", json::object{{"sandboxes", j.quota.sandboxes},
                                        {"memory_mb", j.quota.memory_mb},
                                        {"cpus", j.quota.cpus}}},
                 {"labels", map_json(j.labels)}};
  return json::serialize(o);
}

Result<JobRecord> JobStore::from_doc(const Doc& d) {
  auto o = parse_body(d);
  if (!o) return std::unexpected(o.error());
  JobRecord j;
  j.id = d.key;
  j.name = str(*o, "name");
  j.state = str(*o, "state", j.state);
  j.lease_seconds = num<uint64_t>(*o, "lease_seconds", j.lease_seconds);
  j.grace_seconds = num<uint64_t>(*o, "grace_seconds", j.grace_seconds);
  j.created_ms = num<int64_t>(*o, "created_ms", 0);
  j.lease_expires_ms = num<int64_t>(*o, "lease_expires_ms", 0);
  j.lapsed_at_ms = num<int64_t>(*o, "lapsed_at_ms", 0);
  j.ended_ms = num<int64_t>(*o, "ended_ms", 0);
  j.end_reason = str(*o, "end_reason");
  if (auto* q = o->if_contains("quota"); q && q->is_object()) {
    j.quota.sandboxes = num<uint64_t>(q->as_object(), "sandboxes", 0);
    j.quota.memory_mb = num<uint64_t>(q->as_object(), "memory_mb", 0);
    j.quota.cpus = num<double>(q->as_object(), "cpus", 0);
  }
  j.labels = json_map(*o, "labels");
  j.version = d.version;
  return j;
}

Result<uint64_t> JobStore::put(const JobRecord& j) {
  return docs_.put(Doc{j.id, to_body(j), j.state != "ended", j.ended_ms, j.version});
}

Result<std::optional<JobRecord>> JobStore::get(const std::string& id) {
  auto d = docs_.get(id);
  if (!d) return std::unexpected(d.error());
  if (!*d) return std::optional<JobRecord>{};
  auto j = from_doc(**d);
  if (!j) return std::unexpected(j.error());
  return std::optional<JobRecord>{std::move(*j)};
}

Result<std::vector<JobRecord>> JobStore::list(bool live_only) {
  auto docs = docs_.list(live_only);
  if (!docs) return std::unexpected(docs.error());
  std::vector<JobRecord> out;
  for (const auto& d : *docs)
    if (auto j = from_doc(d)) out.push_back(std::move(*j));
  return out;
}

}  // namespace tp::control
