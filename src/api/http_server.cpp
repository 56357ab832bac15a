#include "api/http_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <cstring>
#include <deque>

#include "common/json_util.h"
#include "common/log.h"

namespace tp::api {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

const std::string* Request::q(const std::string& name) const {
  auto it = query.find(name);
  return it == query.end() ? nullptr : &it->second;
}

std::vector<std::string> Request::q_all(const std::string& name) const {
  std::vector<std::string> out;
  auto [b, e] = query.equal_range(name);
  for (auto it = b; it != e; ++it) out.push_back(it->second);
  return out;
}

Result<bool> Request::q_bool(const std::string& name, bool absent) const {
  const std::string* v = q(name);
  if (!v) return absent;
  if (*v == "false" || *v == "0" || *v == "no") return false;
  if (*v == "true" || *v == "1" || *v == "yes" || v->empty()) return true;
  return fail(Code::kInvalidArgument, name + " must be true or false: " + *v);
}

void Responder::send_json(int status, const boost::json::value& v) {
  // Strings may echo request bytes or sandbox file names: keep the answer valid UTF-8.
  send(status, "application/json", json_util::serialize_utf8(v) + "\n");
}

void Responder::send_error(const Error& e) {
  boost::json::object o;
  o["code"] = std::string(code_name(e.code));
  o["message"] = e.message();
  send_json(http_status(e.code), o);
}

void decode_target(Request& req) {
  auto qpos = req.target.find('?');
  req.path = url_decode(std::string_view(req.target).substr(0, qpos), false);
  req.query.clear();
  if (qpos == std::string::npos) return;
  std::string_view qs = std::string_view(req.target).substr(qpos + 1);
  while (!qs.empty()) {
    auto amp = qs.find('&');
    std::string_view kv = qs.substr(0, amp);
    auto eq = kv.find('=');
    std::string k = url_decode(kv.substr(0, eq), true);
    std::string v = eq == std::string_view::npos ? "" : url_decode(kv.substr(eq + 1), true);
    if (!k.empty()) req.query.emplace(std::move(k), std::move(v));
    if (amp == std::string_view::npos) break;
    qs.remove_prefix(amp + 1);
  }
}

std::string url_decode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2])));
      i += 2;
    } else if (s[i] == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

bool parse_listen(const std::string& s, std::string* host, uint16_t* port) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  *host = s.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']')
    *host = host->substr(1, host->size() - 2);
  std::string p = s.substr(colon + 1);
  if (p.empty() || p.size() > 5) return false;
  unsigned v = 0;
  for (char c : p) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<unsigned>(c - '0');
  }
  if (v > 65535) return false;
  *port = static_cast<uint16_t>(v);
  return true;
}

std::shared_ptr<ConnectionGate> ConnectionGate::create(size_t max_total, size_t max_per_client) {
  if (max_total == 0) max_total = 1;
  if (max_per_client == 0 || max_per_client > max_total) max_per_client = max_total;
  std::shared_ptr<ConnectionGate> g(new ConnectionGate(max_total, max_per_client));
  g->self_ = g;
  return g;
}

void ConnectionGate::unlink_idle(Ticket* t) {
  if (!t->idle_) return;
  t->idle_ = false;
  idle_.erase(t->all_it_);
  clients_[t->client_].idle.erase(t->client_it_);
}

