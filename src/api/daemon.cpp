#include "api/daemon.h"

#include <fmt/format.h>
#include <grp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <thread>
#include <unordered_set>
#include <vector>

#include "api/auth.h"
#include "api/function_setup.h"
#include "api/http_server.h"
#include "api/image_routes.h"
#include "api/lifecycle_routes.h"
#include "api/log_routes.h"
#include "api/routes.h"
#include "common/ids.h"
#include "common/log.h"
#include "control/sqlite/doc_store.h"
#include "control/sqlite/image_record_store.h"
#include "control/sqlite/sandbox_store.h"
#include "image/builder.h"
#include "image/image_store.h"
#include "image/image_user.h"
#include "node/jobs.h"
#include "node/pools.h"
#include "node/sandbox_manager.h"
#include "node/state.h"
#include "node/step_log.h"
#include "node/trajectory_events.h"
#include "runtime/container/container_backend.h"
#include "runtime/microvm/microvm_backend.h"
#include "runtime/registry.h"
#include "sys/file_lock.h"

namespace tp::api {

namespace asio = boost::asio;

namespace {
std::string self_dir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "." : p.parent_path().string();
}

bool is_loopback(const std::string& host) {
  boost::system::error_code ec;
  auto a = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  return !ec && a.is_loopback();
}

// The socket file: root-owned, group `tidepool` when that group exists (its
// members may use the daemon, as with docker), else group root; mode 0660.
// Its directory is created 0755 when missing.
Result<void> secure_socket(const std::string& path) {
  auto dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty() && !std::filesystem::exists(dir, ec)) {
    std::filesystem::create_directories(dir, ec);
    if (ec) return fail(Code::kInternal, "cannot create " + dir.string() + ": " + ec.message());
    ::chmod(dir.c_str(), 0755);
  }
  return {};
}

// Every connection and every sandbox holds descriptors of the daemon: take the
// whole hard limit. Returns the soft limit in force.
uint64_t raise_nofile() {
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  // With CAP_SYS_RESOURCE the hard limit may go up to fs.nr_open: each idle sandbox
  // holds one descriptor, so 10,000 alive need more than the usual hard limit.
  // Without the capability the attempt fails and the hard limit stays as given.
  if (std::ifstream in("/proc/sys/fs/nr_open"); in) {
    rlim_t nr_open = 0;
    if (in >> nr_open && rl.rlim_max != RLIM_INFINITY && nr_open > rl.rlim_max) {
      struct rlimit up {
        nr_open, nr_open
      };
      if (::setrlimit(RLIMIT_NOFILE, &up) == 0) {
        spdlog::info("open-file limit raised from {}/{} to {}", rl.rlim_cur, rl.rlim_max, nr_open);
        rl = up;
      }
    }
  }
  if (rl.rlim_cur < rl.rlim_max) {
    rlim_t old = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &rl) == 0)
      spdlog::info("open-file limit raised from {} to {}", old, rl.rlim_cur);
    else
      ::getrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur == RLIM_INFINITY ? (1u << 20) : static_cast<uint64_t>(rl.rlim_cur);
}

Result<void> own_socket(const std::string& path) {
  gid_t gid = 0;
  std::string group = "root";
  if (struct group* g = ::getgrnam("tidepool")) {
    gid = g->gr_gid;
    group = "tidepool";
  }
  if (::chown(path.c_str(), 0, gid) != 0) return sys_fail("chown(" + path + ")");
  if (::chmod(path.c_str(), 0660) != 0) return sys_fail("chmod(" + path + ")");
  spdlog::info("unix socket {} (root:{} 0660){}", path, group,
               group == "root" ? "; create group 'tidepool' to let other users in" : "");
  return {};
}
}  // namespace

