// ConnectionGate and BodyBudget (api/http_server.h): connection slots, per-client caps,
// eviction of idle connections, and the memory of request bodies in flight.
#include <gtest/gtest.h>

#include "api/http_server.h"

namespace tp::api {
namespace {

struct FakeConn : Evictable {
  int evicted = 0;
  void evict() override { ++evicted; }
};

struct Conn {
  std::shared_ptr<FakeConn> conn = std::make_shared<FakeConn>();
  std::unique_ptr<ConnectionGate::Ticket> ticket;
};

Conn open(ConnectionGate& g, const std::string& client, bool idle = true) {
  Conn c;
  c.ticket = g.admit(client);
  if (c.ticket) {
    c.ticket->bind(c.conn);
    c.ticket->set_idle(idle);
  }
  return c;
}

TEST(ConnectionGate, SlotsAreCountedAndReleased) {
  auto g = ConnectionGate::create(4, 0);
  EXPECT_EQ(g->max_per_client(), 4u);
  {
    auto a = open(*g, "ip:1");
    auto b = open(*g, "ip:2");
    EXPECT_EQ(g->connections(), 2u);
    EXPECT_EQ(g->connections_of("ip:1"), 1u);
  }
  EXPECT_EQ(g->connections(), 0u);
  EXPECT_EQ(g->connections_of("ip:1"), 0u);
}

TEST(ConnectionGate, FullOfBusyConnectionsRefusesNewOnes) {
  auto g = ConnectionGate::create(2, 0);
  auto a = open(*g, "ip:1", false);
  auto b = open(*g, "ip:2", false);
  std::string why;
  EXPECT_EQ(g->admit("ip:3", &why), nullptr);
  EXPECT_NE(why.find("busy"), std::string::npos);
  EXPECT_EQ(g->connections(), 2u);
  EXPECT_EQ(g->connections_of("ip:3"), 0u);
}

TEST(ConnectionGate, FullServerEvictsTheLongestIdleConnection) {
  auto g = ConnectionGate::create(3, 0);
  auto a = open(*g, "ip:1");
  auto b = open(*g, "ip:1");
  auto busy = open(*g, "ip:2", false);
  auto c = open(*g, "ip:3");
  ASSERT_TRUE(c.ticket);
  EXPECT_EQ(a.conn->evicted, 1);  // oldest idle
  EXPECT_EQ(b.conn->evicted, 0);
  EXPECT_EQ(busy.conn->evicted, 0);
  // The evicted one holds its slot until it is gone.
  EXPECT_EQ(g->connections(), 4u);
  a.ticket.reset();
  EXPECT_EQ(g->connections(), 3u);
  // A connection that turned busy is no longer a candidate.
  b.ticket->set_idle(false);
  c.ticket->set_idle(false);
  EXPECT_EQ(g->admit("ip:4"), nullptr);
}

TEST(ConnectionGate, ClientAtItsCapTakesTheSlotOfItsOwnIdleConnection) {
  auto g = ConnectionGate::create(100, 2);
  auto other = open(*g, "uid:1000");
  auto a = open(*g, "uid:0");
  auto b = open(*g, "uid:0");
  auto c = open(*g, "uid:0");
  ASSERT_TRUE(c.ticket);
  EXPECT_EQ(a.conn->evicted, 1);
  EXPECT_EQ(other.conn->evicted, 0);
  // With its connections busy it gets no more, while others still do.
  b.ticket->set_idle(false);
  c.ticket->set_idle(false);
  a.ticket.reset();
  std::string why;
  EXPECT_EQ(g->admit("uid:0", &why), nullptr);
  EXPECT_NE(why.find("one client"), std::string::npos);
  auto d = open(*g, "uid:1000");
  EXPECT_TRUE(d.ticket);
}

TEST(ConnectionGate, IdleAgainIsYoungestAgain) {
  auto g = ConnectionGate::create(2, 0);
  auto a = open(*g, "ip:1");
  auto b = open(*g, "ip:1");
  a.ticket->set_idle(false);  // a request ...
  a.ticket->set_idle(true);   // ... answered: now b has waited longest
  auto c = open(*g, "ip:2");
  EXPECT_EQ(b.conn->evicted, 1);
  EXPECT_EQ(a.conn->evicted, 0);
}

}  // namespace
}  // namespace tp::api

namespace tp::api {
namespace {

TEST(BodyBudget, ReservesUpToItsMaxAndGivesBack) {
  BodyBudget b(100);
  EXPECT_TRUE(b.take(60));
  EXPECT_FALSE(b.take(41));  // nothing reserved on failure
  EXPECT_EQ(b.used(), 60u);
  EXPECT_TRUE(b.take(40));
  EXPECT_FALSE(b.take(1));
  b.give(60);
  EXPECT_TRUE(b.take(60));
  EXPECT_FALSE(b.take(UINT64_MAX));  // no overflow
  EXPECT_EQ(b.used(), 100u);
}

}  // namespace
}  // namespace tp::api
