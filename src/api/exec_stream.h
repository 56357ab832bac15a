// ExecStream: the answer to an exec with "stream": true, as NDJSON events
// (started, stdout, stderr, then exit or error), paced by the client.
//
// The command runs with an output window (ExecParams::window = kWindow): the
// agent reads no more of its stdout and stderr than was granted, and each
// event's bytes are granted again (credit) once the event was written to the
// client's socket. A client that stops reading therefore stops the command's
// output at the agent (the command blocks on its pipe), and the daemon holds
// at most about one window per stream. An agent that ignores windows (one
// adopted from an older daemon) is cut off once kMaxUnwritten bytes wait for
// the client, rather than buffered without bound.
//
// A failure before the first event is answered as a plain JSON error with its
// status; after it, as an "error" event. An epilogue (an exec with "remove": the
// "removed" event) is the last line, after the exit or error event.
//
// Thread rules: the callbacks may come from any thread; state is serialised inside.
#pragma once

#include <boost/json.hpp>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "api/exec_control.h"
#include "api/http_server.h"
#include "node/service.h"

namespace tp::api {

// An exec's outcome as the API answers it (exit_code, signal, duration, ...):
// the non-streamed answer's fields and the "exit" event's.
boost::json::object exec_outcome_json(const node::ExecOutcome& o);

class ExecStream : public std::enable_shared_from_this<ExecStream> {
 public:
  static constexpr uint64_t kWindow = 256u << 10;
  // Encoded events handed to the responder and not written yet beyond which
  // the stream is cut off (base64 and JSON make an event ~1.4x its bytes).
  static constexpr uint64_t kMaxUnwritten = 8u << 20;

  ExecStream(std::shared_ptr<Responder> res, ExecControl::Fns ctl)
      : res_(std::move(res)), ctl_(std::move(ctl)) {}

  // Callbacks for the command's exec (started with ExecParams::window = kWindow).
  node::ExecCallbacks callbacks();
  // The exec started (Service::exec returned its id).
  void attach(uint32_t exec_id) { ctl_.attach(exec_id); }
  // One more event written after the exit (or error) event; set before on_done runs.
  void set_epilogue(boost::json::object event) {
    std::lock_guard lk(mu_);
    epilogue_ = std::move(event);
  }

  // For tests: encoded bytes handed to the responder and not written yet.
  uint64_t unwritten() {
    std::lock_guard lk(mu_);
    return unwritten_;
  }

 private:
  static constexpr const char* kContentType = "application/x-ndjson";
  // Hands one event to the responder (opening the stream on the first); its
  // `credit` raw bytes are granted back once it is written.
  void send(std::string line, uint64_t credit);
  void on_written(uint64_t n, uint64_t credit, bool written);

  std::shared_ptr<Responder> res_;
  ExecControl ctl_;
  std::mutex mu_;
  uint64_t unwritten_ = 0;
  bool started_ = false;
  bool stopped_ = false;  // ended or cut off
  boost::json::object epilogue_;
};

}  // namespace tp::api
