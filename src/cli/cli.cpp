#include "cli/cli.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "cli/commands.h"
#include "cli/parse.h"

namespace tp::cli {

std::string Context::url_text() const {
  if (!url_flag.empty()) return url_flag;
  const char* env = std::getenv("TIDEPOOL_URL");
  if (env != nullptr && *env != '\0') return env;
  const char* sock = std::getenv("TIDEPOOL_SOCKET");
  std::string path = sock != nullptr && *sock != '\0' ? sock : kDefaultSocket;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return "unix:" + path;
  return kDefaultUrl;
}

std::string Context::api_key() const {
  if (!api_key_flag.empty()) return api_key_flag;
  const char* env = std::getenv("TIDEPOOL_API_KEY");
  return env != nullptr ? env : "";
}

Result<HttpClient*> Context::client() {
  if (!client_) {
    auto c = new_client();
    if (!c) return std::unexpected(c.error());
    client_ = std::move(*c);
  }
  return client_.get();
}

Result<std::unique_ptr<HttpClient>> Context::new_client() const {
  auto url = Url::parse(url_text());
  if (!url) return std::unexpected(url.error());
  auto c = std::make_unique<HttpClient>(std::move(*url));
  c->set_api_key(api_key());
  return c;
}

int report(const Error& e) {
  std::string msg = e.message();
  // Exactly one line, whatever the daemon put in its message.
  for (char& c : msg) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::fprintf(stderr, "tidepool: %s\n", msg.c_str());
  std::fflush(stderr);
  return kExitError;
}

int usage_error(const std::string& message) {
  report(Error{Code::kInvalidArgument, 0, message});
  return kExitUsage;
}

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

Result<std::string> read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return sys_fail("open " + path);
  auto r = read_all(fd, path);
  ::close(fd);
  return r;
}

std::string str_of(const boost::json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  return v && v->is_string() ? std::string(v->get_string()) : std::string();
}

Result<std::string> read_all(int fd, const std::string& what) {
  std::string out;
  char buf[64 * 1024];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return sys_fail("reading " + what);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string json_string(const boost::json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  return v != nullptr && v->is_string() ? std::string(v->get_string()) : std::string();
}

std::optional<int64_t> json_int(const boost::json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  if (v == nullptr) return std::nullopt;
  if (v->is_int64()) return v->get_int64();
  if (v->is_uint64()) return static_cast<int64_t>(v->get_uint64());
  if (v->is_double()) return static_cast<int64_t>(v->get_double());
  return std::nullopt;
}

std::string format_table(const std::vector<std::vector<std::string>>& rows) {
  std::string out;
  if (rows.empty()) return out;
  std::vector<size_t> width(rows.front().size(), 0);
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size() && i < width.size(); ++i)
      width[i] = std::max(width[i], r[i].size());
  }
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size() && i < width.size())
        line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

void print_table(const std::vector<std::vector<std::string>>& rows) {
  std::string text = format_table(rows);
  std::fwrite(text.data(), 1, text.size(), stdout);
}

std::string sandbox_path(const std::string& id) {
  // Ids are DNS-label safe, but a typo must not become a different route.
  std::string enc = url_encode(id);
  std::string safe;
  for (char c : enc) {
    if (c == '/')
      safe += "%2F";
    else
      safe += c;
  }
  return "/v1/sandboxes/" + safe;
}

namespace {

struct Command {
  std::string_view name;
  Action (*add)(CLI::App&, Context&);
};

constexpr Command kCommands[] = {
    {"create", add_create},   {"run", add_run},     {"exec", add_exec},
    {"cp", add_cp},           {"ls", add_ls},       {"rm", add_rm},
    {"version", add_version}, {"image", add_image}, {"log", add_log},
    {"replay", add_replay},   {"fn", add_fn},       {"templates", add_templates},
    {"pools", add_pools},     {"jobs", add_jobs},   {"pause", add_pause},
    {"resume", add_resume},   {"top", add_top},
};

// The first word of the line that is neither an option of the root nor its value: the
// command's name, or "" (none, or --help/--version before it).
std::string_view command_word(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--url" || a == "--api-key") {
      ++i;
      continue;
    }
    if (a.starts_with("--url=") || a.starts_with("--api-key=")) continue;
    if (a.starts_with("-")) return "";
    return a;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  // A closed pipe (`tidepool ... | head`) must give a write error, not kill us before
  // `run` has removed its sandbox.
  std::signal(SIGPIPE, SIG_IGN);

  Context ctx;
  CLI::App app{
      "tidepool: command-line client of tidepoold, the Tidepool sandbox daemon.\n"
      "The daemon is found through --url, else $TIDEPOOL_URL, else the unix socket\n"
      "($TIDEPOOL_SOCKET, else " +
          std::string(kDefaultSocket) + ") when it exists, else " + std::string(kDefaultUrl) +
          ".\nOver TCP, --api-key or $TIDEPOOL_API_KEY is sent as a bearer token.",
      "tidepool"};
  app.set_version_flag("--version", "tidepool " TP_VERSION);
  app.add_option("--url", ctx.url_flag, "daemon URL (overrides $TIDEPOOL_URL)")->type_name("URL");
  app.add_option("--api-key", ctx.api_key_flag, "API key for TCP (overrides $TIDEPOOL_API_KEY)")
      ->type_name("KEY");
  app.require_subcommand(1);
  app.fallthrough();  // `tidepool ls --url U` as well as `tidepool --url U ls`
  app.footer(
      "Exit status: 0 ok, 1 error (one line on stderr), 2 usage error; run, exec and fn run\n"
      "exit with the command's code (128+N if killed by signal N, 124 on timeout); replay\n"
      "exits 3 when a step diverged.");

  // Only the command named on the line is built when there is one (its options are most
  // of what a start costs); the help, a missing or an unknown command get them all.
  const std::string_view named = command_word(argc, argv);
  const bool known = std::any_of(std::begin(kCommands), std::end(kCommands),
                                 [&](const Command& c) { return c.name == named; });
  std::vector<std::pair<CLI::App*, Action>> actions;
  for (const Command& c : kCommands) {
    if (known && c.name != named) continue;
    Action a = c.add(app, ctx);
    actions.emplace_back(app.get_subcommand(std::string(c.name)), std::move(a));
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    return usage_error(std::string(e.what()) + " (see --help)");
  }

  for (auto& [sub, action] : actions) {
    if (sub->parsed()) {
      if (auto url = Url::parse(ctx.url_text()); !url) return usage_error(url.error().message());
      return action();
    }
  }
  return usage_error("no command given (see --help)");
}

}  // namespace tp::cli
