// HttpServer: HTTP/1.1 server on Boost.Beast (request parsing) with keep-alive,
// full responses and chunked streaming responses, over TCP or a unix socket.
// On a unix socket every request carries the peer's credentials (Caller).
//
// The handler is called once per request on the connection's strand; it must
// not block. It answers through the Responder, from any thread, now or later:
// exactly one of send() or start_stream() ... end_stream(). The connection
// reads the next request only after the answer is complete.
//
// Thread rules: HttpServer::start/stop from one thread. Responder methods are
// safe from any thread (they post to the connection's strand).
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/json/value.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"

namespace tp::api {

// Who sent a request. The transport and, on the unix socket, the peer's
// credentials (SO_PEERCRED / SO_PEERGROUPS, taken once at accept) are filled
// in by the server; key_id and scope by the authentication layer (api/auth.h).
struct Caller {
  enum class Transport { kTcp, kUnix };
  Transport transport = Transport::kTcp;
  uid_t uid = 0;                          // unix only
  gid_t gid = 0;                          // unix only
  std::vector<gid_t> groups;              // unix only: supplementary groups
  std::string key_id;                     // the API key used (TCP), empty when none
  std::string scope;                      // "admin" or "user" for a key; empty when none
  std::vector<std::string> import_roots;  // admin key: host paths are read under these only
  bool unix_socket() const { return transport == Transport::kUnix; }
};

struct Request {
  std::string method;                             // "GET", ...
  std::string target;                             // raw target, e.g. /v1/sandboxes?label=a%3Db
  std::string path;                               // decoded path without the query
  std::multimap<std::string, std::string> query;  // decoded
  std::map<std::string, std::string> headers;     // lower-case names
  std::string body;
  Caller caller;

  // First value of a query parameter, or nullptr.
  const std::string* q(const std::string& name) const;
  std::vector<std::string> q_all(const std::string& name) const;
};

class Responder {
 public:
  virtual ~Responder() = default;
  virtual void send(int status, std::string content_type, std::string body) = 0;
  virtual void start_stream(int status, std::string content_type) = 0;
  virtual void write_chunk(std::string data) = 0;
  virtual void end_stream() = 0;
  // Called (once, on the strand) when the client goes away before the answer completed.
  virtual void set_on_abort(std::function<void()> cb) = 0;
  // Adds a header to the answer; call before send() / start_stream().
  virtual void add_header(std::string name, std::string value) = 0;

  void send_json(int status, const boost::json::value& v);
  void send_error(const Error& e);
};

using Handler = std::function<void(Request& req, std::shared_ptr<Responder> res)>;

class HttpServer {
 public:
  HttpServer(boost::asio::io_context& io, Handler handler, size_t max_body_bytes);
  ~HttpServer();
  // Binds and starts accepting. host:port; port 0 picks a free one.
  Result<void> start(const std::string& host, uint16_t port);
  // Binds a unix stream socket at `path` (a stale socket file there is
  // replaced; any other file is an error) and starts accepting. The caller
  // sets the socket file's owner and mode; stop() removes it.
  Result<void> start_unix(const std::string& path);
  void stop();
  uint16_t port() const;

 private:
  void accept();
  void accept_unix();
  boost::asio::io_context& io_;
  Handler handler_;
  size_t max_body_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::local::stream_protocol::acceptor unix_acceptor_;
  std::string unix_path_;
};

// Splits "host:port"; false on malformed input.
bool parse_listen(const std::string& s, std::string* host, uint16_t* port);
// Percent-decoding of URL components ('+' is a space in queries).
std::string url_decode(std::string_view s, bool plus_is_space);
// Fills req.path and req.query from req.target (decoded; empty query keys dropped).
void decode_target(Request& req);

}  // namespace tp::api
