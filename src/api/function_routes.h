// FunctionRoutes: the function tier's native API (api/openapi.yaml, docs/function-tier.md)
// over a FunctionService.
//
//   POST /v1/functions/run         one program: language, source, stdin, files, args,
//                                  limits -> stdout, stderr, exit, times, memory, verdict
//   POST /v1/functions/batch       many programs ({"runs": [...]}) or one program against
//                                  many inputs ({"language", "source", ..., "cases": [...]})
//   GET  /v1/functions/languages   the languages this node serves
//   GET  /v1/functions             workers, queue, rates, verdict counts
//
// A run's client (fair queueing, per-client limit) is its API key, else its peer (a
// unix-socket uid or a TCP address). A client that goes away cancels what it asked for.
//
// Thread rules: handle() may be called from any io thread concurrently.
#pragma once

#include <boost/json/object.hpp>
#include <memory>
#include <string>
#include <vector>

#include "api/routes.h"
#include "function/function_service.h"

namespace tp::api {

class FunctionRoutes : public RouteProvider {
 public:
  explicit FunctionRoutes(std::shared_ptr<function::FunctionService> svc) : svc_(std::move(svc)) {}
  bool handle(Request& req, std::shared_ptr<Responder> res) override;
  static std::vector<RouteInfo> routes();
  // True for the routes whose bodies may be larger than the JSON limit (programs, inputs).
  static bool takes_large_body(const std::string& method, const std::string& path);

 private:
  std::shared_ptr<function::FunctionService> svc_;
};

// Who a request is for the function tier's fairness and limits.
std::string function_client(const Caller& c);
// The native JSON of a result (also used by the SandboxFusion endpoint's tests).
boost::json::object run_result_json(const function::RunResult& r);
// A native run request from its JSON (fields of openapi.yaml FunctionRun).
Result<function::RunRequest> parse_run_request(const boost::json::object& o);

}  // namespace tp::api
