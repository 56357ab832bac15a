// HttpServer: HTTP/1.1 server on Boost.Beast (request parsing) with keep-alive,
// full responses and chunked streaming responses, over TCP or a unix socket.
// On a unix socket every request carries the peer's credentials (Caller).
//
// The handler is called once per request on the connection's strand; it must
// not block. It answers through the Responder, from any thread, now or later:
// exactly one of send() or start_stream() ... end_stream(). The connection
// reads the next request only after the answer is complete.
//
// Limits against hostile clients (see ServerOptions and ConnectionGate): a
// bounded number of connections, shared fairly between clients; time limits on
// waiting for a client's request bytes (never on answering it, so streams run
// as long as they need); per-route body limits checked once the header is in;
// accept() failures back off instead of spinning.
//
// Thread rules: HttpServer::start/stop from one thread. Responder methods are
// safe from any thread (they post to the connection's strand). ConnectionGate
// is safe from any thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/json/value.hpp>
#include <chrono>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "api/spool.h"
#include "common/rate_limited_log.h"
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
  std::string peer;  // "ip:<address>" (TCP) or "uid:<uid>" (unix), as the connection gate counts
                     // clients
  bool unix_socket() const { return transport == Transport::kUnix; }
};

struct Request {
  std::string method;                             // "GET", ...
  std::string target;                             // raw target, e.g. /v1/sandboxes?label=a%3Db
  std::string path;                               // decoded path without the query
  std::multimap<std::string, std::string> query;  // decoded
  std::map<std::string, std::string> headers;     // lower-case names
  std::string body;
  // A large upload (ServerOptions::spool): its body is in this file, and `body`
  // is empty. Routes that take uploads read from it in pieces.
  std::shared_ptr<const BodyFile> upload;
  Caller caller;

  uint64_t body_size() const { return upload ? upload->size() : body.size(); }

  // First value of a query parameter, or nullptr.
  const std::string* q(const std::string& name) const;
  std::vector<std::string> q_all(const std::string& name) const;
  // A boolean query parameter: true/1/yes (or present without a value), false/0/no;
  // `absent` when it is not given; kInvalidArgument naming it for anything else.
  Result<bool> q_bool(const std::string& name, bool absent) const;
};

class Responder {
 public:
  virtual ~Responder() = default;
  virtual void send(int status, std::string content_type, std::string body) = 0;
  // A chunked answer: start_stream, write_chunk*, then end_stream (complete) or
  // abort_stream (incomplete). For HEAD only the head is sent.
  virtual void start_stream(int status, std::string content_type) = 0;
  virtual void write_chunk(std::string data) = 0;
  // Flow-controlled: `written` runs once, on the connection's strand, when the
  // chunk has gone to the socket (true), or when it never will (false: the
  // client is gone, the answer is over, a HEAD request). A producer that sends
  // its next chunk only then holds at most one chunk, however slow the client.
  // The default (for wrappers that do not forward it) writes and reports at once.
  virtual void write_chunk(std::string data, std::function<void(bool written)> written) {
    write_chunk(std::move(data));
    if (written) written(true);
  }
  virtual void end_stream() = 0;
  // Ends a started stream without its last (empty) chunk and closes the
  // connection once what was queued is written: the client sees a truncated
  // answer (an error in any HTTP client) instead of a complete one. For an
  // answer that failed after its 200 was sent.
  virtual void abort_stream() = 0;
  // Called (once, on the strand) when the client goes away before the answer completed.
  virtual void set_on_abort(std::function<void()> cb) = 0;
  // Adds a header to the answer; call before send() / start_stream().
  virtual void add_header(std::string name, std::string value) = 0;
  // Runs fn on the connection's thread, after what was posted to it before (so
  // work that blocks briefly before an answer, such as the step log's sync, holds
  // up that connection's thread, not the thread that produced the answer). The
  // default runs it at once.
  virtual void run_on_connection(std::function<void()> fn) { fn(); }

  void send_json(int status, const boost::json::value& v);
  void send_error(const Error& e);
};

using Handler = std::function<void(Request& req, std::shared_ptr<Responder> res)>;

// A connection the gate may close to make room: one waiting for a request.
class Evictable {
 public:
  virtual ~Evictable() = default;
  // Closes the connection if it is still waiting for a request; any thread.
  virtual void evict() = 0;
};

// The connection slots of a daemon, shared by its listeners (every connection
// holds a file descriptor, and a daemon out of descriptors can neither answer
// nor run sandboxes). A client is a peer address on TCP, a uid on the unix socket.
//
// A new connection of a client at its own cap takes the place of that client's
// longest-idle connection; when all slots are taken, of the longest-idle
// connection of anyone. Idle = waiting for (the header of) a request. With no
// idle connection to close, the new one is refused. So idle connections
// (however many are opened) never lock out a client with a request to send, and
// one client's busy connections never take more than its cap.
class ConnectionGate {
 public:
  class Ticket {
   public:
    ~Ticket();
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    // The connection to close when this slot is taken over; set before set_idle.
    void bind(std::weak_ptr<Evictable> conn);
    // Waiting for a request (may be evicted) or busy with one.
    void set_idle(bool idle);

   private:
    friend class ConnectionGate;
    Ticket(std::shared_ptr<ConnectionGate> gate, std::string client)
        : gate_(std::move(gate)), client_(std::move(client)) {}
    std::shared_ptr<ConnectionGate> gate_;
    std::string client_;
    std::weak_ptr<Evictable> conn_;
    bool idle_ = false;  // in the idle lists (under the gate's mutex)
    std::list<Ticket*>::iterator all_it_, client_it_;
  };

