#include "api/http_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

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

namespace {

// Answers up to this size are sent in one buffer with their head.
constexpr size_t kCopyBodyMax = 64 << 10;

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
class Session : public Responder, public std::enable_shared_from_this<Session<Protocol>> {
  using Stream = beast::basic_stream<Protocol>;
  using std::enable_shared_from_this<Session<Protocol>>::shared_from_this;

 public:
  Session(typename Protocol::socket sock, Handler& handler, size_t max_body, Caller caller)
      : stream_(std::move(sock)),
        handler_(handler),
        max_body_(max_body),
        caller_(std::move(caller)) {}

  void run() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read(); });
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
               });
  }

  void write_chunk(std::string data) override {
    if (data.empty()) return;
    asio::post(stream_.get_executor(), [self = shared_from_this(), d = std::move(data)] {
      if (!self->streaming_ || self->finished_) return;
      char len[32];
      snprintf(len, sizeof len, "%zx\r\n", d.size());
      self->enqueue(std::string(len) + d + "\r\n");
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

  void add_header(std::string name, std::string value) override {
    asio::post(stream_.get_executor(),
               [self = shared_from_this(), n = std::move(name), v = std::move(value)] {
                 if (!self->answered_) self->extra_headers_ += n + ": " + v + "\r\n";
               });
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

  void read() {
    parser_.emplace();
    parser_->body_limit(max_body_);
    parser_->header_limit(64 * 1024);
    answered_ = finished_ = streaming_ = false;
    on_abort_ = nullptr;
    extra_headers_.clear();
    stream_.expires_never();
    http::async_read(
        stream_, buf_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::error::connection_reset || ec == asio::error::operation_aborted) {
      close();
      return;
    }
    if (ec) {
      keep_alive_ = false;
      int status = 400;
      std::string code = "invalid_argument";
      if (ec == http::error::body_limit) {
        status = 413;
        code = "payload_too_large";
      }
      boost::json::object o;
      o["code"] = code;
      o["message"] = "bad HTTP request: " + ec.message();
      answered_ = false;
      method_ = "";
      send(status, "application/json", boost::json::serialize(o) + "\n");
      return;
    }
    auto& msg = parser_->get();
    keep_alive_ = msg.keep_alive();
    Request req;
    req.method = std::string(msg.method_string());
    method_ = req.method;
    req.target = std::string(msg.target());
    decode_target(req);
    for (const auto& f : msg) {
      std::string name(f.name_string());
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      req.headers[name] = std::string(f.value());
    }
    req.body = std::move(msg.body());
    req.caller = caller_;
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

  void enqueue(std::string data) {
    out_.push_back(std::move(data));
    if (!writing_) write_next();
  }

  void write_next() {
    if (out_.empty() || closed_) {
      writing_ = false;
      return;
    }
    writing_ = true;
    asio::async_write(stream_, asio::buffer(out_.front()),
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        self->out_.pop_front();
                        if (ec) {
                          self->close();
                          return;
                        }
                        self->write_next();
                        self->maybe_next();
                      });
  }

  // After a complete answer has been written, read the next request or close.
  void maybe_next() {
    if (!finished_ || writing_ || !out_.empty() || closed_) return;
    // A keep-alive connection must not hold a big request's buffers while idle.
    if (buf_.size() == 0 && buf_.capacity() > kCopyBodyMax) buf_.shrink_to_fit();
    parser_.reset();
    if (!keep_alive_) {
      beast::error_code ec;
      stream_.socket().shutdown(asio::socket_base::shutdown_send, ec);
      close();
      return;
    }
    read();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    stream_.socket().close(ec);
    if (answered_ && !finished_ && on_abort_)
      std::exchange(on_abort_, nullptr)();
    else if (!answered_ && on_abort_)
      std::exchange(on_abort_, nullptr)();
  }

  Stream stream_;
  Handler& handler_;
  size_t max_body_;
  Caller caller_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::deque<std::string> out_;
  std::function<void()> on_abort_;
  std::string extra_headers_;
  std::string method_;
  int status_ = 0;
  bool writing_ = false;
  bool answered_ = false;
  bool streaming_ = false;
  bool finished_ = false;
  bool keep_alive_ = true;
  bool closed_ = false;
};

}  // namespace

HttpServer::HttpServer(asio::io_context& io, Handler handler, size_t max_body_bytes)
    : io_(io),
      handler_(std::move(handler)),
      max_body_(max_body_bytes),
      acceptor_(io),
      unix_acceptor_(io) {}

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

void HttpServer::accept() {
  acceptor_.async_accept(asio::make_strand(io_), [this](beast::error_code ec, tcp::socket sock) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      sock.set_option(tcp::no_delay(true), ec);
      std::make_shared<Session<tcp>>(std::move(sock), handler_, max_body_, Caller{})->run();
    } else {
      spdlog::warn("accept: {}", ec.message());
    }
    if (acceptor_.is_open()) accept();
  });
}

void HttpServer::accept_unix() {
  using local = asio::local::stream_protocol;
  unix_acceptor_.async_accept(asio::make_strand(io_), [this](beast::error_code ec,
                                                             local::socket sock) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      Caller c;
      if (peer_credentials(sock.native_handle(), &c)) {
        std::make_shared<Session<local>>(std::move(sock), handler_, max_body_, std::move(c))->run();
      } else {
        // Without the peer's identity the request cannot be judged: drop it.
        spdlog::warn("unix socket: no peer credentials: {}", std::strerror(errno));
      }
    } else {
      spdlog::warn("accept(unix): {}", ec.message());
    }
    if (unix_acceptor_.is_open()) accept_unix();
  });
}

}  // namespace tp::api
