// HttpServer with ServerOptions::sessions: each accepted connection runs on the next
// io_context of the ring (each on its own thread here), and answers from any thread
// reach the client.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "api/http_server.h"

namespace tp::api {
namespace {

namespace asio = boost::asio;

// One GET on a fresh connection; the whole answer (the server closes: Connection: close).
std::string get_once(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return "connect failed";
  }
  std::string req = "GET /where HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  (void)::write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

TEST(HttpServerRing, ConnectionsTakeTheRingsIoContextsInTurn) {
  asio::io_context accept_io, a, b;
  auto guard_a = asio::make_work_guard(a);
  auto guard_b = asio::make_work_guard(b);
  std::thread ta([&] { a.run(); });
  std::thread tb([&] { b.run(); });
  std::mutex mu;
  std::set<std::thread::id> handler_threads;
  std::vector<std::thread> answerers;
  Handler h = [&](Request&, std::shared_ptr<Responder> res) {
    std::lock_guard lk(mu);
    handler_threads.insert(std::this_thread::get_id());
    // Answered from another thread, as the manager does.
    answerers.emplace_back([res] { res->send(200, "text/plain", "here"); });
  };
  ServerOptions o;
  o.sessions = std::make_shared<IoRing>(std::vector<asio::io_context*>{&a, &b});
  auto srv = std::make_unique<HttpServer>(accept_io, h, o);
  ASSERT_TRUE(srv->start("127.0.0.1", 0));
  uint16_t port = srv->port();
  auto guard_accept = asio::make_work_guard(accept_io);
  std::thread tacc([&] { accept_io.run(); });
  for (int i = 0; i < 4; ++i) {
    std::string r = get_once(port);
    EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
    EXPECT_NE(r.find("\r\n\r\nhere"), std::string::npos) << r;
  }
  {
    std::lock_guard lk(mu);
    // Two io_contexts, one thread each: the handlers ran on exactly those two threads.
    EXPECT_EQ(handler_threads, (std::set<std::thread::id>{ta.get_id(), tb.get_id()}));
  }
  for (auto& t : answerers) t.join();
  asio::post(accept_io, [&] { srv->stop(); });
  guard_accept.reset();
  guard_a.reset();
  guard_b.reset();
  tacc.join();
  a.stop();
  b.stop();
  ta.join();
  tb.join();
  srv.reset();
}

TEST(HttpServerRing, IoRingHandsOutItsContextsRoundRobin) {
  asio::io_context x, y, z;
  IoRing ring({&x, &y, &z});
  EXPECT_EQ(ring.size(), 3u);
  EXPECT_EQ(&ring.next(), &x);
  EXPECT_EQ(&ring.next(), &y);
  EXPECT_EQ(&ring.next(), &z);
  EXPECT_EQ(&ring.next(), &x);
}

}  // namespace
}  // namespace tp::api
