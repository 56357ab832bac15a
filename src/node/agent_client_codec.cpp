#include "node/agent_client_codec.h"

#include <algorithm>

namespace tp::node::codec {

using proto::Message;
using proto::MsgType;
using proto::Tag;

Result<std::vector<std::string>> exec_frames(const ExecRequest& req, uint32_t id) {
  Message m(MsgType::kExec, id);
  for (const auto& a : req.argv) m.add(Tag::kArg, a);
  for (const auto& e : req.env) m.add(Tag::kEnv, e);
  m.add(Tag::kCwd, req.cwd.empty() ? std::string_view("/") : std::string_view(req.cwd));
  m.add_u64(Tag::kUid, req.uid);
  m.add_u64(Tag::kGid, req.gid);
  if (req.timeout_ms) m.add_u64(Tag::kTimeoutMs, req.timeout_ms);
  m.add_u64(Tag::kOutputLimit, req.output_limit);
  if (!req.meta.empty()) m.add(Tag::kMeta, req.meta);
  if (req.window) m.add_u64(Tag::kWindow, req.window);
  if (req.quiet_start) m.add_bool(Tag::kQuietStart, true);
  std::string_view in = req.stdin_data;
  std::string_view first = in.substr(0, std::min<size_t>(in.size(), proto::kMaxChunk));
  std::string_view rest = in.substr(first.size());
  if (!first.empty()) m.add(Tag::kData, first);
  // Stdin that does not fit the kExec frame follows in kStdin frames, so the
  // agent must keep stdin open for them.
  m.add_bool(Tag::kStdinOpen, req.stdin_open || !rest.empty());
  std::vector<std::string> frames;
  frames.push_back(proto::encode(m));
  if (req.meta.size() > proto::kMaxMeta)
    return fail(Code::kPayloadTooLarge,
                "exec: meta exceeds " + std::to_string(proto::kMaxMeta) + " bytes");
  if (frames[0].size() > proto::kMaxFrame)
    return fail(Code::kPayloadTooLarge, "exec: argv and env exceed one frame");
  if (!rest.empty()) {
    auto more = stdin_frames(id, rest, !req.stdin_open);
    for (auto& f : more) frames.push_back(std::move(f));
  }
  return frames;
}

std::vector<std::string> stdin_frames(uint32_t id, std::string_view data, bool eof) {
  std::vector<std::string> out;
  size_t off = 0;
  do {
    size_t n = std::min<size_t>(data.size() - off, proto::kMaxChunk);
    Message m(MsgType::kStdin, id);
    if (n) m.add(Tag::kData, data.substr(off, n));
    off += n;
    if (eof && off == data.size()) m.add_bool(Tag::kEof, true);
    out.push_back(proto::encode(m));
  } while (off < data.size());
  return out;
}

Error error_from(const Message& m) {
  Error e;
  e.code = code_from_name(m.str(Tag::kErrCode, "internal"));
  e.sys_errno = static_cast<int>(m.u64(Tag::kErrno, 0));
  e.context = "agent: " + m.str(Tag::kMessage);
  return e;
}

ExecResult exec_result_from(const Message& m) {
  ExecResult r;
  r.exit_code = m.i64(Tag::kExitCode, -1);
  r.signal = static_cast<int>(m.u64(Tag::kTermSignal, 0));
  r.wall_us = m.u64(Tag::kWallUs);
  r.max_rss_kb = m.u64(Tag::kMaxRssKb);
  r.timed_out = m.flag(Tag::kTimedOut);
  r.stdout_truncated = m.flag(Tag::kStdoutTruncated);
  r.stderr_truncated = m.flag(Tag::kStderrTruncated);
  r.pid = static_cast<uint32_t>(m.u64(Tag::kPid, 0));
  return r;
}

std::string base_name(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  if (path == "/" || path.empty()) return std::string(path.empty() ? "" : "/");
  size_t slash = path.rfind('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

FileEntry entry_from(const std::vector<std::pair<Tag, std::string>>& fields,
                     std::string_view fallback_path) {
  Message m;
  m.fields = fields;
  FileEntry e;
  e.path = m.has(Tag::kPath) ? m.str(Tag::kPath) : std::string(fallback_path);
  e.name = m.has(Tag::kName) ? m.str(Tag::kName) : base_name(e.path);
  e.type = m.str(Tag::kFileType, "other");
  e.size = m.u64(Tag::kSize);
  e.mode = static_cast<uint32_t>(m.u64(Tag::kMode));
  e.mtime_ns = m.u64(Tag::kMtimeNs);
  e.uid = static_cast<uint32_t>(m.u64(Tag::kFileUid));
  e.gid = static_cast<uint32_t>(m.u64(Tag::kFileGid));
  e.link_target = m.str(Tag::kLinkTarget);
  return e;
}

}  // namespace tp::node::codec