std::unique_ptr<ConnectionGate::Ticket> ConnectionGate::admit(const std::string& client,
                                                              std::string* why) {
  std::weak_ptr<Evictable> victim;
  std::unique_ptr<Ticket> t;
  {
    std::lock_guard lk(mu_);
    Client& c = clients_[client];
    Ticket* v = nullptr;
    if (c.count >= max_per_client_) {
      if (c.idle.empty()) {
        if (why)
          *why = "this client has " + std::to_string(c.count) +
                 " connections busy, the most one client may hold";
        if (c.count == 0) clients_.erase(client);
        return nullptr;
      }
      v = c.idle.front();
    } else if (total_ >= max_total_) {
      if (idle_.empty()) {
        if (why) *why = "all " + std::to_string(max_total_) + " connections of the server are busy";
        if (c.count == 0) clients_.erase(client);
        return nullptr;
      }
      v = idle_.front();
    }
    if (v) {
      // The victim keeps its slot until it has closed: the count may run over
      // the limit by the evictions under way, never by more.
      unlink_idle(v);
      victim = v->conn_;
    }
    ++c.count;
    ++total_;
    t.reset(new Ticket(self_.lock(), client));
  }
  if (auto conn = victim.lock()) conn->evict();
  return t;
}

void ConnectionGate::release(Ticket* t) {
  std::lock_guard lk(mu_);
  unlink_idle(t);
  auto it = clients_.find(t->client_);
  if (it != clients_.end() && --it->second.count == 0) clients_.erase(it);
  --total_;
}

size_t ConnectionGate::connections() const {
  std::lock_guard lk(mu_);
  return total_;
}

size_t ConnectionGate::connections_of(const std::string& client) const {
  std::lock_guard lk(mu_);
  auto it = clients_.find(client);
  return it == clients_.end() ? 0 : it->second.count;
}

ConnectionGate::Ticket::~Ticket() { gate_->release(this); }

bool BodyBudget::take(uint64_t n) {
  uint64_t cur = used_.load();
  do {
    if (n > max_ || cur > max_ - n) return false;
  } while (!used_.compare_exchange_weak(cur, cur + n));
  return true;
}

void ConnectionGate::Ticket::bind(std::weak_ptr<Evictable> conn) {
  std::lock_guard lk(gate_->mu_);
  conn_ = std::move(conn);
}

void ConnectionGate::Ticket::set_idle(bool idle) {
  std::lock_guard lk(gate_->mu_);
  if (idle == idle_) return;
  if (!idle) return gate_->unlink_idle(this);
  idle_ = true;
  all_it_ = gate_->idle_.insert(gate_->idle_.end(), this);
  auto& c = gate_->clients_[client_];
  client_it_ = c.idle.insert(c.idle.end(), this);
}

namespace {

// Answers up to this size are sent in one buffer with their head.
constexpr size_t kCopyBodyMax = 64 << 10;
// Largest request header.
constexpr size_t kHeaderMax = 64 << 10;
// After answering before a body was read (413), the rest of the body is read
// and dropped for this long (and up to this much), so that a client still
// sending gets the answer instead of a reset.
constexpr auto kLinger = std::chrono::seconds(2);
constexpr uint64_t kLingerMaxBytes = 256ull << 20;
// accept() retries after a failure: first delay and the most it grows to.
constexpr auto kBackoffMin = std::chrono::milliseconds(50);
constexpr auto kBackoffMax = std::chrono::milliseconds(500);

const char* reason(int status) {
  return http::obsolete_reason(static_cast<http::status>(status)).data();
}

// The peer of a unix socket: its uid and gid (SO_PEERCRED) and its
// supplementary groups (SO_PEERGROUPS). Taken at accept, so a process that
// passes the connection on keeps acting as the one that opened it.
bool peer_credentials(int fd, Caller* c) {
  struct ucred cr {};
  socklen_t len = sizeof cr;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0) return false;
  c->transport = Caller::Transport::kUnix;
  c->uid = cr.uid;
  c->gid = cr.gid;
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 4; ++attempt) {
    len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
      groups.resize(len / sizeof(gid_t));
      c->groups = std::move(groups);
      return true;
    }
    if (errno != ERANGE) return false;
    groups.resize(len / sizeof(gid_t) + 1);
  }
  return false;
}

