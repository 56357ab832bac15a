// libFuzzer harness for tidepoold's HTTP front: Beast's request parser with
// the server's limits, the server's target/query decoding, then api::Api
// routing and JSON request validation.
//
// The input is raw bytes as a client would send them on one connection; every
// request parsed from it (pipelined requests included) is handed to Api::handle.
// The SandboxManager behind the Api has a fake backend whose create always
// fails and an in-memory store, so nothing is started on the host: requests
// that name sandboxes get not_found, creations fail after validation.
// Oracles: every request is answered exactly once, promptly (no hang), with a
// valid status; an error answer is a JSON object {code, message}.
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "api/http_server.h"
#include "api/routes.h"
#include "common/json_util.h"
#include "common/log.h"
#include "control/memory_store.h"
#include "node/sandbox_manager.h"
#include "runtime/backend.h"
#include "runtime/registry.h"

namespace {

namespace beast = boost::beast;
namespace http = beast::http;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "http_fuzz: oracle failed: %s\n", what);
    std::abort();
  }
}

class FailingBackend : public tp::runtime::Backend {
 public:
  std::string tier() const override { return "container"; }
  tp::Result<std::unique_ptr<tp::runtime::SandboxInstance>> create(
      const tp::runtime::SandboxSpec&) override {
    return tp::fail(tp::Code::kUnavailable, "fuzz backend creates nothing");
  }
  std::vector<std::string> cleanup_orphans(const std::vector<std::string>&) override { return {}; }
};

// Records the answer; checks it is given once.
class FakeResponder : public tp::api::Responder {
 public:
  void send(int status, std::string ct, std::string body) override {
    check(!answered.exchange(true), "answered twice (send)");
    this->status = status;
    content_type = std::move(ct);
    this->body = std::move(body);
    finished = true;
  }
  void start_stream(int status, std::string ct) override {
    check(!answered.exchange(true), "answered twice (start_stream)");
    this->status = status;
    content_type = std::move(ct);
  }
  void write_chunk(std::string d) override { body += d; }
  void end_stream() override {
    check(answered.load(), "end_stream without start_stream");
    finished = true;
  }
  void abort_stream() override {
    check(answered.load(), "abort_stream without start_stream");
    finished = true;
  }
  void set_on_abort(std::function<void()>) override {}
  void add_header(std::string, std::string) override {}

  std::atomic<bool> answered{false};
  std::atomic<bool> finished{false};
  int status = 0;
  std::string content_type, body;
};

// The daemon's objects, minus the host: rebuilt now and then so that records of
// failed creations and idempotency keys do not pile up over a long run.
struct Stack {
  boost::asio::io_context io;
  tp::control::MemorySandboxStore store;
  tp::runtime::Registry registry;
  tp::Metrics metrics;
  std::unique_ptr<tp::node::SandboxManager> mgr;
  std::unique_ptr<tp::api::Api> api;
  Stack() {
    if (!registry.add(std::make_unique<FailingBackend>())) std::abort();
    tp::node::ManagerOptions opts;
    opts.stop_on_exit = true;
    mgr = std::make_unique<tp::node::SandboxManager>(io, registry, store, metrics, std::move(opts));
    api = std::make_unique<tp::api::Api>(*mgr, metrics);
  }
  ~Stack() {
    mgr->shutdown();
    api.reset();
    mgr.reset();
  }
};

std::unique_ptr<Stack> g_stack;
unsigned g_uses = 0;

// The same decoding HttpServer's session applies to a parsed message.
tp::api::Request to_request(http::request<http::string_body>& msg) {
  tp::api::Request req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  tp::api::decode_target(req);
  for (const auto& f : msg) {
    std::string name(f.name_string());
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    req.headers[name] = std::string(f.value());
  }
  req.body = std::move(msg.body());
  return req;
}

void serve(tp::api::Request& req) {
  Stack& st = *g_stack;
  auto res = std::make_shared<FakeResponder>();
  st.api->handle(req, res);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!res->finished && std::chrono::steady_clock::now() < deadline) {
    st.io.run_for(std::chrono::milliseconds(1));
    st.io.restart();
  }
  check(res->finished, "request not answered (hang)");
  check(res->status >= 200 && res->status <= 599, "status out of range");
  if (res->status >= 400 && res->content_type == "application/json") {
    boost::system::error_code ec;
    auto v = boost::json::parse(res->body, ec);
    check(!ec && v.is_object(), "error body is not a JSON object");
    check(v.as_object().contains("code") && v.as_object().contains("message"),
          "error lacks code/message");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tp::log::init("off");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 20)) return -1;
  if (!g_stack || ++g_uses > 512) {
    g_stack.reset();
    g_stack = std::make_unique<Stack>();
    g_uses = 0;
  }
  // Also the JSON helpers on the raw input, as a body.
  if (auto o = tp::json_util::parse_object(
          std::string_view(reinterpret_cast<const char*>(data), size))) {
    (void)tp::json_util::get_command(*o, "cmd");
    (void)tp::json_util::get_string_map(*o, "env");
    (void)tp::json_util::get_int(*o, "n", 0, -5, 5);
    (void)tp::json_util::get_number(*o, "x", 0, -1, 1);
  }
  (void)tp::json_util::base64_decode(std::string_view(reinterpret_cast<const char*>(data), size));

  beast::flat_buffer buf;
  auto mb = buf.prepare(size);
  if (size) std::memcpy(mb.data(), data, size);
  buf.commit(size);
  for (int i = 0; i < 8 && buf.size() > 0; ++i) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(1u << 20);
    parser.header_limit(64 * 1024);
    parser.eager(true);
    beast::error_code ec;
    while (!parser.is_done()) {
      size_t used = parser.put(buf.data(), ec);
      buf.consume(used);
      // All of the input is in the buffer: need_more means the rest never came. (Calling
      // put() again without new bytes breaks Beast's contract and trips its asserts.)
      if (ec || used == 0 || buf.size() == 0) break;
    }
    if (ec || !parser.is_done()) {
      // The server answers a malformed request with a JSON 400/413 and closes.
      return 0;
    }
    auto msg = parser.release();
    auto req = to_request(msg);
    serve(req);
  }
  return 0;
}
