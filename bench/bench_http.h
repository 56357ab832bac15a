// The benchmark programs' HTTP client: one keep-alive HTTP/1.1 connection to tidepoold
// over TCP (Boost.Beast), with custom headers (Idempotency-Key) and the answer's
// Server-Timing header. Used by one thread at a time.
#pragma once

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tp::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

// status 0: no answer (refused, reset, timed out).
class Conn {
 public:
  struct Answer {
    int status = 0;
    std::string body;
    std::string error;
    std::string server_timing;  // the Server-Timing header, when sent
  };

  Conn(std::string host, std::string port) : host_(std::move(host)), port_(std::move(port)) {}

  Answer request(http::verb verb, const std::string& target, const std::string& body = {},
                 const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    Answer a = once(verb, target, body, headers);
    // A kept-alive connection the daemon closed meanwhile: once more on a fresh one.
    if (a.status == 0 && reused_) a = once(verb, target, body, headers);
    return a;
  }

 private:
  Answer once(http::verb verb, const std::string& target, const std::string& body,
              const std::vector<std::pair<std::string, std::string>>& headers) {
    Answer a;
    beast::error_code ec;
    reused_ = stream_.has_value();
    if (!stream_) {
      asio::ip::tcp::resolver resolver(ioc_);
      auto eps = resolver.resolve(host_, port_, ec);
      if (ec) return fail(a, ec);
      stream_.emplace(ioc_);
      stream_->expires_after(std::chrono::seconds(120));
      stream_->connect(eps, ec);
      if (ec) return fail(a, ec);
    }
    stream_->expires_after(std::chrono::seconds(120));
    http::request<http::string_body> req{verb, target, 11};
    req.set(http::field::host, host_);
    for (const auto& [k, v] : headers) req.set(k, v);
    if (!body.empty()) {
      req.set(http::field::content_type, "application/json");
      req.body() = body;
    }
    req.prepare_payload();
    http::write(*stream_, req, ec);
    if (ec) return fail(a, ec);
    beast::flat_buffer buf;
    http::response_parser<http::string_body> parser;
    parser.body_limit(256u << 20);
    http::read(*stream_, buf, parser, ec);
    if (ec) return fail(a, ec);
    auto& res = parser.get();
    a.status = static_cast<int>(res.result_int());
    a.body = std::move(res.body());
    if (auto it = res.find("Server-Timing"); it != res.end()) a.server_timing = it->value();
    if (!res.keep_alive()) stream_.reset();
    return a;
  }

  Answer& fail(Answer& a, const beast::error_code& ec) {
    a.error = ec.message();
    stream_.reset();
    return a;
  }

  std::string host_, port_;
  asio::io_context ioc_;
  std::optional<beast::tcp_stream> stream_;
  bool reused_ = false;
};

struct Target {
  std::string host = "127.0.0.1", port = "7070";
};

// An exec's answer: 200 and exit code 0.
inline bool exec_ok(const Conn::Answer& a) {
  if (a.status != 200) return false;
  boost::system::error_code ec;
  auto v = boost::json::parse(a.body, ec);
  if (ec || !v.is_object()) return false;
  const auto* code = v.as_object().if_contains("exit_code");
  return code && code->is_int64() && code->as_int64() == 0;
}

// A failed answer in one line.
inline std::string describe(const Conn::Answer& a) {
  if (a.status == 0) return a.error;
  return "HTTP " + std::to_string(a.status) + ": " + a.body.substr(0, 300);
}

// Creates a sandbox (256 MiB, 1 CPU); its id, or nullopt with the reason in *why.
inline std::optional<std::string> create_sandbox(Conn& c, const std::string& image, int ttl,
                                                 std::string* why) {
  auto a = c.request(http::verb::post, "/v1/sandboxes",
                     boost::json::serialize(boost::json::object{
                         {"image", image}, {"memory_mb", 256}, {"cpus", 1}, {"ttl_seconds", ttl}}));
  if (a.status != 200 && a.status != 201) {
    *why = describe(a);
    return std::nullopt;
  }
  return std::string(boost::json::parse(a.body).as_object().at("id").as_string());
}

// "http://host:port" (or "host:port").
inline std::optional<Target> parse_url(std::string u) {
  if (u.rfind("http://", 0) == 0) u = u.substr(7);
  while (!u.empty() && u.back() == '/') u.pop_back();
  Target t;
  auto colon = u.rfind(':');
  if (colon == std::string::npos) {
    t.host = u;
    t.port = "80";
  } else {
    t.host = u.substr(0, colon);
    t.port = u.substr(colon + 1);
  }
  if (t.host.empty() || t.port.empty() || u.find('/') != std::string::npos) return std::nullopt;
  return t;
}

}  // namespace tp::bench