template <class Protocol>
class Session : public Responder,
                public Evictable,
                public std::enable_shared_from_this<Session<Protocol>> {
  using Stream = beast::basic_stream<Protocol>;
  using std::enable_shared_from_this<Session<Protocol>>::shared_from_this;

 public:
  Session(typename Protocol::socket sock, Handler& handler,
          std::shared_ptr<const ServerOptions> opts, Caller caller,
          std::unique_ptr<ConnectionGate::Ticket> ticket)
      : stream_(std::move(sock)),
        handler_(handler),
        opts_(std::move(opts)),
        caller_(std::move(caller)),
        ticket_(std::move(ticket)) {}
  // The handler holds the session (as its Responder) while it may use the body.
  ~Session() override { release_body(); }

  void run() {
    if (ticket_) ticket_->bind(this->weak_from_this());
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read(); });
  }

  void evict() override {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->closed_ || (self->phase_ != Phase::kIdle && self->phase_ != Phase::kHeader)) return;
      spdlog::debug("http: closing an idle connection to make room for a new one");
      self->close();
    });
  }

  void send(int status, std::string content_type, std::string body) override {
    asio::post(stream_.get_executor(),
               [self = shared_from_this(), status, ct = std::move(content_type),
                b = std::move(body)]() mutable {
                 if (self->answered_) return;
                 self->answered_ = true;
                 std::string h = self->head(status, ct);
                 h += "Content-Length: " + std::to_string(b.size()) + "\r\n\r\n";
                 self->status_ = status;
                 if (self->method_ == "HEAD") {
                   self->enqueue(std::move(h));
                 } else if (b.size() <= kCopyBodyMax) {
                   self->enqueue(std::move(h += b));  // one write for a small answer
                 } else {
                   // A big body goes as its own buffer: not copied again, freed once written.
                   self->enqueue(std::move(h));
                   self->enqueue(std::move(b));
                 }
                 self->finished_ = true;
                 self->maybe_next();
               });
  }

  void start_stream(int status, std::string content_type) override {
    asio::post(stream_.get_executor(),
               [self = shared_from_this(), status, ct = std::move(content_type)] {
                 if (self->answered_) return;
                 self->answered_ = true;
                 self->streaming_ = true;
                 self->status_ = status;
                 std::string h = self->head(status, ct);
                 h += "Transfer-Encoding: chunked\r\nX-Accel-Buffering: no\r\n\r\n";
                 self->enqueue(std::move(h));
                 if (self->method_ == "HEAD") {
                   // The head is the whole answer; the producer's chunks are refused.
                   self->finished_ = true;
                   self->maybe_next();
                 }
               });
  }

  void write_chunk(std::string data) override { write_chunk(std::move(data), nullptr); }

  void write_chunk(std::string data, std::function<void(bool)> written) override {
    asio::post(stream_.get_executor(),
               [self = shared_from_this(), d = std::move(data), w = std::move(written)]() mutable {
                 if (!self->streaming_ || self->finished_ || self->closed_) {
                   if (w) w(false);
                   return;
                 }
                 if (d.empty()) {  // an empty chunk would end the stream
                   if (w) w(true);
                   return;
                 }
                 char len[32];
                 snprintf(len, sizeof len, "%zx\r\n", d.size());
                 // The data goes as its own buffer (gathered with its framing): not copied.
                 self->enqueue(Out{len, std::move(d), true, std::move(w)});
               });
  }

  void end_stream() override {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      if (!self->streaming_ || self->finished_) return;
      self->enqueue("0\r\n\r\n");
      self->finished_ = true;
      self->maybe_next();
    });
  }

  void abort_stream() override {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      if (!self->streaming_ || self->finished_) return;
      // No last chunk, and the connection closes after what is queued.
      self->keep_alive_ = false;
      self->finished_ = true;
      self->maybe_next();
    });
  }

  void add_header(std::string name, std::string value) override {
    asio::post(stream_.get_executor(),
               [self = shared_from_this(), n = std::move(name), v = std::move(value)] {
                 if (!self->answered_) self->extra_headers_ += n + ": " + v + "\r\n";
               });
  }

  void run_on_connection(std::function<void()> fn) override {
    asio::post(stream_.get_executor(), std::move(fn));
  }

  void set_on_abort(std::function<void()> cb) override {
    asio::post(stream_.get_executor(), [self = shared_from_this(), cb = std::move(cb)] {
      self->on_abort_ = cb;
      if (self->closed_ && self->on_abort_) std::exchange(self->on_abort_, nullptr)();
    });
  }

 private:
  std::string head(int status, const std::string& ct) {
    std::string h = "HTTP/1.1 " + std::to_string(status) + " " + reason(status) + "\r\n";
    h += "Server: tidepoold\r\nContent-Type: " + ct + "\r\n";
    h += extra_headers_;
    if (!keep_alive_) h += "Connection: close\r\n";
    return h;
  }

  enum class Phase { kIdle, kHeader, kBody, kHandling, kClosing };

  // Waits for the next request. Only here, and while its header and body come
  // in, does the connection run against the clock (ServerOptions).
  void read() {
    spool_parser_.reset();
    parser_.emplace();
    parser_->header_limit(kHeaderMax);
    parser_->body_limit(boost::none);  // the route's limit is set once the header is in
    answered_ = finished_ = streaming_ = unread_body_ = false;
    on_abort_ = nullptr;
    extra_headers_.clear();
    phase_ = Phase::kIdle;
    if (ticket_) ticket_->set_idle(true);
    if (buf_.size() > 0) return read_header();  // a pipelined request is already here
    // An idle connection holds no read buffer: thousands of them stay cheap.
    buf_.shrink_to_fit();
    stream_.expires_after(opts_->idle_timeout);
    stream_.async_read_some(asio::buffer(first_),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              if (ec) {
                                if (ec == beast::error::timeout)
                                  spdlog::debug("http: idle connection timed out");
                                return self->close();
                              }
                              auto b = self->buf_.prepare(n);
                              std::memcpy(b.data(), self->first_.data(), n);
                              self->buf_.commit(n);
                              self->read_header();
                            });
  }

  void read_header() {
    phase_ = Phase::kHeader;
    // From the request's first byte: a header trickled in (slowloris) is cut off.
    stream_.expires_after(opts_->header_timeout);
    http::async_read_header(
        stream_, buf_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    phase_ = Phase::kBody;
    if (ticket_) ticket_->set_idle(false);
    Request head = head_request();
    bool has_body = parser_->content_length().value_or(0) > 0 || parser_->chunked();
    // A body is read only for a caller who may send it: a client without a key
    // cannot make the daemon take in (and hold) an upload.
    if (has_body && opts_->check_head) {
      if (auto r = opts_->check_head(head); !r) {
        unread_body_ = true;
        if (r.error().code == Code::kUnauthenticated)
          extra_headers_ += "WWW-Authenticate: Bearer\r\n";
        return reply_error(http_status(r.error().code), std::string(code_name(r.error().code)),
                           r.error().message());
      }
    }
    size_t limit = opts_->max_body_bytes;
    if (opts_->body_limit) limit = std::min(limit, opts_->body_limit(head.method, head.path));
    // Refused before a byte of it is read (and so before any of it is held).
    if (auto len = parser_->content_length(); len && *len > limit) {
      unread_body_ = true;
      return reply_error(413, "payload_too_large",
                         "request body of " + std::to_string(*len) +
                             " bytes is over the limit of " + std::to_string(limit) +
                             " bytes for " + head.method + " on this path");
    }
    parser_->body_limit(limit);  // a chunked body is counted as it comes
    if (parser_->is_done()) return dispatch();
    // An upload above the threshold goes to a spool file as it arrives.
    const SpoolOptions* sp = opts_->spool.get();
    if (sp && !sp->dir.empty() && opts_->spools && opts_->spools(head.method, head.path) &&
        (parser_->chunked() || parser_->content_length().value_or(0) > sp->threshold)) {
      spool_parser_.emplace(std::move(*parser_));
      parser_.reset();
      spool_parser_->body_limit(limit);
      std::string why;
      if (!spool_parser_->get().body().open(*sp, &why)) {
        spdlog::error("http: cannot spool an upload: {}", why);
        unread_body_ = true;
        return reply_error(507, "insufficient_storage", "cannot spool the upload: " + why);
      }
      return read_spooled_body();
    }
    read_body();
  }

  void read_spooled_body() {
    stream_.expires_after(opts_->body_timeout);
    http::async_read_some(stream_, buf_, *spool_parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) {
                            if (ec) return self->on_read_error(ec);
                            if (!self->spool_parser_->is_done()) return self->read_spooled_body();
                            self->dispatch();
                          });
  }

  // Reserves n more bytes of the body budget, or answers 503 (false).
  bool hold_body(uint64_t n) {
    if (!opts_->body_budget) return true;
    if (opts_->body_budget->take(n)) {
      held_ += n;
      return true;
    }
    unread_body_ = true;
    extra_headers_ += "Retry-After: 1\r\n";
    reply_error(503, "unavailable",
                "the server is receiving " + std::to_string(opts_->body_budget->used()) +
                    " bytes of request bodies already (at most " +
                    std::to_string(opts_->body_budget->max()) + "); retry later");
    return false;
  }

  void release_body() {
    if (held_ && opts_->body_budget) opts_->body_budget->give(held_);
    held_ = 0;
  }

  // The request as far as its header tells (no body).
  Request head_request() {
    const http::request_header<>& msg =
        spool_parser_ ? static_cast<const http::request_header<>&>(spool_parser_->get())
                      : static_cast<const http::request_header<>&>(parser_->get());
    Request req;
    req.method = std::string(msg.method_string());
    req.target = std::string(msg.target());
    decode_target(req);
    for (const auto& f : msg) {
      std::string name(f.name_string());
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      req.headers[name] = std::string(f.value());
    }
    req.caller = caller_;
    return req;
  }

  void read_body() {
    // Per read: a slow upload is fine as long as bytes keep coming.
    stream_.expires_after(opts_->body_timeout);
    http::async_read_some(stream_, buf_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) {
                            if (ec) return self->on_read_error(ec);
                            // Counted by the bytes received, not the length announced:
                            // announcing (and trickling) big bodies costs the client nothing,
                            // so it must not take the budget from others.
                            size_t have = self->parser_->get().body().size();
                            if (have > self->held_ && !self->hold_body(have - self->held_)) return;
                            if (!self->parser_->is_done()) return self->read_body();
                            self->dispatch();
                          });
  }

  void on_read_error(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::error::connection_reset || ec == asio::error::operation_aborted) {
      close();
      return;
    }
    if (ec == beast::error::timeout) {
      // basic_stream has closed the socket already: nothing can be answered.
      spdlog::debug("http: request {} timed out", phase_ == Phase::kHeader ? "header" : "body");
      close();
      return;
    }
    int status = 400;
    std::string code = "invalid_argument";
    if (spool_parser_ && spool_parser_->get().body().failure() != SpoolFailure::kNone) {
      unread_body_ = true;
      const auto& body = spool_parser_->get().body();
      if (body.failure() == SpoolFailure::kBudget) {
        extra_headers_ += "Retry-After: 1\r\n";
        return reply_error(503, "unavailable", body.failure_message());
      }
      spdlog::error("http: {}", body.failure_message());
      return reply_error(507, "insufficient_storage", body.failure_message());
    }
    if (ec == http::error::body_limit) {
      status = 413;
      code = "payload_too_large";
      unread_body_ = true;
    } else if (ec == http::error::header_limit) {
      status = 431;
      code = "payload_too_large";
    }
    reply_error(status, code, "bad HTTP request: " + ec.message());
  }

  // An answer from the server itself, after which the connection closes.
  void reply_error(int status, const std::string& code, const std::string& message) {
    phase_ = Phase::kHandling;
    if (ticket_) ticket_->set_idle(false);
    stream_.expires_never();  // the read deadline must not cut the answer
    keep_alive_ = false;
    boost::json::object o;
    o["code"] = code;
    o["message"] = message;
    answered_ = false;
    method_ = "";
    send(status, "application/json", json_util::serialize_utf8(o) + "\n");
  }

  void dispatch() {
    phase_ = Phase::kHandling;
    stream_.expires_never();  // answering (a stream) may take as long as it takes
    Request req = head_request();
    method_ = req.method;
    if (spool_parser_) {
      keep_alive_ = spool_parser_->get().keep_alive();
      req.upload = spool_parser_->get().body().finish();
      spool_parser_.reset();
      if (!req.upload) return reply_error(500, "internal", "the spooled upload was lost");
    } else {
      auto& msg = parser_->get();
      keep_alive_ = msg.keep_alive();
      req.body = std::move(msg.body());
    }
    handler_(req, shared_from_this());
    watch_peer();
  }

  // While a request is being answered, notice a client that hangs up, so that
  // long calls (a command) can be cancelled instead of running for nobody.
  void watch_peer() {
    if (finished_ || closed_) return;
    stream_.socket().async_wait(
        asio::socket_base::wait_read, [self = shared_from_this()](beast::error_code ec) {
          if (ec || self->finished_ || self->closed_) return;
          beast::error_code ec2;
          if (self->stream_.socket().available(ec2) == 0 || ec2) {
            char c;
            auto n = ::recv(self->stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) self->close();
          }
          // Data (a pipelined request) is left for the next read.
        });
  }

  // One write: `head`, then `body` (and CRLF: a chunk); `written` is told how it went.
  struct Out {
    std::string head;
    std::string body;
    bool crlf = false;
    std::function<void(bool)> written;
  };

  void enqueue(std::string data) { enqueue(Out{std::move(data), {}, false, nullptr}); }

  void enqueue(Out o) {
    out_.push_back(std::move(o));
    if (!writing_) write_next();
  }

  void write_next() {
    if (out_.empty() || closed_) {
      writing_ = false;
      fail_queued();
      return;
    }
    writing_ = true;
    const Out& o = out_.front();
    std::array<asio::const_buffer, 3> bufs{asio::buffer(o.head), asio::buffer(o.body),
                                           asio::buffer("\r\n", o.crlf ? 2 : 0)};
    asio::async_write(stream_, bufs, [self = shared_from_this()](beast::error_code ec, size_t) {
      auto w = std::move(self->out_.front().written);
      self->out_.pop_front();
      if (ec) {
        self->writing_ = false;
        self->close();
        self->fail_queued();
        if (w) w(false);
        return;
      }
      if (w) w(true);
      self->write_next();
      self->maybe_next();
    });
  }

  // The connection is gone: what is still queued will never be written.
  void fail_queued() {
    std::deque<Out> left;
    left.swap(out_);
    for (auto& o : left)
      if (o.written) o.written(false);
  }

  // After a complete answer has been written, read the next request or close.
  void maybe_next() {
    if (!finished_ || writing_ || !out_.empty() || closed_) return;
    parser_.reset();
    spool_parser_.reset();
    release_body();  // answered: the handler is done with the body
    if (!keep_alive_) {
      beast::error_code ec;
      stream_.socket().shutdown(asio::socket_base::shutdown_send, ec);
      if (unread_body_) return linger();
      close();
      return;
    }
    read();
  }

  // Reads and drops what the client still sends of a refused body, for a
  // bounded time and amount, then closes.
  void linger() {
    phase_ = Phase::kClosing;
    if (!drain_) {
      drain_ = std::make_unique<std::array<char, 16384>>();
      stream_.expires_after(kLinger);  // one deadline for the whole drain
    }
    stream_.async_read_some(asio::buffer(*drain_),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->drained_ += n;
                              if (ec || self->drained_ > kLingerMaxBytes) return self->close();
                              self->linger();
                            });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    stream_.socket().close(ec);
    // The write in progress (if any) completes with an error and tells its own.
    if (!writing_) fail_queued();
    if (answered_ && !finished_ && on_abort_)
      std::exchange(on_abort_, nullptr)();
    else if (!answered_ && on_abort_)
      std::exchange(on_abort_, nullptr)();
  }

  Stream stream_;
  Handler& handler_;
  std::shared_ptr<const ServerOptions> opts_;
  Caller caller_;
  std::unique_ptr<ConnectionGate::Ticket> ticket_;
  beast::flat_buffer buf_;
  std::array<char, 512> first_{};  // the first bytes of a request, read while idle
  std::unique_ptr<std::array<char, 16384>> drain_;
  uint64_t drained_ = 0;
  uint64_t held_ = 0;  // bytes of the body budget this connection holds
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::request_parser<SpoolBody>> spool_parser_;  // an upload being spooled
  std::deque<Out> out_;
  std::function<void()> on_abort_;
  std::string extra_headers_;
  std::string method_;
  Phase phase_ = Phase::kIdle;
  int status_ = 0;
  bool writing_ = false;
  bool answered_ = false;
  bool streaming_ = false;
  bool finished_ = false;
  bool keep_alive_ = true;
  bool unread_body_ = false;
  bool closed_ = false;
};

