#include "function/zygote_codec.h"

#include <boost/json.hpp>
#include <cstring>

#include "common/json_util.h"

namespace tp::function {

std::string_view verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kOk:
      return "ok";
    case Verdict::kRuntimeError:
      return "runtime_error";
    case Verdict::kTimeLimit:
      return "time_limit";
    case Verdict::kMemoryLimit:
      return "memory_limit";
    case Verdict::kOutputLimit:
      return "output_limit";
    case Verdict::kCompileError:
      return "compile_error";
  }
  return "runtime_error";
}

Verdict verdict_of(const StepResult& s) {
  if (s.timed_out) return Verdict::kTimeLimit;
  if (s.oom_killed) return Verdict::kMemoryLimit;
  if (s.output_limit) return Verdict::kOutputLimit;
  if (!s.error.empty() || s.signal != 0 || !s.exit_code || *s.exit_code != 0)
    return Verdict::kRuntimeError;
  return Verdict::kOk;
}

namespace zygote {

namespace json = boost::json;

namespace {

void put32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put64(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t get32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
uint64_t get64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

json::array strings(const std::vector<std::string>& v) {
  json::array a;
  for (const auto& s : v) a.emplace_back(s);
  return a;
}
json::object string_map(const std::map<std::string, std::string>& m) {
  json::object o;
  for (const auto& [k, v] : m) o[k] = v;
  return o;
}

}  // namespace

std::string encode_frame(In type, uint32_t call, std::string_view meta, std::string_view payload) {
  std::string s;
  s.reserve(kInHeader + meta.size() + payload.size());
  put32(&s, static_cast<uint32_t>(type));
  put32(&s, call);
  put64(&s, payload.size());
  put32(&s, static_cast<uint32_t>(meta.size()));
  s.append(meta);
  s.append(payload);
  return s;
}

std::string encode_meta(const CallMeta& m) {
  json::object o;
  o["flavor"] = m.flavor;
  o["timeout_ms"] = m.timeout_ms;
  o["memory_bytes"] = m.memory_bytes;
  o["pids"] = m.pids;
  o["output_bytes"] = m.output_bytes;
  o["files_bytes"] = m.files_bytes;
  return json::serialize(o);
}

std::string encode_payload(const ChildRequest& r) {
  json::object o;
  o["mode"] = r.mode;
  o["argv"] = strings(r.argv);
  o["env"] = string_map(r.env);
  o["cwd"] = r.cwd;
  json::array files;
  size_t total = 0;
  for (const auto& f : r.files) {
    json::object e;
    e["path"] = f.path;
    e["size"] = f.data.size();
    e["mode"] = f.mode;
    files.emplace_back(std::move(e));
    total += f.data.size();
  }
  o["files"] = std::move(files);
  o["fetch"] = strings(r.fetch);
  o["fetch_bytes"] = r.fetch_bytes;
  if (r.cpu_seconds) o["cpu_seconds"] = r.cpu_seconds;
  o["nofile"] = r.nofile;
  // Paths, argv and env may hold any bytes: the child's JSON parser needs valid UTF-8.
  std::string head = json_util::serialize_utf8(o);
  std::string s;
  s.reserve(4 + head.size() + total + r.stdin_data.size());
  put32(&s, static_cast<uint32_t>(head.size()));
  s += head;
  for (const auto& f : r.files) s += f.data;
  s += r.stdin_data;
  return s;
}

std::string encode_init(const InitConfig& c) {
  json::object o;
  o["seccomp"] = json_util::base64_encode(c.seccomp_bpf);
  o["uid_base"] = c.uid_base;
  o["max_children"] = c.max_children;
  json::object warm;
  for (const auto& [k, v] : c.warm) warm[k] = v;
  o["warm"] = std::move(warm);
  o["scratch_bytes"] = c.scratch_bytes;
  o["scratch_inodes"] = c.scratch_inodes;
  o["shm_bytes"] = c.shm_bytes;
  o["private_dir"] = c.private_dir;
  o["preload"] = strings(c.preload);
  json::object langs;
  for (const auto& [k, p] : c.prestart) {
    json::object l;
    l["prestart"] = strings(p.argv);
    l["env"] = string_map(p.env);
    langs[k] = std::move(l);
  }
  o["languages"] = std::move(langs);
  return json::serialize(o);
}

Result<void> FrameDecoder::feed(std::string_view bytes, const Sink& sink) {
  if (broken_) return std::unexpected(*broken_);
  buf_.append(bytes);
  size_t off = 0;
  while (buf_.size() - off >= kOutHeader) {
    const char* p = buf_.data() + off;
    uint32_t type = get32(p);
    uint32_t call = get32(p + 4);
    uint64_t len = get64(p + 8);
    if (type < static_cast<uint32_t>(Out::kReady) || type > static_cast<uint32_t>(Out::kLog) ||
        len > kMaxOutFrame) {
      broken_ = Error{Code::kInternal, 0,
                      "zygote protocol: frame type " + std::to_string(type) + ", length " +
                          std::to_string(len)};
      buf_.clear();
      return std::unexpected(*broken_);
    }
    if (buf_.size() - off - kOutHeader < len) break;
    sink(static_cast<Out>(type), call, std::string_view(p + kOutHeader, len));
    off += kOutHeader + len;
  }
  buf_.erase(0, off);
  return {};
}

Result<ExitInfo> parse_exit(std::string_view text) {
  auto o = json_util::parse_object(text);
  if (!o) return std::unexpected(o.error());
  ExitInfo e;
  if (const auto* c = o->if_contains("exit_code"); c && c->is_int64()) e.exit_code = c->as_int64();
  auto num = [&](const char* k) -> uint64_t {
    const auto* v = o->if_contains(k);
    if (!v) return 0;
    if (v->is_uint64()) return v->as_uint64();
    if (v->is_int64() && v->as_int64() > 0) return static_cast<uint64_t>(v->as_int64());
    return 0;
  };
  auto flag = [&](const char* k) {
    const auto* v = o->if_contains(k);
    return v && v->is_bool() && v->as_bool();
  };
  e.signal = static_cast<int>(num("signal"));
  e.wall_us = num("wall_us");
  e.cpu_us = num("cpu_us");
  e.peak_bytes = num("peak_bytes");
  e.oom_kills = num("oom_kills");
  e.timed_out = flag("timed_out");
  e.output_limit = flag("output_limit");
  return e;
}

Result<FilesStream> parse_files(std::string_view data, FilesStream* partial) {
  FilesStream fs;
  constexpr size_t kRec = 13;
  size_t off = 0;
  auto bad = [&](const std::string& why) -> Result<FilesStream> {
    if (partial) *partial = fs;
    return fail(Code::kInvalidArgument, "files stream: " + why);
  };
  while (off < data.size()) {
    if (data.size() - off < kRec) return bad("truncated record header");
    const char* p = data.data() + off;
    auto kind = static_cast<uint8_t>(p[0]);
    uint32_t name_len = get32(p + 1);
    uint64_t len = get64(p + 5);
    off += kRec;
    if (name_len > 4096 || data.size() - off < name_len || data.size() - off - name_len < len)
      return bad("record longer than the stream");
    std::string name(data.substr(off, name_len));
    std::string_view body = data.substr(off + name_len, len);
    off += name_len + len;
    switch (kind) {
      case 1:
        fs.files.push_back(File{name, std::string(body), 0644});
        break;
      case 2:
        fs.missing.push_back(name);
        break;
      case 3: {
        auto o = json_util::parse_object(body);
        if (!o) return bad("status record: " + o.error().message());
        fs.has_status = true;
        if (const auto* c = o->if_contains("exit_code"); c && c->is_int64())
          fs.status_exit_code = c->as_int64();
        if (const auto* s = o->if_contains("signal"); s && s->is_int64())
          fs.status_signal = static_cast<int>(s->as_int64());
        if (const auto* c = o->if_contains("cpu_us"); c && c->is_int64() && c->as_int64() >= 0)
          fs.status_cpu_us = static_cast<uint64_t>(c->as_int64());
        break;
      }
      case 4:
        fs.error = json_util::to_valid_utf8(body.substr(0, 4096));
        break;
      default:
        return bad("record kind " + std::to_string(kind));
    }
  }
  return fs;
}

StepResult step_result(const ExitInfo& exit, std::string out, std::string err, bool out_cut,
                       bool err_cut, const FilesStream& files) {
  StepResult s;
  s.stdout_data = std::move(out);
  s.stderr_data = std::move(err);
  s.stdout_truncated = out_cut;
  s.stderr_truncated = err_cut;
  s.wall_us = exit.wall_us;
  s.cpu_us = exit.cpu_us;
  s.peak_memory_bytes = exit.peak_bytes;
  s.timed_out = exit.timed_out;
  s.oom_killed = exit.oom_kills > 0;
  s.output_limit = exit.output_limit;
  // pid 1 supervises the program (pid 2): its report is the program's status, unless
  // pid 1 itself was killed (a limit, which kills the whole namespace).
  if (files.has_status && exit.signal == 0) {
    s.exit_code = files.status_exit_code;
    s.signal = files.status_signal;
    if (files.status_cpu_us) s.cpu_us = *files.status_cpu_us;
  } else {
    s.exit_code = exit.exit_code;
    s.signal = exit.signal;
  }
  s.files = files.files;
  s.missing = files.missing;
  s.error = files.error;
  s.verdict = verdict_of(s);
  return s;
}

}  // namespace zygote
}  // namespace tp::function
