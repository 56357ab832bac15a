// A small synchronous HTTP/1.1 client for talking to tidepoold (Boost.Beast over TCP
// or the daemon's unix socket).
//
// Promises:
// - One keep-alive connection, opened on first use and reused; when a reused
//   connection turns out to have been closed by the server before any byte of the answer
//   arrived, the request is sent once more on a fresh connection.
// - Response bodies can be consumed in pieces as they arrive (chunked NDJSON streams,
//   large downloads) or collected whole.
// - Every failure is an Error whose context is one human line, ready to print:
//   "cannot reach tidepoold at http://127.0.0.1:7070: connection refused" when the daemon
//   is not there, "<code>: <message>" for the daemon's JSON errors (the code keeps the
//   daemon's meaning, e.g. kNotFound for a 404).
// Thread rules: an HttpClient is used by one thread at a time. native_handle() may be
// read by a signal handler, which may only shutdown(2) it to interrupt a blocking read.
#pragma once

#include <boost/json/value.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"

namespace tp::cli {

struct Url {
  std::string host;
  std::string port;       // "7070"
  std::string base;       // path prefix without trailing '/', usually empty
  std::string unix_path;  // set: connect to this unix socket (host is "localhost")

  // Accepts "http://host[:port][/prefix]"; "host:port" alone is taken as http. https is
  // refused (the daemon speaks plain HTTP; put TLS in front of it with a proxy).
  // "unix:/path/to.sock" (or "unix:///path/to.sock") names the daemon's unix socket.
  static Result<Url> parse(std::string_view text);
  std::string str() const;
};

struct HttpResponse {
  int status = 0;
  std::string content_type;
  std::string body;
};

enum class Method { kGet, kPost, kPut, kDelete };

class HttpClient {
 public:
  explicit HttpClient(Url url);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  const Url& url() const { return url_; }
  // Sent as `Authorization: Bearer KEY` on TCP (the unix socket knows the caller).
  void set_api_key(std::string key) { api_key_ = std::move(key); }

  // Opens the connection now (requests otherwise open it lazily).
  Result<void> connect();
  // The socket fd, or -1 when not connected.
  int native_handle() const;

  // Sends a request; target is the path and query below the base ("/v1/sandboxes").
  // Statuses >= 400 become errors (see above). on_head sees the status and content type
  // of a successful answer before any body piece; on_data sees the body in pieces, and
  // returning an error from it aborts the transfer (the connection is then closed).
  using HeadSink = std::function<Result<void>(int status, std::string_view content_type)>;
  using DataSink = std::function<Result<void>(std::string_view piece)>;
  Result<void> stream(Method method, std::string_view target, std::string_view body,
                      std::string_view content_type, const HeadSink& on_head,
                      const DataSink& on_data);

  // Collects the whole answer.
  Result<HttpResponse> request(Method method, std::string_view target, std::string_view body = {},
                               std::string_view content_type = {});

  // JSON in, JSON out. A body of nullptr sends no body; an empty answer (e.g. 204) is null.
  Result<boost::json::value> call_json(Method method, std::string_view target,
                                       const boost::json::value* body = nullptr);

 private:
  struct Conn;
  Result<void> stream_once(Method method, std::string_view target, std::string_view body,
                           std::string_view content_type, const HeadSink& on_head,
                           const DataSink& on_data, bool* retryable);
  Error unreachable(std::string_view why) const;
  void close();

  Url url_;
  std::string api_key_;
  std::unique_ptr<Conn> conn_;
};

// Turns an error answer body into "<code>: <message>" (falls back to the HTTP status when
// the body is not the daemon's JSON error shape).
Error error_from_response(int status, std::string_view body);

}  // namespace tp::cli