// Turns away a connection the gate has no slot for: a short 503 in JSON, sent
// without waiting (a socket buffer always takes it), then the connection closes.
void refuse(int fd, const std::string& why) {
  boost::json::object o;
  o["code"] = "unavailable";
  o["message"] = "too many connections: " + why;
  std::string body = boost::json::serialize(o) + "\n";
  std::string msg =
      "HTTP/1.1 503 Service Unavailable\r\nServer: tidepoold\r\nContent-Type: "
      "application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  // Request bytes left unread would make the close a reset, which may drop the answer.
  char sink[4096];
  for (int i = 0; i < 16 && ::recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
  }
  (void)!::send(fd, msg.data(), msg.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_WR);
}

// A new connection: a slot from the gate, then a session; or refused.
template <class Protocol>
bool start_session(typename Protocol::socket sock, Handler& handler,
                   const std::shared_ptr<const ServerOptions>& opts, Caller caller,
                   const std::string& client, std::string* why) {
  std::unique_ptr<ConnectionGate::Ticket> ticket;
  if (opts->gate) {
    ticket = opts->gate->admit(client, why);
    if (!ticket) {
      refuse(sock.native_handle(), *why);
      return false;  // the socket closes here
    }
  }
  std::make_shared<Session<Protocol>>(std::move(sock), handler, opts, std::move(caller),
                                      std::move(ticket))
      ->run();
  return true;
}

}  // namespace