int daemon_main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "keys") return keys_main(argc - 1, argv + 1);
  CLI::App app{"tidepoold: the Tidepool sandbox daemon (`tidepoold keys --help` manages API keys)"};
  std::string listen = "127.0.0.1:7070";
  std::string data_dir = "/var/lib/tidepool";
  std::string role = "all";
  std::string log_level = "info";
  std::string node = "n0";
  std::string agent = self_dir() + "/tp-agent";
  unsigned io_threads = 2;
  uint64_t image_budget_mb = 0;
  uint64_t layer_max_mb = 64 << 10;
  std::string socket_path = "/run/tidepool/tidepool.sock";
  bool insecure_tcp = false;
  std::vector<std::string> import_roots;
  // The microvm tier (src/runtime/microvm/): on when its assets are there.
  std::string microvm_assets;
  std::string microvm_templates = "on";
  std::string microvm_accel = "auto";
  uint32_t uid_first = node::UidRanges::kDefaultFirst;
  uint32_t uid_ranges = node::UidRanges::kDefaultCount;
  app.add_option("--listen", listen, "HOST:PORT to serve HTTP on (API keys required; '' = no TCP)")
      ->capture_default_str();
  app.add_option("--socket", socket_path,
                 "unix socket to serve HTTP on ('' = none); callers are known by uid")
      ->capture_default_str();
  app.add_flag("--insecure-tcp", insecure_tcp,
               "serve TCP without API keys (loopback addresses only): any local user may then use "
               "the daemon");
  app.add_option("--import-root", import_roots,
                 "directory under which admin API keys may name host paths (repeatable)");
  std::string step_retention = "24h";
  std::string trajectory_log = "on";
  bool stop_sandboxes_on_exit = false;
  FunctionFlags fn_flags;
  fn_flags.add_to(app);
  app.add_option("--data-dir", data_dir, "directory for state, images and sandboxes")
      ->capture_default_str();
  app.add_option("--role", role, "all (API + node + embedded store)")->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  app.add_option("--node", node, "this node's name; it prefixes every sandbox id")
      ->capture_default_str();
  app.add_option("--agent", agent, "path of the static tp-agent binary")->capture_default_str();
  std::string run_dir;
  app.add_option("--run-dir", run_dir,
                 "directory of the agents' sockets (live restore); default: /run/tidepool/<name> "
                 "when /run is a tmpfs, else <data-dir>/containers/run");
  app.add_option("--io-threads", io_threads,
                 "I/O threads: one runs the agents' sessions and the node's timers, and the HTTP "
                 "connections are spread over all of them, each connection on one thread")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  app.add_option("--image-budget-mb", image_budget_mb,
                 "total size of stored image layers; 0 = no budget")
      ->capture_default_str();
  app.add_option("--layer-max-mb", layer_max_mb, "largest unpacked layer accepted")
      ->capture_default_str();
  app.add_option("--step-retention", step_retention,
                 "how long a sandbox's step log (and its Idempotency-Keys) outlives the sandbox")
      ->capture_default_str();
  app.add_option("--trajectory-log", trajectory_log,
                 "on: every state-changing call on a sandbox, keyed or not, and its lifecycle "
                 "events are logged durably (docs/trajectory-log.md); off: only calls with an "
                 "Idempotency-Key are, as exactly-once needs")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--uid-base", uid_first,
                 "first host uid/gid of the sandboxes' ranges: sandbox k maps root to "
                 "uid-base + k*65536 (keep these ids unused on the host)")
      ->capture_default_str();
  app.add_option("--uid-ranges", uid_ranges,
                 "how many 65536-id ranges (so how many sandboxes at once); 0 = every sandbox "
                 "shares one range (per-user kernel limits are then shared)")
      ->capture_default_str();
  app.add_option("--microvm-assets", microvm_assets,
                 "kernel, initrd and host image of the microvm tier (scripts/microvm-assets.sh); "
                 "default: ../microvm beside this binary, the tier is off when they are missing");
  app.add_option("--microvm-templates", microvm_templates,
                 "on: microVMs start as copy-on-write clones of a booted template; off: cold boots")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--microvm-accel", microvm_accel, "auto (KVM when /dev/kvm opens), kvm or tcg")
      ->check(CLI::IsMember({"auto", "kvm", "tcg"}))
      ->capture_default_str();
  app.add_flag(
      "--stop-sandboxes-on-exit", stop_sandboxes_on_exit,
      "on SIGTERM/SIGINT stop every sandbox instead of leaving them running for the next daemon");
  // HTTP limits (src/api/http_server.h; SECURITY.md "API server limits").
  size_t max_connections = 0;
  size_t max_connections_per_client = 0;
  double idle_timeout = 60, header_timeout = 10, body_timeout = 30;
  uint64_t max_json_body_kb = 4096;
  uint64_t max_upload_mb = 1024;
  uint64_t max_body_memory_mb = 0;
  uint64_t max_spool_mb = 0;
  uint64_t spool_threshold_kb = 1024;
  uint64_t max_download_mb = Api::kDefaultMaxDownload >> 20;
  app.add_option("--max-connections", max_connections,
                 "open HTTP connections at most, TCP and unix socket together; 0 = half the "
                 "open-file limit, at most 32768 (the rest is left to sandboxes)")
      ->capture_default_str();
  app.add_option("--max-connections-per-client", max_connections_per_client,
                 "connections of one client (peer address on TCP, uid on the unix socket) at "
                 "most; 0 = half of --max-connections")
      ->capture_default_str();
  app.add_option("--idle-timeout", idle_timeout,
                 "seconds a connection may wait without sending a request before it is closed")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 86400.0));
  app.add_option("--header-timeout", header_timeout,
                 "seconds a request header may take from its first byte to its end")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 3600.0));
  app.add_option("--body-timeout", body_timeout,
                 "seconds a request body may go without sending a byte")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 3600.0));
  app.add_option("--max-json-body-kb", max_json_body_kb,
                 "largest JSON request body (every route but uploads)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20));
  app.add_option("--max-upload-mb", max_upload_mb,
                 "largest upload body (files, tar archives, image archives, process stdin)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20));
  app.add_option("--max-body-memory-mb", max_body_memory_mb,
                 "request bodies held in memory at once, over all connections (beyond: 503); "
                 "0 = a quarter of physical memory, at least --max-upload-mb")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 30));
  app.add_option("--max-spool-mb", max_spool_mb,
                 "uploads larger than --spool-threshold-kb are written to <data dir>/spool as "
                 "they arrive instead of memory; this bounds their bytes on disk at once, over "
                 "all connections (beyond: 503); 0 = a quarter of the data dir's free space at "
                 "start, at least --max-upload-mb")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 30));
  app.add_option("--spool-threshold-kb", spool_threshold_kb,
                 "uploads larger than this (or sent chunked) are spooled to disk")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 30));
  app.add_option("--max-download-mb", max_download_mb,
                 "largest file or tar download (a file's apparent size counts: sparse files "
                 "are sent with their holes as zeros); downloads stream, so this bounds what "
                 "one request sends, not the daemon's memory")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 30));
  uint64_t pool_budget_mb = 2048;
  app.add_option("--pool-budget-mb", pool_budget_mb,
                 "memory all warm pools together may hold (each pooled sandbox counted at "
                 "--pool-idle-kb)")
      ->capture_default_str();
  uint64_t pool_idle_kb = 1024;
  app.add_option("--pool-idle-kb", pool_idle_kb,
                 "what one idle pooled sandbox is counted at against --pool-budget-mb")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 30));
  size_t pool_refills = 1;
  app.add_option("--pool-refills", pool_refills,
                 "warm-pool refills in flight at once (none while a client's create runs)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{64}));
  uint32_t pool_quiet_ms = 10;
  app.add_option("--pool-quiet-ms", pool_quiet_ms,
                 "warm-pool refills wait until no sandbox request started or ended for this "
                 "long, unless the pool is down to a quarter of its target; so do (up to 1 s, "
                 "frozen meanwhile) the teardowns of sandboxes whose stop was answered ahead: "
                 "DELETE ?wait=false, an exec with \"remove\" (0: no wait)")
      ->capture_default_str()
      ->check(CLI::Range(uint32_t{0}, uint32_t{60000}));
  size_t deferred_teardowns = node::ManagerOptions{}.max_deferred_teardowns;
  app.add_option("--deferred-teardowns", deferred_teardowns,
                 "teardowns of stops answered ahead that may wait for clients to be quiet at "
                 "once (see --pool-quiet-ms; 0: every teardown runs at once)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{0}, size_t{100000}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  log::init(log_level);
  uint64_t nofile = raise_nofile();
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
  if (!listen.empty() && !parse_listen(listen, &host, &port))
    return die("--listen must be HOST:PORT, got '" + listen + "'");
  if (listen.empty() && socket_path.empty())
    return die("--listen '' and --socket '' leave nothing to serve on");
  if (insecure_tcp && !listen.empty() && !is_loopback(host))
    return die("--insecure-tcp is allowed only on a loopback address, not " + host);
  for (auto& r : import_roots) {
    std::error_code rec;
    auto c = std::filesystem::canonical(r, rec);
    if (rec || !std::filesystem::is_directory(c))
      return die("--import-root " + r + " is not a directory");
    r = c.string();
  }
  if (geteuid() != 0) return die("must run as root (it creates namespaces, cgroups and mounts)");
  if (access(agent.c_str(), X_OK) != 0) return die("agent binary not executable: " + agent);

  std::error_code ec;
  std::filesystem::create_directories(data_dir, ec);
  if (ec) return die("cannot create data dir " + data_dir + ": " + ec.message());
  chmod(data_dir.c_str(), 0711);
  data_dir = std::filesystem::canonical(data_dir).string();
  // Held until the process ends (sys/file_lock.h): before anything of the data dir is
  // opened, so that a second daemon on it stops here and leaves the first one's alone.
  auto data_lock = sys::lock_file(data_dir + "/tidepoold.lock");
  if (!data_lock)
    return die("data dir " + data_dir + " is in use: " + data_lock.error().message() +
               "; stop that tidepoold first or give this one another --data-dir");

  // Broken client connections must not kill the daemon.
  signal(SIGPIPE, SIG_IGN);

  auto store = control::sqlite::SqliteSandboxStore::open(data_dir + "/state.db");
  if (!store) return die(store.error().message());
  // Image records live in the same database file (its own connection).
  auto image_records = control::sqlite::SqliteImageRecordStore::open(data_dir + "/state.db");
  if (!image_records) return die("image records: " + image_records.error().message());

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
  copts.run_dir = run_dir.empty() ? runtime::default_run_dir(copts.cgroup_name) : run_dir;
  // Images (issue 4): layer store under the data dir, records in state.db. Opened
  // before the backend, which resolves a spec's layer digests through it.
  image::StoreOptions sopts;
  sopts.data_dir = data_dir;
  sopts.limits.uid_base = copts.uid_base;
  sopts.limits.max_bytes = layer_max_mb << 20;
  sopts.budget_bytes = image_budget_mb << 20;
  auto images = image::ImageStore::open(
      sopts, std::shared_ptr<control::ImageRecordStore>(std::move(*image_records)));
  if (!images) return die("image store: " + images.error().message());
  copts.layers = *images;
  if (uid_ranges > 0) {
    // Apart from the ids image files are stored as and from the builds' ids.
    auto v = node::UidRanges::validate(uid_first, uid_ranges,
                                       {{copts.uid_base, node::UidRanges::kSize},
                                        {image::kBuildIdBase, image::kBuildIdCount},
                                        {runtime::MicrovmOptions{}.default_uid_base, 2}});
    if (!v) return die(v.error().message());
    copts.ranges_first = uid_first;
    copts.ranges_ids = uint64_t{uid_ranges} * node::UidRanges::kSize;
  }
  auto backend = runtime::make_container_backend(copts);
  if (!backend) return die("container runtime: " + backend.error().message());

  runtime::Registry registry;
  if (auto r = registry.add(std::move(*backend)); !r) return die(r.error().message());
  {
    runtime::MicrovmOptions vopts;
    vopts.data_dir = data_dir;
    vopts.assets_dir = microvm_assets.empty()
                           ? std::filesystem::path(self_dir()).parent_path().string() + "/microvm"
                           : microvm_assets;
    vopts.cgroup_name = copts.cgroup_name;
    vopts.storage_uid_base = copts.uid_base;
    vopts.templates = microvm_templates == "on";
    vopts.accel = microvm_accel;
    vopts.layers = *images;
    auto vm = runtime::make_microvm_backend(vopts);
    if (vm) {
      if (auto r = registry.add(std::move(*vm)); !r) return die(r.error().message());
    } else if (!microvm_assets.empty()) {
      return die("microvm tier: " + vm.error().message());
    } else {
      spdlog::info("microvm tier off: {}", vm.error().message());
    }
  }

  // The node's io_context (agents, timers, the manager's callbacks) and one more per extra
  // I/O thread for HTTP connections. Each runs on a single thread: a request's handlers
  // then never hop between threads (with one io_context on several threads, asio wakes
  // another thread for every event, and a cross-CPU wake-up costs as much on a guest as
  // the rest of a small request).
  asio::io_context io;
  std::vector<std::unique_ptr<asio::io_context>> http_ios;
  for (unsigned i = 1; i < io_threads; ++i)
    http_ios.push_back(std::make_unique<asio::io_context>());
  Metrics metrics;
  node::ManagerOptions mopts;
  mopts.node_name = node;
  mopts.data_dir = data_dir;
  mopts.stop_on_exit = stop_sandboxes_on_exit;
  mopts.max_deferred_teardowns = deferred_teardowns;
  mopts.agent_connect = node::AgentClient::connect;
  std::shared_ptr<node::UidRanges> ranges;
  if (uid_ranges > 0) ranges = std::make_shared<node::UidRanges>(uid_first, uid_ranges);
  mopts.uid_ranges = ranges;
  // The trajectory log is opened after the manager (it asks the manager what is live);
  // the manager's lifecycle hooks reach it through `events` while it exists.
  node::TrajectoryEvents events;
  events.attach(mopts);
  node::SandboxManager mgr(io, registry, **store, metrics, std::move(mopts));
  Api api(mgr, metrics);
  api.set_tiers(registry.tiers());
  api.set_max_download(max_download_mb << 20);
  auto retention = node::StepLog::parse_duration(step_retention);
  if (!retention) return die("--step-retention: " + retention.error().message());
  bool every_call = trajectory_log == "on";
  // The logs of the sandboxes a previous run left running are read before anything is
  // served (recover() appends to them); those of ended ones, however many the retention
  // keeps, by a background thread after.
  auto unended = (*store)->list({.live_only = true, .include_pooled = true});
  if (!unended) return die("step log: " + unended.error().message());
  std::unordered_set<std::string> read_first;
  for (const auto& r : *unended) read_first.insert(r.id);
  auto steps = node::StepLog::open(
      {.data_dir = data_dir,
       .retention = *retention,
       .is_live =
           [&mgr](const std::string& id) {
             auto r = mgr.get(id);
             if (!r) return r.error().code != Code::kNotFound;
             return node::shown_live(r->state);
           },
       // Logs made ahead for new sandboxes (only with events: their created event is
       // what makes a log).
       .spares = every_call ? 32u : 0u,
       .make_id = [node] { return ids::new_sandbox_id(node); },
       .read_first =
           [first = std::move(read_first)](const std::string& id) { return first.count(id) > 0; }});
  if (!steps) return die("step log: " + steps.error().message());
  std::shared_ptr<node::StepLog> step_log = std::move(*steps);
  api.set_step_log(step_log);
  api.set_trajectory_log(every_call);
  events.set_log(step_log.get(), every_call);
  struct Unhook {
    node::TrajectoryEvents& e;
    ~Unhook() { e.set_log(nullptr, false); }
  } unhook{events};  // destroyed before step_log
  // Image references of creates: layer digests for the spec, defaults, a pin.
  mgr.set_image_resolver([st = *images](const std::string& ref) -> Result<node::ResolvedImage> {
    auto r = st->resolve(ref);
    if (!r) return std::unexpected(r.error());
    node::ResolvedImage img{r->digests, r->defaults.env, r->defaults.workdir, r->pin};
    auto ids = image::resolve_user(r->defaults.user, r->paths);
    if (!ids) return std::unexpected(ids.error());
    img.uid = ids->first;
    img.gid = ids->second;
    return img;
  });
  // After the resolver: adopted sandboxes resolve their images again (layers, pins).
  if (auto r = mgr.recover(); !r) return die("recover: " + r.error().message());
  // Keyed calls the previous run died answering (their commands' own outcomes were
  // recorded by recover()) are answered 503 (each logged), before anything is served.
  step_log->answer_interrupted();
  api.add_provider(std::make_shared<ImageRoutes>(*images));
  // The trajectory log's routes; a replay recreates a sandbox on its recorded layers,
  // or by its image reference while that still names exactly those.
  api.add_provider(std::make_shared<LogRoutes>(
      api, mgr, step_log,
      [st = *images](const std::string& ref) -> Result<std::vector<std::string>> {
        auto r = st->resolve(ref);
        if (!r) return std::unexpected(r.error());
        return r->digests;
      }));
  // The function tier (src/function/): its worker sandboxes are its own, made after
  // recover() (which removed any a crashed run left).
  auto fn = start_function_tier(fn_flags, io, api, metrics, registry.find("container"), ranges,
                                node, *images);
  if (!fn) return die("function tier: " + fn.error().message());
  // Templates, warm pools and jobs (node/pools.h, node/jobs.h): after recover(), so that
  // the pooled sandboxes it adopted go back to their pools.
  auto template_docs = control::sqlite::SqliteDocStore::open(data_dir + "/state.db", "templates");
  if (!template_docs) return die("templates: " + template_docs.error().message());
  auto job_docs = control::sqlite::SqliteDocStore::open(data_dir + "/state.db", "jobs");
  if (!job_docs) return die("jobs: " + job_docs.error().message());
  control::TemplateStore template_store(**template_docs);
  control::JobStore job_store(**job_docs);
  node::WarmPools::Options popts;
  popts.budget_mb = pool_budget_mb;
  popts.idle_cost_kb = pool_idle_kb;
  popts.refills_at_once = pool_refills;
  popts.quiet_s = pool_quiet_ms / 1000.0;
  node::WarmPools pools(mgr, template_store, metrics, popts);
  node::JobManager jobs(mgr, job_store, metrics, {});
  if (auto r = jobs.start(); !r) return die("jobs: " + r.error().message());
  if (auto r = pools.start(); !r) return die("warm pools: " + r.error().message());
  api.set_creator([&pools](node::CreateParams p, node::WarmPools::CreateCb cb) {
    pools.create(std::move(p), std::move(cb));
  });
  api.set_client_work([&pools](int d) { pools.client_work(d); });
  api.set_client_request([&pools] { pools.client_request(); });
  mgr.set_clients_busy([&pools] { return pools.busy_for_s(); });
  api.add_provider(std::make_shared<LifecycleRoutes>(pools, jobs));
  AuthOptions aopts;
  aopts.key_file = KeyFile::in_data_dir(data_dir);
  aopts.insecure_tcp = insecure_tcp;
  aopts.import_roots = import_roots;
  Auth auth(aopts);
  Handler inner = [&api](Request& req, std::shared_ptr<Responder> res) { api.handle(req, res); };
  Handler outer = [&auth, &inner](Request& req, std::shared_ptr<Responder> res) {
    auth.handle(req, res, inner);
  };
  if (max_connections == 0) max_connections = std::clamp<uint64_t>(nofile / 2, 16, 32768);
  if (max_connections_per_client == 0)
    max_connections_per_client = std::max<size_t>(1, max_connections / 2);
  ServerOptions sopts_http;
  sopts_http.gate = ConnectionGate::create(max_connections, max_connections_per_client);
  sopts_http.max_body_bytes = static_cast<size_t>(max_upload_mb << 20);
  size_t json_max = static_cast<size_t>(max_json_body_kb << 10);
  size_t fn_max = static_cast<size_t>(fn_flags.max_body_mb << 20);
  sopts_http.max_body_bytes = std::max(sopts_http.max_body_bytes, fn_max);
  sopts_http.body_limit = [json_max, fn_max, upload_max = static_cast<size_t>(max_upload_mb << 20)](
                              const std::string& method, const std::string& path) {
    if (function_body(method, path)) return fn_max;
    return Api::takes_upload(method, path) ? upload_max : json_max;
  };
  if (max_body_memory_mb == 0) {
    uint64_t ram = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                   static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    max_body_memory_mb = std::max<uint64_t>(ram / 4 >> 20, max_upload_mb);
  }
  sopts_http.body_budget = std::make_shared<BodyBudget>(max_body_memory_mb << 20);
  {
    auto sp = std::make_shared<SpoolOptions>();
    sp->dir = data_dir + "/spool";
    if (::mkdir(sp->dir.c_str(), 0700) != 0 && errno != EEXIST)
      return die("mkdir " + sp->dir + ": " + std::strerror(errno));
    if (max_spool_mb == 0) {
      struct statvfs vfs {};
      uint64_t free_mb = ::statvfs(sp->dir.c_str(), &vfs) == 0
                             ? static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize >> 20
                             : 0;
      max_spool_mb = std::max<uint64_t>(free_mb / 4, max_upload_mb);
    }
    sp->threshold = spool_threshold_kb << 10;
    sp->disk = std::make_shared<BodyBudget>(max_spool_mb << 20);
    sopts_http.spool = std::move(sp);
    sopts_http.spools = [](const std::string& method, const std::string& path) {
      return Api::takes_upload(method, path);
    };
  }
  {
    std::vector<asio::io_context*> ring{&io};
    for (auto& x : http_ios) ring.push_back(x.get());
    sopts_http.sessions = std::make_shared<IoRing>(std::move(ring));
  }
  sopts_http.check_head = [&auth](Request& head) { return auth.authenticate(head); };
  auto secs = [](double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); };
  sopts_http.idle_timeout = secs(idle_timeout);
  sopts_http.header_timeout = secs(header_timeout);
  sopts_http.body_timeout = secs(body_timeout);
  spdlog::info(
      "http: up to {} connections ({} per client; open-file limit {}), JSON bodies up to {} KiB, "
      "uploads up to {} MiB ({} MiB in memory at once; above {} KiB spooled to disk, {} MiB at "
      "once), downloads up to {} MiB",
      sopts_http.gate->max_total(), sopts_http.gate->max_per_client(), nofile, max_json_body_kb,
      max_upload_mb, max_body_memory_mb, spool_threshold_kb, max_spool_mb, max_download_mb);
  HttpServer server(io, outer, sopts_http);
  HttpServer unix_server(io, outer, sopts_http);
  if (!listen.empty()) {
    if (auto r = server.start(host, port); !r) return die(r.error().message());
    if (insecure_tcp)
      spdlog::warn(
          "--insecure-tcp: {}:{} accepts requests without an API key; every local user can use the "
          "daemon",
          host, server.port());
  }
  if (!socket_path.empty()) {
    if (auto r = secure_socket(socket_path); !r) return die(r.error().message());
    // Created with no access for anyone but root until owner and mode are set.
    mode_t old = ::umask(0177);
    auto r = unix_server.start_unix(socket_path);
    ::umask(old);
    if (!r) return die(r.error().message());
    if (auto o = own_socket(socket_path); !o) return die(o.error().message());
  }
  mgr.start();

  // Joined before return: it uses mgr and io, which must outlive it (detached, it raced
  // with their destructors; ThreadSanitizer, make test-tsan).
  std::thread stopper;
  // Keeps io.run() going while the stopper needs the io threads (its stops answer
  // through them): once the listeners and the manager's timer are gone the
  // io_context may have no work left and would return before the stops complete.
  auto keep_running = asio::make_work_guard(io);
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](boost::system::error_code, int sig) {
    spdlog::info("signal {}: shutting down", sig);
    server.stop();
    unix_server.stop();
    // Destroying sandboxes blocks; run it off the io threads, which it needs.
    stopper = std::thread([&] {
      if (*fn) (*fn)->shutdown();  // its workers are not adopted by the next daemon
      pools.shutdown();
      jobs.shutdown();
      mgr.shutdown();
      keep_running.reset();
      io.stop();
      for (auto& x : http_ios) x->stop();
    });
  });

  std::string where;
  if (!listen.empty()) where = "http://" + host + ":" + std::to_string(server.port());
  if (!socket_path.empty()) where += (where.empty() ? "unix:" : " and unix:") + socket_path;
  std::cout << "tidepoold ready on " << where << " (data dir " << data_dir << ", node " << node
            << ")" << std::endl;
  std::vector<std::thread> threads;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> http_guards;
  for (auto& x : http_ios) {
    http_guards.push_back(asio::make_work_guard(*x));
    threads.emplace_back([ctx = x.get()] { ctx->run(); });
  }
  io.run();
  for (auto& t : threads) t.join();
  // The io threads are joined, so the handler that started the stopper has finished.
  if (stopper.joinable()) stopper.join();
  spdlog::info("stopped");
  return 0;
}

}  // namespace tp::api
