#include "node/record_json.h"

#include "common/json_util.h"

namespace tp::node {

namespace json = boost::json;

json::object sandbox_json(const control::SandboxRecord& r) {
  json::object o;
  o["id"] = r.id;
  o["state"] = r.state;
  o["tier"] = r.tier;
  o["image"] = r.image;
  o["node"] = r.node;
  o["memory_mb"] = r.memory_mb;
  o["cpus"] = r.cpus;
  o["pids"] = r.pids;
  o["disk_mb"] = r.disk_mb;
  o["ttl_seconds"] = r.ttl_seconds;
  o["idle_timeout_seconds"] = r.idle_timeout_seconds;
  json::object labels, env;
  for (const auto& [k, v] : r.labels) labels[k] = v;
  for (const auto& [k, v] : r.env) env[k] = v;
  o["labels"] = std::move(labels);
  o["env"] = std::move(env);
  o["created_at"] = json_util::rfc3339(r.created_at_ms);
  o["expires_at"] = json_util::rfc3339(r.expires_at_ms);
  o["priority"] = r.priority.empty() ? "normal" : r.priority;
  if (!r.template_name.empty()) o["template"] = r.template_name;
  if (!r.job.empty()) o["job"] = r.job;
  if (!r.step.empty()) o["step"] = r.step;
  if (r.ended_at_ms) o["ended_at"] = json_util::rfc3339(r.ended_at_ms);
  if (!r.end_reason.empty()) o["end_reason"] = r.end_reason;  // ended, or stopping
  return o;
}

}  // namespace tp::node