HttpServer::HttpServer(asio::io_context& io, Handler handler, ServerOptions opts)
    : io_(io),
      handler_(std::move(handler)),
      opts_(std::make_shared<const ServerOptions>(std::move(opts))),
      acceptor_(io),
      unix_acceptor_(io),
      tcp_backoff_(io),
      unix_backoff_(io) {}

HttpServer::~HttpServer() { stop(); }

Result<void> HttpServer::start(const std::string& host, uint16_t port) {
  beast::error_code ec;
  auto addr = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) return fail(Code::kInvalidArgument, "listen address '" + host + "': " + ec.message());
  tcp::endpoint ep(addr, port);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return fail(Code::kUnavailable,
                "listen(" + host + ":" + std::to_string(port) + "): " + ec.message());
  accept();
  return {};
}

Result<void> HttpServer::start_unix(const std::string& path) {
  using local = asio::local::stream_protocol;
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    // Only a socket left by an earlier run is replaced, never another file.
    if (!S_ISSOCK(st.st_mode))
      return fail(Code::kInvalidArgument, "--socket " + path + " exists and is not a socket");
    // A socket someone still accepts on belongs to a running daemon: never take it over.
    local::socket probe(io_);
    beast::error_code pec;
    probe.connect(local::endpoint(path), pec);
    if (!pec)
      return fail(Code::kConflict, "another daemon is serving on " + path + " (use --socket)");
    ::unlink(path.c_str());
  }
  beast::error_code ec;
  local::endpoint ep(path);
  unix_acceptor_.open(ep.protocol(), ec);
  if (!ec) unix_acceptor_.bind(ep, ec);
  if (!ec) unix_acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return fail(Code::kUnavailable, "listen(unix:" + path + "): " + ec.message());
  unix_path_ = path;
  accept_unix();
  return {};
}

