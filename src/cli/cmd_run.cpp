// tidepool run: create a sandbox, run one command in it with streamed output, remove
// the sandbox (always: on success, on error, on Ctrl-C or SIGTERM), and exit with the
// command's exit code. The exec asks the daemon to remove the sandbox when the command
// ends (one request fewer, and a client killed with SIGKILL leaves nothing behind);
// when the stream did not say it was removed, a DELETE follows.
#include <signal.h>
#include <sys/socket.h>

#include <array>
#include <atomic>
#include <cmath>
#include <optional>

#include "cli/commands.h"

namespace tp::cli {
namespace {

// Signal state of `run`. The handler only sets a flag and shuts down the socket of the
// exec stream (shutdown(2) is async-signal-safe), which wakes the blocked read; the
// main thread then removes the sandbox. Handlers use SA_RESTART so that the create
// and delete calls are not cut short: a cut create could leave a sandbox we do not know.
std::atomic<int> g_signal{0};
std::atomic<int> g_stream_fd{-1};

void on_signal(int sig) {
  g_signal.store(sig);
  int fd = g_stream_fd.load();
  if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

class SignalGuard {
 public:
  SignalGuard() {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~SignalGuard() {
    for (size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &old_[i], nullptr);
  }
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;

 private:
  static constexpr std::array<int, 3> kSignals{SIGINT, SIGTERM, SIGHUP};
  std::array<struct sigaction, 3> old_{};
};

// Without --ttl, a sandbox of `run` lives a little past the command's timeout, so that a
// client killed with SIGKILL does not leave it behind for the daemon's default hour.
constexpr int64_t kRunTtlMarginSeconds = 60;

}  // namespace

Action add_run(CLI::App& root, Context& ctx) {
  struct State {
    CreateFlags create;
    ExecFlags exec;
  };
  auto st = std::make_shared<State>();
  CLI::App* sub = root.add_subcommand(
      "run",
      "Create a sandbox, run one command in it, remove it: tidepool run [flags] -- CMD ARGS...");
  st->create.add_to(sub);
  st->exec.add_to(sub, /*with_env=*/false);
  sub->add_option("cmd", st->exec.cmd, "command and arguments (after --)")->type_name("CMD");

  return [st, &ctx]() -> int {
    st->exec.env = st->create.env;  // --env applies to the command as well as the sandbox
    auto create_req = st->create.to_request();
    if (!create_req) return usage_error(create_req.error().message());
    auto exec_req = st->exec.to_request();
    if (!exec_req) {
      return exec_req.error().code == Code::kInvalidArgument
                 ? usage_error(exec_req.error().message())
                 : report(exec_req.error());
    }
    if (!create_req->contains("ttl_seconds")) {
      if (const auto* t = exec_req->if_contains("timeout"); t && t->is_double()) {
        (*create_req)["ttl_seconds"] =
            static_cast<int64_t>(std::ceil(t->get_double())) + kRunTtlMarginSeconds;
      }
    }

    auto client = ctx.client();
    if (!client) return report(client.error());
    SignalGuard signals;

    boost::json::value body(std::move(*create_req));
    auto created = (*client)->call_json(Method::kPost, "/v1/sandboxes", &body);
    if (!created) return report(created.error());
    const auto* idv = created->is_object() ? created->get_object().if_contains("id") : nullptr;
    if (idv == nullptr || !idv->is_string()) {
      return report(Error{Code::kInternal, 0, "tidepoold answered without a sandbox id"});
    }
    const std::string id(idv->get_string());

    int rc = kExitError;
    std::optional<Error> failure;
    // The daemon removes the sandbox when the command ends ("remove"), whatever ends
    // it, and says so in the stream's last event; without that word (the stream was
    // cut, a signal came) or when it says the stop failed, this process removes it below.
    (*exec_req)["remove"] = true;
    bool removed_by_daemon = false;
    if (g_signal.load() == 0) {
      // The stream reuses the create's keep-alive connection (one connect per run);
      // a signal may cut it, and the removal below then takes a fresh one.
      Result<void> c;
      if ((*client)->native_handle() < 0) c = (*client)->connect();
      if (!c) {
        failure = c.error();
      } else {
        g_stream_fd.store((*client)->native_handle());
        // Checked after publishing the fd: a signal either saw the fd or is seen here.
        if (g_signal.load() == 0) {
          auto code = stream_exec(**client, id, *exec_req, &removed_by_daemon);
          if (code)
            rc = *code;
          else
            failure = code.error();
        }
        g_stream_fd.store(-1);
      }
    }
    const int sig = g_signal.load();
    if (sig != 0) {
      failure.reset();  // the cut stream is our doing, not an error to show
      rc = kExitSignalBase + sig;
    }
    if (failure) rc = report(*failure);

    // Removed by the daemon; else (not said, or its stop failed) a DELETE, whose error
    // is the one to show.
    if (removed_by_daemon) return rc;
    std::unique_ptr<HttpClient> fresh;
    HttpClient* remover = *client;
    if (sig != 0) {
      if (auto f = ctx.new_client()) {
        fresh = std::move(*f);
        remover = fresh.get();
      }
    }
    // Answered once its stop is durable: the teardown (about 2 ms) goes on in the
    // daemon while this process exits (api/openapi.yaml, DELETE ?wait=false).
    auto removed = remover->call_json(Method::kDelete, sandbox_path(id) + "?wait=false");
    if (!removed && removed.error().code != Code::kNotFound) {
      report(Error{removed.error().code, 0,
                   "could not remove sandbox " + id + ": " + removed.error().message()});
      if (rc == kExitOk) rc = kExitError;
    }
    return rc;
  };
}

}  // namespace tp::cli
