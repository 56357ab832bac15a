#include "api/daemon.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include <filesystem>
#include <iostream>
#include <thread>

#include "api/http_server.h"
#include "api/image_routes.h"
#include "api/routes.h"
#include "common/log.h"
#include <fmt/format.h>
#include "control/store.h"
#include "image/image_store.h"
#include "image/image_user.h"
#include "node/sandbox_manager.h"
#include "runtime/container/container_backend.h"

namespace tp::api {

namespace asio = boost::asio;

namespace {
std::string self_dir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "." : p.parent_path().string();
}
}  // namespace

int daemon_main(int argc, char** argv) {
  CLI::App app{"tidepoold: the Tidepool sandbox daemon"};
  std::string listen = "127.0.0.1:7070";
  std::string data_dir = "/var/lib/tidepool";
  std::string role = "all";
  std::string log_level = "info";
  std::string node = "n0";
  std::string agent = self_dir() + "/tp-agent";
  unsigned io_threads = 2;
  uint64_t image_budget_mb = 0;
  uint64_t layer_max_mb = 64 << 10;
  app.add_option("--listen", listen, "HOST:PORT to serve HTTP on")->capture_default_str();
  app.add_option("--data-dir", data_dir, "directory for state, images and sandboxes")
      ->capture_default_str();
  app.add_option("--role", role, "all (API + node + embedded store)")->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();
  app.add_option("--node", node, "this node's name; it prefixes every sandbox id")
      ->capture_default_str();
  app.add_option("--agent", agent, "path of the static tp-agent binary")->capture_default_str();
  app.add_option("--io-threads", io_threads, "HTTP and agent I/O threads")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  app.add_option("--image-budget-mb", image_budget_mb, "total size of stored image layers; 0 = no budget")
      ->capture_default_str();
  app.add_option("--layer-max-mb", layer_max_mb, "largest unpacked layer accepted")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  log::init(log_level);
  auto die = [](const std::string& msg) {
    std::cerr << "tidepoold: " << msg << "\n";
    return 1;
  };
  if (role != "all") return die("--role " + role + " is not available yet (only 'all')");
  bool node_ok = !node.empty() && node.size() <= 20;
  for (char c : node) node_ok = node_ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'));
  if (!node_ok) return die("--node must be 1-20 characters of [a-z0-9]");
  std::string host;
  uint16_t port = 0;
  if (!parse_listen(listen, &host, &port)) return die("--listen must be HOST:PORT, got '" + listen + "'");
  if (geteuid() != 0) return die("must run as root (it creates namespaces, cgroups and mounts)");
  if (access(agent.c_str(), X_OK) != 0) return die("agent binary not executable: " + agent);

  std::error_code ec;
  std::filesystem::create_directories(data_dir, ec);
  if (ec) return die("cannot create data dir " + data_dir + ": " + ec.message());
  chmod(data_dir.c_str(), 0711);
  data_dir = std::filesystem::canonical(data_dir).string();

  // Broken client connections must not kill the daemon.
  signal(SIGPIPE, SIG_IGN);

  auto store = control::Store::open(data_dir + "/state.db");
  if (!store) return die(store.error().message());

  runtime::ContainerOptions copts;
  copts.data_dir = data_dir;
  // Two daemons on one host (a test daemon next to the real one) must never
  // clean up each other's sandboxes: the parent cgroup is named after the data dir.
  if (data_dir != "/var/lib/tidepool") {
    uint32_t h = 2166136261u;  // FNV-1a
    for (unsigned char c : data_dir) h = (h ^ c) * 16777619u;
    copts.cgroup_name = fmt::format("tidepool-{:08x}", h);
  }
  copts.agent_path = agent;
  auto backend = runtime::make_container_backend(copts);
  if (!backend) return die("container runtime: " + backend.error().message());

  asio::io_context io;
  Metrics metrics;
  node::SandboxManager mgr(io, std::move(*backend), **store, metrics, node);
  if (auto r = mgr.recover(); !r) return die("recover: " + r.error().message());
  Api api(mgr, metrics);
  // Images (issue 4): layer store under the data dir, resolver for create, routes.
  image::StoreOptions sopts;
  sopts.data_dir = data_dir;
  sopts.limits.uid_base = copts.uid_base;
  sopts.limits.max_bytes = layer_max_mb << 20;
  sopts.budget_bytes = image_budget_mb << 20;
  auto images = image::ImageStore::open(sopts);
  if (!images) return die("image store: " + images.error().message());
  mgr.set_image_resolver([st = *images](const std::string& ref) -> Result<node::ResolvedImage> {
    auto r = st->resolve(ref);
    if (!r) return std::unexpected(r.error());
    node::ResolvedImage img{r->paths, r->defaults.env, r->defaults.workdir, r->pin};
    auto ids = image::resolve_user(r->defaults.user, r->paths);
    if (!ids) return std::unexpected(ids.error());
    img.uid = ids->first;
    img.gid = ids->second;
    return img;
  });
  api.add_provider(std::make_shared<ImageRoutes>(*images));
  HttpServer server(io, [&api](Request& req, std::shared_ptr<Responder> res) { api.handle(req, res); },
                    1ull << 30);
  if (auto r = server.start(host, port); !r) return die(r.error().message());
  mgr.start();

  // Joined before return: it uses mgr and io, which must outlive it (detached, it raced
  // with their destructors; ThreadSanitizer, make test-tsan).
  std::thread stopper;
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](boost::system::error_code, int sig) {
    spdlog::info("signal {}: shutting down", sig);
    server.stop();
    // Destroying sandboxes blocks; run it off the io threads, which it needs.
    stopper = std::thread([&] {
      mgr.shutdown();
      io.stop();
    });
  });

  std::cout << "tidepoold ready on http://" << host << ":" << server.port() << " (data dir "
            << data_dir << ", node " << node << ")" << std::endl;
  std::vector<std::thread> threads;
  for (unsigned i = 1; i < io_threads; ++i) threads.emplace_back([&io] { io.run(); });
  io.run();
  for (auto& t : threads) t.join();
  // The io threads are joined, so the handler that started the stopper has finished.
  if (stopper.joinable()) stopper.join();
  spdlog::info("stopped");
  return 0;
}

}  // namespace tp::api