void HttpServer::stop() {
  beast::error_code ec;
  tcp_backoff_.timer.cancel();
  unix_backoff_.timer.cancel();
  acceptor_.close(ec);
  if (unix_acceptor_.is_open()) {
    unix_acceptor_.close(ec);
    if (!unix_path_.empty()) ::unlink(unix_path_.c_str());
    unix_path_.clear();
  }
}

uint16_t HttpServer::port() const {
  beast::error_code ec;
  return acceptor_.local_endpoint(ec).port();
}

void HttpServer::accept_failed(Backoff& b, const beast::error_code& ec, const char* what,
                               std::function<void()> again) {
  // A peer that gave up before its connection was accepted: nothing is wrong here.
  if (ec == asio::error::connection_aborted) return again();
  b.delay = b.delay.count() ? std::min(b.delay * 2, std::chrono::milliseconds(kBackoffMax))
                            : std::chrono::milliseconds(kBackoffMin);
  accept_log_.log("{}: {}; retrying in {} ms", what, ec.message(), b.delay.count());
  b.timer.expires_after(b.delay);
  b.timer.async_wait([again = std::move(again)](beast::error_code tec) {
    if (!tec) again();
  });
}

asio::io_context& HttpServer::session_io() {
  return opts_->sessions && opts_->sessions->size() ? opts_->sessions->next() : io_;
}

