// Helpers for the api unit tests. SlowResponder: a Responder for unit tests whose "socket" the test
// drains by hand, so that a producer's flow control can be observed chunk by chunk.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>

#include "api/exec_control.h"
#include "api/http_server.h"
#include "node/service.h"

namespace tp::api::testing {

// Records the answer; chunks wait in `queue` until the test writes them.
struct SlowResponder : Responder {
  int status = 0;
  std::string content_type, body;
  bool streaming = false, ended = false, aborted = false, sent = false;
  std::function<void()> on_abort;
  struct Pending {
    std::string data;
    std::function<void(bool)> written;
  };
  std::deque<Pending> queue;
  uint64_t queued_bytes = 0, max_queued_bytes = 0;
  bool keep_body = true;  // false: the "client" discards what it reads

  void send(int s, std::string ct, std::string b) override {
    ASSERT_FALSE(sent || streaming);
    sent = true;
    status = s;
    content_type = std::move(ct);
    body = std::move(b);
  }
  void start_stream(int s, std::string ct) override {
    ASSERT_FALSE(sent || streaming);
    streaming = true;
    status = s;
    content_type = std::move(ct);
  }
  void write_chunk(std::string d) override { write_chunk(std::move(d), nullptr); }
  void write_chunk(std::string d, std::function<void(bool)> w) override {
    ASSERT_TRUE(streaming);
    ASSERT_FALSE(ended || aborted);
    queued_bytes += d.size();
    max_queued_bytes = std::max(max_queued_bytes, queued_bytes);
    queue.push_back({std::move(d), std::move(w)});
  }
  void end_stream() override {
    ASSERT_TRUE(streaming);
    ended = true;
  }
  void abort_stream() override {
    ASSERT_TRUE(streaming);
    aborted = true;
  }
  void set_on_abort(std::function<void()> cb) override { on_abort = std::move(cb); }
  void add_header(std::string, std::string) override {}

  // Writes the oldest queued chunk to "the socket" (ok) or fails it (client gone).
  bool drain_one(bool ok = true) {
    if (queue.empty()) return false;
    auto p = std::move(queue.front());
    queue.pop_front();
    queued_bytes -= p.data.size();
    if (ok && keep_body) body += p.data;
    if (p.written) p.written(ok);
    return true;
  }
  void drain_all() {
    while (drain_one()) {
    }
  }
  int error_status() const { return sent ? status : 0; }
};

// The command behind an ExecControl: counts the credits and kills sent to it,
// which must name exec `id`.
struct FakeExec {
  uint32_t id = 0;
  uint64_t credited = 0;
  int kills = 0;
  ExecControl::Fns fns() {
    ExecControl::Fns f;
    f.credit = [this](uint32_t got, uint64_t n) {
      EXPECT_EQ(got, id);
      credited += n;
    };
    f.kill = [this](uint32_t got) {
      EXPECT_EQ(got, id);
      kills++;
    };
    return f;
  }
};

// What an exec that exited with `code` reports.
inline node::ExecOutcome exited(int64_t code) {
  node::ExecOutcome o;
  o.result.exit_code = code;
  return o;
}

}  // namespace tp::api::testing
