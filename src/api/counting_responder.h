// CountingResponder: the outermost wrapper of every API answer. It counts the answer's
// status in the metrics, tells `done` when the request is over (its last reference
// went), and forwards everything else to the connection unchanged, run_on_connection
// included: the step log's appends rely on reaching the connection's thread through it.
//
// Thread rules: as the Responder it wraps; `done` runs on whichever thread drops the
// last reference.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "api/http_server.h"
#include "common/metrics.h"

namespace tp::api {

class CountingResponder : public Responder {
 public:
  CountingResponder(std::shared_ptr<Responder> inner, Metrics& m, std::function<void()> done = {})
      : inner_(std::move(inner)), m_(m), done_(std::move(done)) {}
  ~CountingResponder() override {
    if (done_) done_();
  }
  void send(int status, std::string ct, std::string body) override {
    m_.count_http(status);
    inner_->send(status, std::move(ct), std::move(body));
  }
  void start_stream(int status, std::string ct) override {
    m_.count_http(status);
    inner_->start_stream(status, std::move(ct));
  }
  void write_chunk(std::string d) override { inner_->write_chunk(std::move(d)); }
  void write_chunk(std::string d, std::function<void(bool)> written) override {
    inner_->write_chunk(std::move(d), std::move(written));
  }
  void end_stream() override { inner_->end_stream(); }
  void abort_stream() override { inner_->abort_stream(); }
  void set_on_abort(std::function<void()> cb) override { inner_->set_on_abort(std::move(cb)); }
  void add_header(std::string n, std::string v) override {
    inner_->add_header(std::move(n), std::move(v));
  }
  // The default would run fn on the calling thread (an agent's), which the step log's
  // sync would then hold up.
  void run_on_connection(std::function<void()> fn) override {
    inner_->run_on_connection(std::move(fn));
  }

 private:
  std::shared_ptr<Responder> inner_;
  Metrics& m_;
  std::function<void()> done_;
};

}  // namespace tp::api