  // 0 for max_per_client = max_total.
  static std::shared_ptr<ConnectionGate> create(size_t max_total, size_t max_per_client);
  // A slot for a new connection of `client`, possibly by evicting an idle one;
  // nullptr (and *why) when none can be had.
  std::unique_ptr<Ticket> admit(const std::string& client, std::string* why = nullptr);
  size_t connections() const;
  size_t connections_of(const std::string& client) const;
  size_t max_total() const { return max_total_; }
  size_t max_per_client() const { return max_per_client_; }

 private:
  struct Client {
    size_t count = 0;
    std::list<Ticket*> idle;  // oldest first
  };
  ConnectionGate(size_t max_total, size_t max_per_client)
      : max_total_(max_total), max_per_client_(max_per_client) {}
  void unlink_idle(Ticket* t);  // under mu_
  void release(Ticket* t);
  std::weak_ptr<ConnectionGate> self_;
  const size_t max_total_;
  const size_t max_per_client_;
  mutable std::mutex mu_;
  size_t total_ = 0;
  std::unordered_map<std::string, Client> clients_;
  std::list<Ticket*> idle_;  // every client's, oldest first
};

// Bytes of request bodies held in memory at once, over all connections: each
// body is bounded by its route's limit, but many at once would not be.
class BodyBudget {
 public:
  explicit BodyBudget(uint64_t max_bytes) : max_(max_bytes) {}
  // Reserves n bytes; false (nothing reserved) when that would go over the budget.
  bool take(uint64_t n);
  void give(uint64_t n) { used_.fetch_sub(n); }
  uint64_t used() const { return used_.load(); }
  uint64_t max() const { return max_; }

 private:
  const uint64_t max_;
  std::atomic<uint64_t> used_{0};
};

struct ServerOptions {
  // Largest request body of any route; body_limit may lower it per route.
  size_t max_body_bytes = 1ull << 30;
  // The body limit of a route, asked once the header is in (path decoded, no query).
  std::function<size_t(const std::string& method, const std::string& path)> body_limit;
  // Asked before a body is read, with the request as its header tells (no body):
  // an error is the answer, and the body is never taken in (e.g. authentication).
  std::function<Result<void>(Request& head)> check_head;
  // Only time spent waiting for the client's request bytes is limited: a
  // connection with no request for idle_timeout is closed, a header not complete
  // within header_timeout of its first byte is, and so is a body that sends
  // nothing for body_timeout. Answers (streams included) have no time limit.
  std::chrono::milliseconds idle_timeout{60'000};
  std::chrono::milliseconds header_timeout{10'000};
  std::chrono::milliseconds body_timeout{30'000};
  // Connection slots (shared between listeners); null = unlimited.
  std::shared_ptr<ConnectionGate> gate;
  // Memory for request bodies (shared between listeners); null = unlimited.
  // A body is counted as its bytes arrive; one that no longer fits is answered
  // 503 (retry later) and the rest of it is not kept.
  std::shared_ptr<BodyBudget> body_budget;
  // Uploads above spool->threshold on the routes `spools` names go to files, not
  // memory (api/spool.h); null = every body in memory.
  std::shared_ptr<const SpoolOptions> spool;
  std::function<bool(const std::string& method, const std::string& path)> spools;
  // Where accepted connections run: each new one goes to the next of these io_contexts
  // (shared between listeners). Empty: the server's own. One thread per io_context
  // keeps a request's handlers on one thread (see docs/architecture.md, threads).
  std::shared_ptr<class IoRing> sessions;
};

// A fixed set of io_contexts handed out in turn; safe from any thread.
class IoRing {
 public:
  explicit IoRing(std::vector<boost::asio::io_context*> ios) : ios_(std::move(ios)) {}
  boost::asio::io_context& next() { return *ios_[next_.fetch_add(1) % ios_.size()]; }
  size_t size() const { return ios_.size(); }

 private:
  std::vector<boost::asio::io_context*> ios_;
  std::atomic<size_t> next_{0};
};

class HttpServer {
 public:
  HttpServer(boost::asio::io_context& io, Handler handler, ServerOptions opts);
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
  // accept() failing (out of descriptors or buffers) leaves the connection
  // queued, so an immediate retry fails again at once: wait, longer each time.
  struct Backoff {
    explicit Backoff(boost::asio::io_context& io) : timer(io) {}
    boost::asio::steady_timer timer;
    std::chrono::milliseconds delay{0};
  };
  boost::asio::io_context& session_io();
  void accept();
  void accept_unix();
  void accept_failed(Backoff& b, const boost::system::error_code& ec, const char* what,
                     std::function<void()> again);
  boost::asio::io_context& io_;
  Handler handler_;
  std::shared_ptr<const ServerOptions> opts_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::local::stream_protocol::acceptor unix_acceptor_;
  std::string unix_path_;
  Backoff tcp_backoff_;
  Backoff unix_backoff_;
  log::RateLimitedLog accept_log_{spdlog::level::warn, std::chrono::seconds(1)};
  log::RateLimitedLog refuse_log_{spdlog::level::warn, std::chrono::seconds(1)};
};

// Splits "host:port"; false on malformed input.
bool parse_listen(const std::string& s, std::string* host, uint16_t* port);
// Percent-decoding of URL components ('+' is a space in queries).
std::string url_decode(std::string_view s, bool plus_is_space);
// Fills req.path and req.query from req.target (decoded; empty query keys dropped).
void decode_target(Request& req);

}  // namespace tp::api
