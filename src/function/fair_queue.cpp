#include "function/fair_queue.h"

#include <algorithm>

namespace tp::function {

Result<void> FairQueue::push(const std::string& client, Id id) {
  if (queued_ >= opts_.total_queued)
    return fail(Code::kResourceExhausted,
                "the function tier's queue is full (" + std::to_string(queued_) + " calls)");
  Client& c = clients_[client];
  if (c.queue.size() >= opts_.per_client_queued) {
    drop_if_idle(client);
    return fail(Code::kResourceExhausted, "too many queued calls for this client (" +
                                              std::to_string(opts_.per_client_queued) + ")");
  }
  c.queue.push_back(id);
  owner_[id] = client;
  ++queued_;
  if (!c.in_ring) {
    // A client that had nothing waiting goes first: it has been served least recently.
    // (One that is served goes to the back, so every waiting client's turn comes.)
    ring_.push_front(client);
    c.in_ring = true;
  }
  return {};
}

bool FairQueue::remove(Id id) {
  auto it = owner_.find(id);
  if (it == owner_.end()) return false;
  std::string name = it->second;
  owner_.erase(it);
  Client& c = clients_[name];
  auto q = std::find(c.queue.begin(), c.queue.end(), id);
  if (q != c.queue.end()) c.queue.erase(q);
  --queued_;
  if (c.queue.empty() && c.in_ring) {
    ring_.remove(name);
    c.in_ring = false;
  }
  drop_if_idle(name);
  return true;
}

std::optional<FairQueue::Id> FairQueue::pop() {
  // One pass over the ring: the first client with room runs, and goes to the back.
  for (auto it = ring_.begin(); it != ring_.end(); ++it) {
    Client& c = clients_[*it];
    if (opts_.per_client_in_flight && c.in_flight >= opts_.per_client_in_flight) continue;
    Id id = c.queue.front();
    c.queue.pop_front();
    owner_.erase(id);
    --queued_;
    ++c.in_flight;
    ++in_flight_;
    std::string name = *it;
    ring_.erase(it);
    if (c.queue.empty())
      c.in_ring = false;
    else
      ring_.push_back(name);
    return id;
  }
  return std::nullopt;
}

void FairQueue::done(const std::string& client) {
  auto it = clients_.find(client);
  if (it == clients_.end() || it->second.in_flight == 0) return;
  --it->second.in_flight;
  --in_flight_;
  drop_if_idle(client);
}

size_t FairQueue::queued_of(const std::string& client) const {
  auto it = clients_.find(client);
  return it == clients_.end() ? 0 : it->second.queue.size();
}

size_t FairQueue::in_flight_of(const std::string& client) const {
  auto it = clients_.find(client);
  return it == clients_.end() ? 0 : it->second.in_flight;
}

void FairQueue::drop_if_idle(const std::string& name) {
  auto it = clients_.find(name);
  if (it != clients_.end() && it->second.queue.empty() && it->second.in_flight == 0 &&
      !it->second.in_ring)
    clients_.erase(it);
}

}  // namespace tp::function
