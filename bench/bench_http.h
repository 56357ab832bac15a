// The benchmark programs' HTTP client: one keep-alive HTTP/1.1 connection to tidepoold
// over TCP (Boost.Beast), with custom headers (Idempotency-Key) and the answer's
// Server-Timing header. Used by one thread at a time.
#pragma once

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
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
