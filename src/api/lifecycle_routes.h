// LifecycleRoutes: templates, warm pools and jobs (api/openapi.yaml; docs/lifecycle.md):
//
//   POST   /v1/templates                   a new template (409 if the name exists)
//   PUT    /v1/templates/{name}            create or replace (a replace drains its pool;
//                                          "version" in the body makes it compare-and-set)
//   GET    /v1/templates[/{name}]          one, or all with their pools
//   DELETE /v1/templates/{name}            forget it and drain its pool
//   GET    /v1/pools                       every pool: ready, creating, target, hits, ...
//   POST   /v1/jobs                        a new job with a lease (and quotas)
//   GET    /v1/jobs[/{id}]                 one with its use, or the live ones (?all=true)
//   POST   /v1/jobs/{id}/heartbeat         renews the lease (a lapsed job is active again)
//   DELETE /v1/jobs/{id}                   ends it and reclaims its sandboxes
//   DELETE /v1/jobs/{id}/steps/{step}      reclaims the step's sandboxes
//
// Creates that name a template or a job are POST /v1/sandboxes[/batch] (api/routes.h).
//
// Thread rules: handle() may be called from any io thread concurrently; the store
// calls it makes are short (SQLite), the reclaims answer on the node's io threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "api/routes.h"
#include "node/jobs.h"
#include "node/pools.h"

namespace tp::api {

class LifecycleRoutes : public RouteProvider {
 public:
  LifecycleRoutes(node::WarmPools& pools, node::JobManager& jobs);
  bool handle(Request& req, std::shared_ptr<Responder> res) override;
  static std::vector<RouteInfo> routes();

 private:
  void templates(Request& req, const std::vector<std::string>& s, std::shared_ptr<Responder> res);
  void jobs(Request& req, const std::vector<std::string>& s, std::shared_ptr<Responder> res);

  node::WarmPools& pools_;
  node::JobManager& jobs_;
};

}  // namespace tp::api
