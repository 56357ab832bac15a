#include "api/exec_stream.h"

#include "common/json_util.h"
#include "common/log.h"

namespace tp::api {

namespace json = boost::json;

json::object exec_outcome_json(const node::ExecOutcome& o) {
  json::object j;
  const auto& r = o.result;
  j["exit_code"] = r.exit_code;
  j["signal"] = r.signal;
  j["duration"] = static_cast<double>(r.wall_us) / 1e6;
  j["max_rss_kb"] = r.max_rss_kb;
  j["timed_out"] = r.timed_out;
  j["oom_killed"] = o.oom_killed;
  j["stdout_truncated"] = r.stdout_truncated;
  j["stderr_truncated"] = r.stderr_truncated;
  return j;
}

// The agent's strand calls on_started, on_output and on_done one at a time, so
// the responder is called in order outside mu_: a responder may report a chunk
// written (false) inline.
node::ExecCallbacks ExecStream::callbacks() {
  node::ExecCallbacks cb;
  cb.on_started = [self = shared_from_this()](uint32_t pid) {
    self->send(json::serialize(json::object{{"type", "started"}, {"pid", pid}}) + "\n", 0);
  };
  cb.on_output = [self = shared_from_this()](int stream, std::string_view data) {
    json::object j{{"type", stream == 2 ? "stderr" : "stdout"},
                   {"data", json_util::base64_encode(data)}};
    self->send(json::serialize(j) + "\n", data.size());
  };
  cb.on_done = [self = shared_from_this()](Result<node::ExecOutcome> r) {
    bool open;
    json::object epilogue;
    {
      std::lock_guard lk(self->mu_);
      if (self->stopped_) return;
      self->stopped_ = true;
      open = !std::exchange(self->started_, true);
      epilogue = std::move(self->epilogue_);
    }
    if (!r && open) return self->res_->send_error(r.error());
    if (open) self->res_->start_stream(200, kContentType);
    json::object j;
    if (r) {
      j = exec_outcome_json(*r);
      j["type"] = "exit";
    } else {
      j = json::object{{"type", "error"},
                       {"code", std::string(code_name(r.error().code))},
                       {"message", r.error().message()}};
    }
    // Without flow control: an idempotent request's recorder holds the last
    // event until its record is stored.
    std::string lines = json_util::serialize_utf8(j) + "\n";
    if (!epilogue.empty()) lines += json_util::serialize_utf8(epilogue) + "\n";
    self->res_->write_chunk(std::move(lines));
    self->res_->end_stream();
  };
  return cb;
}

void ExecStream::send(std::string line, uint64_t credit) {
  uint64_t n = line.size();
  bool open, cut = false;
  uint64_t waiting;
  {
    std::lock_guard lk(mu_);
    if (stopped_) return;  // ended or cut off: its window is not given back
    open = !std::exchange(started_, true);
    waiting = unwritten_ += n;
    if (waiting > kMaxUnwritten) stopped_ = cut = true;
  }
  if (open) res_->start_stream(200, kContentType);
  if (cut) {
    spdlog::warn(
        "exec stream cut off: {} bytes wait for the client, more than the window allows "
        "(an agent without flow control?)",
        waiting);
    res_->abort_stream();
    ctl_.kill();
    return;
  }
  res_->write_chunk(std::move(line), [w = weak_from_this(), n, credit](bool ok) {
    if (auto s = w.lock()) s->on_written(n, credit, ok);
  });
}

// Not written (the client is gone): the window is given back all the same. The
// events still go to the responder: with an Idempotency-Key its recorder keeps
// them (and the exit) for the retry or the fetch by key that may come within the
// grace period (or at any time, for a call that asked to finish); without one the
// abort kills the command.
void ExecStream::on_written(uint64_t n, uint64_t credit, bool) {
  {
    std::lock_guard lk(mu_);
    unwritten_ -= n;
    if (stopped_) return;
  }
  ctl_.credit(credit);
}

}  // namespace tp::api
