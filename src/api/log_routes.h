// LogRoutes: the trajectory log's routes (api/openapi.yaml; docs/trajectory-log.md):
//
//   GET  /v1/sandboxes/{id}/log          the sandbox's history as JSON, from a cursor
//                                        (?after=SEQ&limit=N&output=true); with
//                                        ?follow=true an NDJSON stream of the same
//                                        entries that waits for new ones and ends with
//                                        the sandbox's end: resumable from the last seq
//                                        seen, without gaps or duplicates
//   GET  /v1/sandboxes/{id}/log/result   the recorded answer of the call with ?key=K
//                                        (as a repeat of that call would get it; waits
//                                        while that call is still being answered)
//   POST /v1/sandboxes/{id}/replay       replay (or branch) its log into a fresh sandbox
//                                        (node/replay.h)
//
// Reads of the log and replays run on the provider's own threads, never on the io
// threads. At most kMaxReplays replays run at once (beyond: 429).
//
// Thread rules: handle() may be called from any io thread concurrently.
#pragma once

#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "api/routes.h"
#include "node/service.h"
#include "node/step_log.h"

namespace tp::api {

class LogRoutes : public RouteProvider {
 public:
  static constexpr int kMaxReplays = 4;
  using LayersOf = std::function<Result<std::vector<std::string>>(const std::string& image)>;

  // `api` serves the replayed calls (so they run, and are recorded, as any other call).
  LogRoutes(Api& api, node::Service& mgr, std::shared_ptr<node::StepLog> log, LayersOf layers_of);
  ~LogRoutes() override;
  bool handle(Request& req, std::shared_ptr<Responder> res) override;
  static std::vector<RouteInfo> routes();

 private:
  class Follower;
  void list(Request& req, const std::string& id, std::shared_ptr<Responder> res);
  void replay(Request& req, const std::string& id, std::shared_ptr<Responder> res);

  Api& api_;
  node::Service& mgr_;
  std::shared_ptr<node::StepLog> log_;
  LayersOf layers_of_;
  std::atomic<int> replays_{0};
  // Set when going away: followers stop, and a replay waiting for an answer that will
  // never come (the io threads have stopped) gives up.
  std::atomic<bool> stopping_{false};
  boost::asio::thread_pool readers_;
  boost::asio::thread_pool replayers_;
};

}  // namespace tp::api
