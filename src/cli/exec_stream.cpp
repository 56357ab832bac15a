// stream_exec: one streamed command, its output copied to this process as it arrives.
#include <unistd.h>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "cli/parse.h"

namespace tp::cli {
namespace {

int64_t int_field(const boost::json::object& o, std::string_view key, int64_t def) {
  const auto* v = o.if_contains(key);
  if (v == nullptr) return def;
  if (v->is_int64()) return v->get_int64();
  if (v->is_uint64()) return static_cast<int64_t>(v->get_uint64());
  if (v->is_double()) return static_cast<int64_t>(v->get_double());
  return def;
}

bool bool_field(const boost::json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  return v != nullptr && v->is_bool() && v->get_bool();
}

std::string string_field(const boost::json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  return v != nullptr && v->is_string() ? std::string(v->get_string()) : std::string();
}

void note(const std::string& text) {
  std::fprintf(stderr, "tidepool: %s\n", text.c_str());
  std::fflush(stderr);
}

// Copies command output to our fds; once a reader goes away (EPIPE) that stream is
// dropped but the command is still followed to its end for the exit code.
class OutputSink {
 public:
  Result<void> write(int fd, std::string_view b64) {
    auto data = base64_decode(b64);
    if (!data)
      return fail(Code::kInternal, "tidepoold sent bad output data: " + data.error().message());
    bool& broken = fd == STDOUT_FILENO ? out_broken_ : err_broken_;
    if (!broken && !write_all(fd, *data)) broken = true;
    return {};
  }

 private:
  bool out_broken_ = false;
  bool err_broken_ = false;
};

// The end of a command as the daemon reports it (an ExecResult or an "exit" event).
int finish(const boost::json::object& end) {
  bool timed_out = bool_field(end, "timed_out");
  if (timed_out) note("command timed out; all its processes were killed");
  if (bool_field(end, "oom_killed")) note("command was killed: out of memory");
  if (bool_field(end, "stdout_truncated")) note("stdout was truncated at the output limit");
  if (bool_field(end, "stderr_truncated")) note("stderr was truncated at the output limit");
  return exit_status_for(int_field(end, "exit_code", -1), int_field(end, "signal", 0), timed_out);
}

}  // namespace

int exit_status_for(int64_t exit_code, int64_t signal, bool timed_out) {
  if (timed_out) return kExitTimedOut;
  if (signal > 0 && signal < 128) return kExitSignalBase + static_cast<int>(signal);
  if (exit_code >= 0 && exit_code <= 255) return static_cast<int>(exit_code);
  return kExitError;
}

Result<int> stream_exec(HttpClient& client, const std::string& id,
                        const boost::json::object& request, bool* removed) {
  const std::string body = boost::json::serialize(request);
  OutputSink out;
  NdjsonSplitter splitter;
  bool whole_json = false;  // a daemon may answer with one ExecResult instead of a stream
  std::string whole;
  std::optional<int> exit_status;
  std::optional<Error> stream_error;

  auto on_line = [&](std::string_view line) -> Result<void> {
    boost::system::error_code ec;
    boost::json::value v = boost::json::parse(line, ec);
    if (ec || !v.is_object())
      return fail(Code::kInternal, "tidepoold sent a malformed exec stream line");
    const auto& o = v.get_object();
    std::string type = string_field(o, "type");
    if (type == "stdout" || type == "stderr") {
      if (exit_status || stream_error) return {};
      return out.write(type == "stdout" ? STDOUT_FILENO : STDERR_FILENO, string_field(o, "data"));
    }
    if (type == "exit") {
      if (!exit_status && !stream_error) exit_status = finish(o);
    } else if (type == "error") {
      std::string code = string_field(o, "code");
      std::string msg = string_field(o, "message");
      if (!exit_status && !stream_error) {
        stream_error = Error{code_from_name(code), 0, code.empty() ? msg : code + ": " + msg};
      }
    } else if (type == "removed" && removed != nullptr) {
      *removed = !o.contains("code");  // with a code: the stop failed
    }
    // "started" and types added later carry nothing this client needs.
    return {};
  };

  auto r = client.stream(
      Method::kPost, sandbox_path(id) + "/exec", body, "application/json",
      [&](int, std::string_view ctype) -> Result<void> {
        whole_json = ctype.starts_with("application/json");
        return {};
      },
      [&](std::string_view piece) -> Result<void> {
        if (whole_json) {
          whole.append(piece);
          return {};
        }
        return splitter.feed(piece, on_line);
      });
  if (!r) return std::unexpected(r.error());

  if (whole_json) {
    boost::system::error_code ec;
    boost::json::value v = boost::json::parse(whole, ec);
    if (ec || !v.is_object()) return fail(Code::kInternal, "tidepoold sent an invalid exec result");
    const auto& o = v.get_object();
    TP_TRY(out.write(STDOUT_FILENO, string_field(o, "stdout")));
    TP_TRY(out.write(STDERR_FILENO, string_field(o, "stderr")));
    return finish(o);
  }
  if (!splitter.pending().empty()) {
    std::string last = splitter.pending();
    TP_TRY(on_line(last));
  }
  if (stream_error) return std::unexpected(*stream_error);
  if (!exit_status) return fail(Code::kUnavailable, "exec stream ended without an exit status");
  return *exit_status;
}

}  // namespace tp::cli
