// SandboxFusionRoutes: SandboxFusion's `POST /run_code` on the function tier, so that an
// RL framework written against a SandboxFusion server (verl's sandbox_fusion reward,
// among others) gets the same answers from Tidepool with only its URL changed
// (docs/function-tier.md, "SandboxFusion compatibility").
//
// Request (SandboxFusion's RunCodeRequest; unknown fields are ignored, as pydantic does):
//   code (required), language (required, one of SandboxFusion's language names),
//   compile_timeout (s, default 10), run_timeout (s, default 10), memory_limit_MB (default
//   -1: this node's default), stdin (null = none), files {path: base64 | null},
//   fetch_files [path]
// Answer (RunCodeResponse): status "Success" | "Failed" | "SandboxError", message,
//   compile_result and run_result, each null or {status "Finished" | "TimeLimitExceeded" |
//   "Error", execution_time (s), return_code, stdout, stderr}, executor_pod_name (null),
//   files {path: base64}.
// Mapping: a step that ran to its end is Finished with its exit status (-N when killed by
//   signal N, as SandboxFusion's asyncio reports it; a memory or output limit kills with
//   SIGKILL: -9); a step over its time limit is TimeLimitExceeded with return_code null;
//   status is SandboxError when the run could not complete (the message says why),
//   Failed when a step timed out or exited non-zero (a failed compile leaves run_result
//   null), else Success.
// A language SandboxFusion knows but this node does not serve answers 200 SandboxError
//   naming the served ones; a name SandboxFusion itself does not accept, or a missing or
//   mistyped field, answers 422 with FastAPI's {"detail": [...]} shape.
//
// Thread rules: handle() may be called from any io thread concurrently.
#pragma once

#include <boost/json/object.hpp>
#include <memory>

#include "api/routes.h"
#include "function/function_service.h"

namespace tp::api {

class SandboxFusionRoutes : public RouteProvider {
 public:
  explicit SandboxFusionRoutes(std::shared_ptr<function::FunctionService> svc)
      : svc_(std::move(svc)) {}
  bool handle(Request& req, std::shared_ptr<Responder> res) override;
  static std::vector<RouteInfo> routes() { return {{"POST", "/run_code"}}; }

 private:
  std::shared_ptr<function::FunctionService> svc_;
};

// SandboxFusion's answer for a result (exposed for unit tests).
boost::json::object sandbox_fusion_response(const Result<function::RunResult>& r,
                                            const std::vector<std::string>& fetch);

}  // namespace tp::api
