#include "cli/http_client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace tp::cli {
namespace {

// A scripted HTTP server on 127.0.0.1: each accepted connection is handed to the
// handler with its index. It serves until destroyed; every fd is closed.
class ScriptServer {
 public:
  using Handler = std::function<void(int fd, int conn_index)>;

  explicit ScriptServer(Handler h) : handler_(std::move(h)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(listen_fd_, 16), 0);
    socklen_t len = sizeof a;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      for (int i = 0;; ++i) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) return;  // listen socket shut down
        accepted_.fetch_add(1);
        handler_(fd, i);
        ::close(fd);
      }
    });
  }
  ~ScriptServer() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    ::close(listen_fd_);
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  Url parsed_url() const { return Url::parse(url()).value(); }
  int accepted() const { return accepted_.load(); }

 private:
  Handler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

// Reads one request (head and Content-Length body); empty on EOF.
std::string read_request(int fd) {
  std::string data;
  char c;
  while (data.find("\r\n\r\n") == std::string::npos) {
    if (::read(fd, &c, 1) != 1) return "";
    data += c;
  }
  size_t cl = 0;
  auto pos = data.find("Content-Length: ");
  if (pos != std::string::npos) cl = std::stoul(data.substr(pos + 16));
  std::string body(cl, '\0');
  size_t got = 0;
  while (got < cl) {
    ssize_t n = ::read(fd, body.data() + got, cl - got);
    if (n <= 0) return "";
    got += static_cast<size_t>(n);
  }
  return data + body;
}

void send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

std::string response(int status, const std::string& body,
                     const std::string& ctype = "application/json", const std::string& extra = "") {
  return "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: " + ctype +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + extra + "\r\n" + body;
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

TEST(CliUrl, ParsesForms) {
  auto u = Url::parse("http://127.0.0.1:7070").value();
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, "7070");
  EXPECT_EQ(u.base, "");
  EXPECT_EQ(u.str(), "http://127.0.0.1:7070");
  u = Url::parse("http://example.org/prefix/").value();
  EXPECT_EQ(u.port, "80");
  EXPECT_EQ(u.base, "/prefix");
  u = Url::parse("localhost:9000").value();
  EXPECT_EQ(u.host, "localhost");
  EXPECT_EQ(u.port, "9000");
  u = Url::parse("http://[::1]:7070").value();
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.str(), "http://[::1]:7070");
}

TEST(CliUrl, RejectsBadInput) {
  for (const char* bad :
       {"", "https://x:1", "ftp://x", "http://", "http://:80", "http://x:", "http://x:0",
        "http://x:65536", "http://x:12ab", "http://[::1", "http://u@x:1", "http://x:1/a?b"}) {
    auto r = Url::parse(bad);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.error().code, Code::kInvalidArgument) << bad;
  }
}

TEST(CliHttpClient, UnreachableSaysSoPlainly) {
  std::string url = "http://127.0.0.1:" + std::to_string(free_port());
  HttpClient c(Url::parse(url).value());
  auto r = c.request(Method::kGet, "/health");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kUnavailable);
  EXPECT_EQ(r.error().message(), "cannot reach tidepoold at " + url + ": connection refused");
}

TEST(CliHttpClient, UnknownHostIsUnreachable) {
  HttpClient c(Url::parse("http://no-such-host.invalid:7070").value());
  auto r = c.request(Method::kGet, "/health");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kUnavailable);
  EXPECT_EQ(
      r.error().message().rfind("cannot reach tidepoold at http://no-such-host.invalid:7070: ", 0),
      0u);
}

TEST(CliHttpClient, KeepAliveReusesOneConnection) {
  std::vector<std::string> seen;
  ScriptServer srv([&](int fd, int) {
    for (;;) {
      std::string req = read_request(fd);
      if (req.empty()) return;
      seen.push_back(req);
      send_all(fd, response(200, "{\"n\":" + std::to_string(seen.size()) + "}"));
    }
  });
  HttpClient c(srv.parsed_url());
  for (int i = 1; i <= 3; ++i) {
    auto v = c.call_json(Method::kGet, "/version");
    ASSERT_TRUE(v.has_value()) << v.error().message();
    EXPECT_EQ(v->at("n").as_int64(), i);
  }
  EXPECT_EQ(srv.accepted(), 1);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].rfind("GET /version HTTP/1.1\r\n", 0), 0u);
}