void HttpServer::accept() {
  acceptor_.async_accept(
      asio::make_strand(session_io()), [this](beast::error_code ec, tcp::socket sock) {
        if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
        if (ec) return accept_failed(tcp_backoff_, ec, "accept", [this] { accept(); });
        tcp_backoff_.delay = {};
        sock.set_option(tcp::no_delay(true), ec);
        beast::error_code pec;
        auto peer = sock.remote_endpoint(pec);
        std::string client = pec ? std::string("ip:?") : "ip:" + peer.address().to_string();
        std::string why;
        Caller c;
        c.peer = client;
        if (!start_session<tcp>(std::move(sock), handler_, opts_, std::move(c), client, &why))
          refuse_log_.log("http: refused a connection from {}: {}", client, why);
        accept();
      });
}

void HttpServer::accept_unix() {
  using local = asio::local::stream_protocol;
  unix_acceptor_.async_accept(
      asio::make_strand(session_io()), [this](beast::error_code ec, local::socket sock) {
        if (ec == asio::error::operation_aborted || !unix_acceptor_.is_open()) return;
        if (ec) return accept_failed(unix_backoff_, ec, "accept(unix)", [this] { accept_unix(); });
        unix_backoff_.delay = {};
        Caller c;
        if (peer_credentials(sock.native_handle(), &c)) {
          std::string client = "uid:" + std::to_string(c.uid);
          c.peer = client;
          std::string why;
          if (!start_session<local>(std::move(sock), handler_, opts_, std::move(c), client, &why))
            refuse_log_.log("http: refused a unix socket connection of {}: {}", client, why);
        } else {
          // Without the peer's identity the request cannot be judged: drop it.
          accept_log_.log("unix socket: no peer credentials: {}", std::strerror(errno));
        }
        accept_unix();
      });
}

}  // namespace tp::api
