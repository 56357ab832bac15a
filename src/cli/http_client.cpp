#include "cli/http_client.h"

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <cctype>
#include <charconv>

namespace tp::cli {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

namespace {

// Bodies of error answers are kept only up to this size: they are one short JSON object.
constexpr size_t kMaxErrorBody = 1 << 20;
constexpr size_t kReadPiece = 64 * 1024;

std::string lower_first(std::string s) {
  if (!s.empty()) s[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(s[0])));
  return s;
}

http::verb to_verb(Method m) {
  switch (m) {
    case Method::kGet:
      return http::verb::get;
    case Method::kPost:
      return http::verb::post;
    case Method::kPut:
      return http::verb::put;
    case Method::kDelete:
      return http::verb::delete_;
  }
  return http::verb::get;
}

// Errors that mean "the server closed this idle keep-alive connection before reading
// our request": safe to resend on a new connection.
bool is_stale_connection(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == asio::error::broken_pipe;
}

}  // namespace

Result<Url> Url::parse(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return fail(Code::kInvalidArgument,
                "invalid daemon URL '" + std::string(text) + "': " + std::string(why));
  };
  std::string_view s = text;
  if (s.starts_with("unix:")) {
    s.remove_prefix(5);
    if (s.starts_with("//")) s.remove_prefix(2);
    if (!s.starts_with('/'))
      return bad("a unix socket path must be absolute (unix:/run/tidepool/tidepool.sock)");
    Url u;
    u.host = "localhost";
    u.port = "80";
    u.unix_path = std::string(s);
    return u;
  }
  if (s.starts_with("http://")) {
    s.remove_prefix(7);
  } else if (s.starts_with("https://")) {
    return bad("https is not supported (tidepoold speaks plain HTTP)");
  } else if (s.find("://") != std::string_view::npos) {
    return bad("only http:// URLs are supported");
  }
  size_t slash = s.find('/');
  std::string_view authority = s.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view{} : s.substr(slash);
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  if (path.find_first_of("?#") != std::string_view::npos)
    return bad("query or fragment not allowed");
  Url u;
  std::string_view port;
  if (authority.starts_with('[')) {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return bad("unterminated '['");
    u.host = std::string(authority.substr(1, close - 1));
    std::string_view rest = authority.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return bad("expected ':' after ']'");
      port = rest.substr(1);
    }
  } else {
    size_t colon = authority.rfind(':');
    if (colon != std::string_view::npos) {
      u.host = std::string(authority.substr(0, colon));
      port = authority.substr(colon + 1);
    } else {
      u.host = std::string(authority);
    }
  }
  if (u.host.empty()) return bad("missing host");
  if (u.host.find('@') != std::string::npos) return bad("user info is not supported");
  if (port.empty() && authority.find(':') != std::string_view::npos &&
      !authority.starts_with('[')) {
    return bad("empty port");
  }
  if (port.empty()) {
    u.port = "80";
  } else {
    unsigned p = 0;
    auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    if (ec != std::errc() || ptr != port.data() + port.size() || p == 0 || p > 65535) {
      return bad("bad port '" + std::string(port) + "'");
    }
    u.port = std::to_string(p);
  }
  u.base = std::string(path);
  return u;
}

std::string Url::str() const {
  if (!unix_path.empty()) return "unix:" + unix_path;
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return "http://" + h + ":" + port + base;
}

Error error_from_response(int status, std::string_view body) {
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(body, ec);
  if (!ec && v.is_object()) {
    const auto& o = v.get_object();
    const auto* code = o.if_contains("code");
    const auto* msg = o.if_contains("message");
    if (code && code->is_string()) {
      std::string c(code->get_string());
      std::string m = msg && msg->is_string() ? std::string(msg->get_string()) : std::string();
      return Error{code_from_name(c), 0, m.empty() ? c : c + ": " + m};
    }
  }
  // Not our daemon's error shape (a proxy, or something else listening on the port).
  Code code = Code::kInternal;
  for (int i = 1; i <= static_cast<int>(Code::kInsufficientStorage); ++i) {
    if (http_status(static_cast<Code>(i)) == status) {
      code = static_cast<Code>(i);
      break;
    }
  }
  std::string snippet(body.substr(0, 200));
  for (char& c : snippet) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!snippet.empty() && snippet.back() == ' ') snippet.pop_back();
  std::string msg = "HTTP " + std::to_string(status);
  if (!snippet.empty()) msg += ": " + snippet;
  return Error{code, 0, msg};
}

struct HttpClient::Conn {
  asio::io_context ioc;
  asio::generic::stream_protocol::socket sock{ioc};
  beast::flat_buffer buf;
};

HttpClient::HttpClient(Url url) : url_(std::move(url)), conn_(std::make_unique<Conn>()) {}

HttpClient::~HttpClient() { close(); }

int HttpClient::native_handle() const {
  return conn_->sock.is_open() ? conn_->sock.native_handle() : -1;
}

void HttpClient::close() {
  if (!conn_->sock.is_open()) return;
  beast::error_code ignored;
  conn_->sock.shutdown(asio::socket_base::shutdown_both, ignored);
  conn_->sock.close(ignored);
  conn_->buf.clear();
}

Error HttpClient::unreachable(std::string_view why) const {
  return Error{Code::kUnavailable, 0,
               "cannot reach tidepoold at " + url_.str() + ": " + std::string(why)};
}

