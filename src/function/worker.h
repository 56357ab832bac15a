// Worker: one function-tier worker, a zygote serving calls (docs/function-tier.md).
//
// The function service (function_service.h) sees workers through this interface only;
// ZygoteWorker (zygote_worker.h) is the real one, a container sandbox whose tp-agent
// runs the zygote, and unit tests use fakes.
//
// Thread rules: every method may be called from any thread. Callbacks (a call's done,
// on_lost) never run inline from the call that caused them; they run on the worker's
// io threads, `done` exactly once per start().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/result.h"
#include "function/call.h"
#include "function/zygote_codec.h"

namespace tp::function {

class Worker {
 public:
  using Done = std::function<void(Result<StepResult>)>;
  virtual ~Worker() = default;
  // The worker's sandbox id.
  virtual const std::string& id() const = 0;
  // Runs one call in a fresh child of the zygote; returns a handle for cancel(). An
  // error in `done` means the call did not complete (the worker was lost, the call was
  // cancelled before it started); a program's own failure is a StepResult.
  virtual uint32_t start(const zygote::CallMeta& meta, std::string payload, Done done) = 0;
  // Stops a call: a running one is killed (its StepResult then says so), a waiting one fails.
  virtual void cancel(uint32_t call) = 0;
  // Runs once when the worker can no longer run calls; its running calls have failed by then.
  virtual void set_on_lost(std::function<void(const Error&)> cb) = 0;
  virtual bool alive() const = 0;
  // Ends the zygote and removes the sandbox; blocks. Idempotent.
  virtual void destroy() = 0;
};

// Makes a ready worker for an image; blocks (a sandbox create and a zygote start).
using WorkerFactory = std::function<Result<std::shared_ptr<Worker>>(const std::string& image)>;

}  // namespace tp::function