TEST(CliHttpClient, SendsBodyAndContentType) {
  std::string seen;
  ScriptServer srv([&](int fd, int) {
    seen = read_request(fd);
    send_all(fd, response(201, "{\"id\":\"n0-1\"}"));
  });
  HttpClient c(srv.parsed_url());
  boost::json::value body = {{"image", "host"}, {"memory_mb", 512}};
  auto v = c.call_json(Method::kPost, "/v1/sandboxes", &body);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->at("id").as_string(), "n0-1");
  EXPECT_NE(seen.find("POST /v1/sandboxes HTTP/1.1"), std::string::npos);
  EXPECT_NE(seen.find("Content-Type: application/json"), std::string::npos);
  EXPECT_NE(seen.find("{\"image\":\"host\",\"memory_mb\":512}"), std::string::npos);
}

TEST(CliHttpClient, BasePathPrefixesTargets) {
  std::string seen;
  ScriptServer srv([&](int fd, int) {
    seen = read_request(fd);
    send_all(fd, response(200, "{}"));
  });
  HttpClient c(Url::parse(srv.url() + "/tp/").value());
  ASSERT_TRUE(c.call_json(Method::kGet, "/version").has_value());
  EXPECT_EQ(seen.rfind("GET /tp/version HTTP/1.1", 0), 0u);
}

TEST(CliHttpClient, RetriesOnceWhenServerClosedIdleConnection) {
  ScriptServer srv([&](int fd, int) {
    // Answers one request per connection without announcing "Connection: close",
    // as a server whose keep-alive timer fired would.
    if (read_request(fd).empty()) return;
    send_all(fd, response(200, "{\"ok\":true}"));
  });
  HttpClient c(srv.parsed_url());
  ASSERT_TRUE(c.call_json(Method::kGet, "/a").has_value());
  auto r = c.call_json(Method::kGet, "/b");
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_EQ(srv.accepted(), 2);
}

TEST(CliHttpClient, ConnectionCloseIsHonoured) {
  ScriptServer srv([&](int fd, int) {
    if (read_request(fd).empty()) return;
    send_all(fd, response(200, "{}", "application/json", "Connection: close\r\n"));
  });
  HttpClient c(srv.parsed_url());
  ASSERT_TRUE(c.call_json(Method::kGet, "/a").has_value());
  EXPECT_EQ(c.native_handle(), -1);
  ASSERT_TRUE(c.call_json(Method::kGet, "/b").has_value());
  EXPECT_EQ(srv.accepted(), 2);
}

TEST(CliHttpClient, DaemonErrorBecomesCodeAndMessage) {
  ScriptServer srv([&](int fd, int) {
    for (;;) {
      if (read_request(fd).empty()) return;
      send_all(fd, response(404, R"({"code":"not_found","message":"sandbox x not found"})"));
    }
  });
  HttpClient c(srv.parsed_url());
  auto r = c.call_json(Method::kGet, "/v1/sandboxes/x");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kNotFound);
  EXPECT_EQ(r.error().message(), "not_found: sandbox x not found");
  // The connection stays usable after an error answer.
  EXPECT_FALSE(c.call_json(Method::kGet, "/v1/sandboxes/x").has_value());
  EXPECT_EQ(srv.accepted(), 1);
}

TEST(CliHttpClient, ForeignErrorBodyFallsBackToStatus) {
  ScriptServer srv([&](int fd, int) {
    if (read_request(fd).empty()) return;
    send_all(fd, response(503, "upstream\nbusy", "text/plain"));
  });
  HttpClient c(srv.parsed_url());
  auto r = c.request(Method::kGet, "/x");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kUnavailable);
  EXPECT_EQ(r.error().message(), "HTTP 503: upstream busy");
}

TEST(CliHttpClient, InvalidJsonIsAnError) {
  ScriptServer srv([&](int fd, int) {
    if (read_request(fd).empty()) return;
    send_all(fd, response(200, "{not json"));
  });
  HttpClient c(srv.parsed_url());
  auto r = c.call_json(Method::kGet, "/x");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kInternal);
}