Result<void> HttpClient::connect() {
  close();
  beast::error_code ec;
  if (!url_.unix_path.empty()) {
    asio::local::stream_protocol::endpoint ep(url_.unix_path);
    conn_->sock.connect(asio::generic::stream_protocol::endpoint(ep), ec);
    if (ec) {
      close();
      std::string why = lower_first(ec.message());
      if (ec == asio::error::access_denied)
        why +=
            " (the socket is for root and group 'tidepool'; or use --url http://... with "
            "--api-key)";
      return std::unexpected(unreachable(why));
    }
    return {};
  }
  tcp::resolver resolver(conn_->ioc);
  auto endpoints = resolver.resolve(url_.host, url_.port, ec);
  if (ec) return std::unexpected(unreachable(lower_first(ec.message())));
  for (const auto& e : endpoints) {
    close();
    conn_->sock.connect(asio::generic::stream_protocol::endpoint(e.endpoint()), ec);
    if (!ec) break;
  }
  if (ec) {
    close();
    return std::unexpected(unreachable(lower_first(ec.message())));
  }
  // Small writes (requests) must go out at once; latency matters more than packets here.
  int one = 1;
  ::setsockopt(conn_->sock.native_handle(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return {};
}

Result<void> HttpClient::stream_once(Method method, std::string_view target, std::string_view body,
                                     std::string_view content_type, const HeadSink& on_head,
                                     const DataSink& on_data, bool* retryable) {
  *retryable = false;
  const bool reused = conn_->sock.is_open();
  if (!reused) TP_TRY(connect());
  auto& sock = conn_->sock;

  http::request<http::string_body> req{to_verb(method), url_.base + std::string(target), 11};
  req.set(http::field::host, url_.host + ":" + url_.port);
  req.set(http::field::user_agent, "tidepool-cli/" TP_VERSION);
  if (!api_key_.empty() && url_.unix_path.empty())
    req.set(http::field::authorization, "Bearer " + api_key_);
  req.keep_alive(true);
  if (!content_type.empty()) req.set(http::field::content_type, content_type);
  req.body() = std::string(body);
  req.prepare_payload();

  beast::error_code ec;
  http::write(sock, req, ec);
  if (ec) {
    close();
    *retryable = reused && is_stale_connection(ec);
    return std::unexpected(unreachable(lower_first(ec.message())));
  }

  http::response_parser<http::buffer_body> parser;
  parser.body_limit(boost::none);
  http::read_header(sock, conn_->buf, parser, ec);
  if (ec) {
    close();
    *retryable = reused && is_stale_connection(ec);
    return fail(Code::kUnavailable, "connection to tidepoold at " + url_.str() +
                                        " lost before an answer: " + lower_first(ec.message()));
  }
  const int status = parser.get().result_int();
  const std::string ctype(parser.get()[http::field::content_type]);
  const bool is_error = status >= 400;
  if (!is_error && on_head) {
    if (auto r = on_head(status, ctype); !r) {
      close();
      return r;
    }
  }

  std::string error_body;
  // Not zero-filled: a CLI process makes one to three calls, and zeroing 64 KiB for each
  // faulted in all 16 of its pages (30 of a pooled `tidepool run`'s 104 page faults).
  auto piece = std::make_unique_for_overwrite<char[]>(kReadPiece);
  while (!parser.is_done()) {
    parser.get().body().data = piece.get();
    parser.get().body().size = kReadPiece;
    // read_some (not read) so that each chunk of a stream is handed on as it arrives.
    http::read_some(sock, conn_->buf, parser, ec);
    if (ec == http::error::need_buffer) ec = {};
    if (ec) {
      close();
      return fail(Code::kUnavailable, "connection to tidepoold at " + url_.str() +
                                          " lost: " + lower_first(ec.message()));
    }
    size_t n = kReadPiece - parser.get().body().size;
    if (n == 0) continue;
    std::string_view got(piece.get(), n);
    if (is_error) {
      if (error_body.size() < kMaxErrorBody)
        error_body.append(got.substr(0, kMaxErrorBody - error_body.size()));
    } else if (on_data) {
      if (auto r = on_data(got); !r) {
        close();
        return r;
      }
    }
  }
  if (!parser.keep_alive()) close();
  if (is_error) return std::unexpected(error_from_response(status, error_body));
  return {};
}

Result<void> HttpClient::stream(Method method, std::string_view target, std::string_view body,
                                std::string_view content_type, const HeadSink& on_head,
                                const DataSink& on_data) {
  bool retryable = false;
  auto r = stream_once(method, target, body, content_type, on_head, on_data, &retryable);
  if (!r && retryable) {
    r = stream_once(method, target, body, content_type, on_head, on_data, &retryable);
  }
  return r;
}

Result<HttpResponse> HttpClient::request(Method method, std::string_view target,
                                         std::string_view body, std::string_view content_type) {
  HttpResponse resp;
  auto r = stream(
      method, target, body, content_type,
      [&](int status, std::string_view ctype) -> Result<void> {
        resp.status = status;
        resp.content_type = std::string(ctype);
        resp.body.clear();
        return {};
      },
      [&](std::string_view piece) -> Result<void> {
        resp.body.append(piece);
        return {};
      });
  if (!r) return std::unexpected(r.error());
  return resp;
}

Result<boost::json::value> HttpClient::call_json(Method method, std::string_view target,
                                                 const boost::json::value* body) {
  std::string payload;
  std::string_view ctype;
  if (body != nullptr) {
    payload = boost::json::serialize(*body);
    ctype = "application/json";
  }
  auto resp = request(method, target, payload, ctype);
  if (!resp) return std::unexpected(resp.error());
  if (resp->body.empty()) return boost::json::value(nullptr);
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(resp->body, ec);
  if (ec) {
    return fail(Code::kInternal, "tidepoold sent invalid JSON (" + ec.message() + ")");
  }
  return v;
}

}  // namespace tp::cli
