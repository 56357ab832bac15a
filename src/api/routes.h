// Api: the HTTP routes of tidepoold (api/openapi.yaml is the contract; the
// route table below is checked against it by tests/unit/api/openapi_test.cpp).
//
// Every error answer is JSON {code, message} with the status of its code.
// Thread rules: handle() may be called from any io thread concurrently.
#pragma once

#include <boost/json.hpp>
#include <chrono>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "api/http_server.h"
#include "api/idempotency.h"
#include "common/metrics.h"
#include "node/service.h"

namespace tp::api {

struct RouteInfo {
  std::string method;   // GET, POST, PUT, DELETE
  std::string pattern;  // /v1/sandboxes/{id}/exec
};

// A module that serves its own routes (e.g. images). handle() returns false
// when the request is not one of its routes.
class RouteProvider {
 public:
  virtual ~RouteProvider() = default;
  virtual bool handle(Request& req, std::shared_ptr<Responder> res) = 0;
};

// The sandbox fields of a create body (CreateParams, with `given` the fields set);
// `extra` names the caller's own keys, which it parses itself.
Result<node::CreateParams> parse_create(const boost::json::object& o,
                                        std::initializer_list<std::string_view> extra = {});

class Api {
 public:
  // How long a keyed command whose client vanished waits for the client's retry
  // (unless the call asked to finish: Tidepool-On-Disconnect).
  static constexpr auto kRetryGrace = std::chrono::seconds(5);

  Api(node::Service& mgr, Metrics& metrics);
  void handle(Request& req, std::shared_ptr<Responder> res);
  // Providers are asked before the core routes, in the order added. Add before serving.
  void add_provider(std::shared_ptr<RouteProvider> p) { providers_.push_back(std::move(p)); }
  // Records keyed answers durably (see api/idempotency.h). Set before serving.
  void set_step_log(std::shared_ptr<node::StepLog> log);
  // --trajectory-log on: calls without a key on live sandboxes are recorded too. Set
  // before serving (after set_step_log).
  void set_trajectory_log(bool every_call);
  // The keyed answers (for the log routes' result-by-key).
  IdempotencyCache& idempotency() { return idempotency_; }
  // Largest file or tar download (--max-download-mb). Downloads stream (api/download.h):
  // this bounds what one request may send, not what the daemon holds. Set before serving.
  void set_max_download(uint64_t bytes) { max_download_ = bytes; }
  // Where creates go (single and batch): the warm pools (node/pools.h) when set,
  // else the node directly. `from_pool` says whether a pool served it. Set before serving.
  using CreateFn = std::function<void(node::CreateParams,
                                      std::function<void(Result<control::SandboxRecord>, bool)>)>;
  void set_creator(CreateFn f) { creator_ = std::move(f); }
  // Cold work a client is waiting for (creates and batches): the pools refill only
  // while there is none. Set before serving.
  void set_client_work(std::function<void(int)> f) { client_work_ = std::move(f); }
  // Called when a request that uses a sandbox or a function starts and when it ends
  // (the pools pace their refills by it). Set before serving.
  void set_client_request(std::function<void()> f) { client_request_ = std::move(f); }
  // The tiers /version lists (the node's registry). Set before serving.
  void set_tiers(std::vector<std::string> tiers) { tiers_ = std::move(tiers); }
  static constexpr uint64_t kDefaultMaxDownload = 8ull << 30;
  // The routes this server serves (for the contract test).
  static std::vector<RouteInfo> routes();
  // Whether a request's body is raw bytes of any size (a file, an archive,
  // stdin) rather than JSON, which is held to a small limit (HTTP server body_limit).
  static bool takes_upload(const std::string& method, const std::string& path);

 private:
  using Params = std::vector<std::string>;  // captured {x} segments, in order
  using Fn = void (Api::*)(Request&, const Params&, std::shared_ptr<Responder>);
  struct Route {
    const char* method;
    const char* pattern;
    Fn fn;
  };
  static const std::vector<Route>& table();

  void health(Request&, const Params&, std::shared_ptr<Responder>);
  void version(Request&, const Params&, std::shared_ptr<Responder>);
  void metrics(Request&, const Params&, std::shared_ptr<Responder>);
  void create(Request&, const Params&, std::shared_ptr<Responder>);
  void list(Request&, const Params&, std::shared_ptr<Responder>);
  void get(Request&, const Params&, std::shared_ptr<Responder>);
  void destroy(Request&, const Params&, std::shared_ptr<Responder>);
  void exec(Request&, const Params&, std::shared_ptr<Responder>);
  void file_read(Request&, const Params&, std::shared_ptr<Responder>);
  void file_write(Request&, const Params&, std::shared_ptr<Responder>);
  void file_remove(Request&, const Params&, std::shared_ptr<Responder>);
  void file_list(Request&, const Params&, std::shared_ptr<Responder>);
  void file_stat(Request&, const Params&, std::shared_ptr<Responder>);
  void file_mkdir(Request&, const Params&, std::shared_ptr<Responder>);
  void create_batch(Request&, const Params&, std::shared_ptr<Responder>);
  void process_start(Request&, const Params&, std::shared_ptr<Responder>);
  void process_list(Request&, const Params&, std::shared_ptr<Responder>);
  void process_get(Request&, const Params&, std::shared_ptr<Responder>);
  void process_wait(Request&, const Params&, std::shared_ptr<Responder>);
  void process_stdin(Request&, const Params&, std::shared_ptr<Responder>);
  void process_signal(Request&, const Params&, std::shared_ptr<Responder>);
  void tar_download(Request&, const Params&, std::shared_ptr<Responder>);
  void tar_upload(Request&, const Params&, std::shared_ptr<Responder>);
  void pause(Request&, const Params&, std::shared_ptr<Responder>);
  void resume(Request&, const Params&, std::shared_ptr<Responder>);
  void create_one(node::CreateParams p,
                  std::function<void(Result<control::SandboxRecord>, bool from_pool)> cb);

  node::Service& mgr_;
  Metrics& metrics_;
  // Before the providers: they go first (a provider may hold the step log, whose last
  // reference must go with idempotency_, which its writer's callbacks use).
  IdempotencyCache idempotency_;
  std::vector<std::shared_ptr<RouteProvider>> providers_;
  uint64_t max_download_ = kDefaultMaxDownload;
  std::vector<std::string> tiers_{"container"};
  CreateFn creator_;
  std::function<void(int)> client_work_;
  std::function<void()> client_request_;
};

}  // namespace tp::api