TEST(CliHttpClient, EmptyBodyIsNull) {
  ScriptServer srv([&](int fd, int) {
    if (read_request(fd).empty()) return;
    send_all(fd, "HTTP/1.1 204 No Content\r\n\r\n");
  });
  HttpClient c(srv.parsed_url());
  auto r = c.call_json(Method::kDelete, "/x");
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->is_null());
}

TEST(CliHttpClient, ChunkedStreamIsDeliveredInOrderAndBinarySafe) {
  std::string binary;
  for (int i = 0; i < 256; ++i) binary += static_cast<char>(i);
  ScriptServer srv([&](int fd, int) {
    if (read_request(fd).empty()) return;
    send_all(fd,
             "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: "
             "chunked\r\n\r\n");
    const std::vector<std::string> chunks = {"{\"type\":\"started\"}\n", binary,
                                             std::string(100000, 'x'), "end"};
    for (const auto& ch : chunks) {
      char len[32];
      std::snprintf(len, sizeof len, "%zx\r\n", ch.size());
      send_all(fd, len + ch + "\r\n");
    }
    send_all(fd, "0\r\n\r\n");
  });
  HttpClient c(srv.parsed_url());
  std::string ctype;
  std::string got;
  size_t pieces = 0;
  auto r = c.stream(
      Method::kPost, "/exec", "{}", "application/json",
      [&](int status, std::string_view ct) -> Result<void> {
        EXPECT_EQ(status, 200);
        ctype = ct;
        return {};
      },
      [&](std::string_view piece) -> Result<void> {
        ++pieces;
        got.append(piece);
        return {};
      });
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_EQ(ctype, "application/x-ndjson");
  EXPECT_EQ(got, "{\"type\":\"started\"}\n" + binary + std::string(100000, 'x') + "end");
  EXPECT_GE(pieces, 2u);
  EXPECT_GE(c.native_handle(), 0);  // the stream ended cleanly: connection kept
}

TEST(CliHttpClient, SinkErrorAbortsAndClosesConnection) {
  ScriptServer srv([&](int fd, int) {
    if (read_request(fd).empty()) return;
    send_all(fd, response(200, std::string(1000, 'a'), "application/octet-stream"));
  });
  HttpClient c(srv.parsed_url());
  auto r = c.stream(Method::kGet, "/f", {}, {}, nullptr, [](std::string_view) -> Result<void> {
    return fail(Code::kInternal, "disk full");
  });
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().message(), "disk full");
  EXPECT_EQ(c.native_handle(), -1);
}

TEST(CliHttpClient, TruncatedAnswerIsAnError) {
  ScriptServer srv([&](int fd, int) {
    if (read_request(fd).empty()) return;
    send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly a little");
  });
  HttpClient c(srv.parsed_url());
  auto r = c.request(Method::kGet, "/f");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kUnavailable);
  EXPECT_NE(r.error().message().find("lost"), std::string::npos);
}

TEST(CliHttpClient, GarbageAnswerIsAnError) {
  ScriptServer srv([&](int fd, int) {
    if (read_request(fd).empty()) return;
    send_all(fd, "SSH-2.0-OpenSSH_9.2\r\n\r\n");
  });
  HttpClient c(srv.parsed_url());
  auto r = c.request(Method::kGet, "/f");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kUnavailable);
}

TEST(CliErrorFromResponse, Shapes) {
  auto e = error_from_response(409, R"({"code":"conflict","message":"sandbox is stopped"})");
  EXPECT_EQ(e.code, Code::kConflict);
  EXPECT_EQ(e.message(), "conflict: sandbox is stopped");
  e = error_from_response(400, R"({"code":"invalid_argument"})");
  EXPECT_EQ(e.message(), "invalid_argument");
  e = error_from_response(413, "");
  EXPECT_EQ(e.code, Code::kPayloadTooLarge);
  EXPECT_EQ(e.message(), "HTTP 413");
  e = error_from_response(418, "[1,2]");
  EXPECT_EQ(e.code, Code::kInternal);
  EXPECT_EQ(e.message(), "HTTP 418: [1,2]");
}

}  // namespace
}  // namespace tp::cli
