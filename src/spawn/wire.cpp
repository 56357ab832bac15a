#include "spawn/wire.h"

#include <sched.h>

#include <cstring>

namespace tp::spawn {
namespace {

struct Header {
  uint32_t magic;
  uint32_t version;
  uint32_t size;  // of the whole message
  uint32_t nfds;  // descriptors attached
  uint64_t clone_flags;
  uint32_t owner_uid;
  int32_t err_slot, agent_slot, listen_slot, cgroup_slot, exe_slot;
  uint32_t exec_steps_base;
  uint32_t n_ops, n_limits, n_argv, n_envp, n_seccomp;
  uint32_t uid_map, gid_map;  // string offsets
  uint32_t strings_size;
  int32_t log_slot;
  uint32_t flags;  // kRequest*
  // Followed by WireOp ops[n_ops], WireOp limits[n_limits], uint32_t argv[n_argv],
  // uint32_t envp[n_envp], sock_filter seccomp[n_seccomp], char strings[strings_size].
};

struct WireOp {
  uint8_t kind;
  uint8_t ignore_missing;
  uint16_t reserved;
  uint32_t mode;
  uint64_t flags;
  uint32_t a, b, c, d;  // string offsets or kNoString
  uint32_t step;
  int32_t fd_slot;
};

class Strings {
 public:
  uint32_t add(const char* s) {
    if (!s) return kNoString;
    auto off = static_cast<uint32_t>(table_.size());
    table_.append(s, std::strlen(s) + 1);
    return off;
  }
  uint32_t add(const std::string& s) { return add(s.c_str()); }
  const std::string& table() const { return table_; }

 private:
  std::string table_;
};

WireOp to_wire(const Op& op, Strings& st) {
  WireOp w{};
  w.kind = static_cast<uint8_t>(op.kind);
  w.ignore_missing = op.ignore_missing ? 1 : 0;
  w.mode = op.mode;
  w.flags = op.flags;
  w.a = st.add(op.a);
  w.b = st.add(op.b);
  w.c = st.add(op.c);
  w.d = st.add(op.d);
  w.step = op.step;
  w.fd_slot = op.fd;
  return w;
}

template <typename T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// Which string arguments an op must have, and whether it takes a descriptor.
struct Shape {
  bool a, b, c, d, fd;
};
Shape shape_of(OpKind k) {
  switch (k) {
    case OpKind::kHello:
    case OpKind::kWaitSync:
    case OpKind::kBecomeRoot:
    case OpKind::kUnshare:
    case OpKind::kLoopbackUp:
    case OpKind::kPivotRoot:
    case OpKind::kSetRlimit:
    case OpKind::kSchedIdle:
    case OpKind::kSetIds:
    case OpKind::kRecvSetup:
      return {false, false, false, false, false};
    case OpKind::kSethostname:
    case OpKind::kMkdir:
    case OpKind::kTouch:
    case OpKind::kChdir:
    case OpKind::kUmountDetach:
      return {true, false, false, false, false};
    case OpKind::kMount:
      return {false, true, false, false, false};  // source, type and data may be null
    case OpKind::kSymlink:
    case OpKind::kWriteFile:
      return {true, true, false, false, false};
    case OpKind::kMoveMount:
      return {true, false, false, false, true};
    case OpKind::kCount:
      break;
  }
  return {true, true, true, true, true};
}

}  // namespace

uint64_t allowed_clone_flags() {
  return CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET |
         CLONE_NEWCGROUP;
}

int Request::slot(int fd) {
  for (size_t i = 0; i < fds.size(); ++i)
    if (fds[i] == fd) return static_cast<int>(i);
  fds.push_back(fd);
  return static_cast<int>(fds.size() - 1);
}

std::string encode(const Request& r) {
  Strings st;
  std::vector<WireOp> ops, limits;
  for (const auto& op : r.ops) ops.push_back(to_wire(op, st));
  for (const auto& op : r.limits) limits.push_back(to_wire(op, st));
  std::vector<uint32_t> argv, envp;
  for (const auto& a : r.argv) argv.push_back(st.add(a));
  for (const auto& e : r.envp) envp.push_back(st.add(e));
  Header h{};
  h.magic = kMagic;
  h.version = kVersion;
  h.nfds = static_cast<uint32_t>(r.fds.size());
  h.clone_flags = r.clone_flags;
  h.owner_uid = r.owner_uid;
  h.err_slot = r.err_slot;
  h.agent_slot = r.agent_slot;
  h.listen_slot = r.listen_slot;
  h.cgroup_slot = r.cgroup_slot;
  h.exe_slot = r.exe_slot;
  h.log_slot = r.log_slot;
  h.exec_steps_base = r.exec_steps_base;
  h.n_ops = static_cast<uint32_t>(ops.size());
  h.n_limits = static_cast<uint32_t>(limits.size());
  h.n_argv = static_cast<uint32_t>(argv.size());
  h.n_envp = static_cast<uint32_t>(envp.size());
  h.n_seccomp = static_cast<uint32_t>(r.seccomp.size());
  h.uid_map = st.add(r.uid_map);
  h.gid_map = st.add(r.gid_map);
  h.strings_size = static_cast<uint32_t>(st.table().size());
  h.flags = r.flags;
  std::string out;
  put(out, h);
  for (const auto& w : ops) put(out, w);
  for (const auto& w : limits) put(out, w);
  for (uint32_t v : argv) put(out, v);
  for (uint32_t v : envp) put(out, v);
  for (const auto& f : r.seccomp) put(out, f);
  out += st.table();
  Header* hp = reinterpret_cast<Header*>(out.data());
  hp->size = static_cast<uint32_t>(out.size());
  return out;
}

bool decode(const char* msg, size_t len, const int* fds, uint32_t nfds, Decoded* out,
            const char** why, int* err_fd) {
  *err_fd = -1;
  auto no = [&](const char* w) {
    *why = w;
    return false;
  };
  Header h;
  if (len < sizeof h) return no("shorter than its header");
  std::memcpy(&h, msg, sizeof h);
  if (h.magic != kMagic) return no("bad magic");
  if (h.version != kVersion) return no("unknown version");
  if (h.size != len) return no("size does not match the message");
  if (h.nfds != nfds) return no("descriptor count does not match");
  auto slot_ok = [&](int32_t s) { return s >= 0 && static_cast<uint32_t>(s) < nfds; };
  // From here on a failure can be reported on the request's own error pipe.
  if (slot_ok(h.err_slot)) *err_fd = fds[h.err_slot];
  if (!slot_ok(h.err_slot) || !slot_ok(h.agent_slot))
    return no("error pipe or agent socket missing");
  for (int32_t s : {h.listen_slot, h.cgroup_slot, h.exe_slot, h.log_slot})
    if (s != -1 && !slot_ok(s)) return no("descriptor slot out of range");
  if (h.n_ops > kMaxOps || h.n_limits > kMaxLimits || h.n_argv > kMaxArgs || h.n_envp > kMaxEnv ||
      h.n_seccomp > kMaxSeccomp)
    return no("over a count limit");
  if (h.n_argv == 0) return no("empty argv");
  if ((h.clone_flags & CLONE_NEWUSER) == 0) return no("no new user namespace");
  if (h.clone_flags & ~allowed_clone_flags()) return no("clone flags beyond namespaces");
  if (h.owner_uid == 0) return no("user namespace owned by host root");
  if (h.flags & ~kRequestOomFd) return no("unknown request flags");
  // 64-bit sums: no count above can overflow them.
  const uint64_t need = sizeof h + uint64_t{h.n_ops + h.n_limits} * sizeof(WireOp) +
                        uint64_t{h.n_argv + h.n_envp} * sizeof(uint32_t) +
                        uint64_t{h.n_seccomp} * sizeof(sock_filter) + h.strings_size;
  if (need != len) return no("sections do not add up to the message");
  const char* p = msg + sizeof h;
  const char* strings = msg + len - h.strings_size;
  if (h.strings_size == 0 || strings[h.strings_size - 1] != '\0')
    return no("string table not terminated");
  // Every offset is below the table's size and the table ends in a NUL: each string ends inside.
  auto str = [&](uint32_t off, bool required, bool* ok) -> char* {
    if (off == kNoString) {
      if (required) *ok = false;
      return nullptr;
    }
    if (off >= h.strings_size) {
      *ok = false;
      return nullptr;
    }
    return const_cast<char*>(strings + off);
  };
  auto ops_in = [&](uint32_t n, Op* dst, bool limits) -> bool {
    for (uint32_t i = 0; i < n; ++i, p += sizeof(WireOp)) {
      WireOp w;
      std::memcpy(&w, p, sizeof w);
      if (w.kind >= static_cast<uint8_t>(OpKind::kCount)) return false;
      auto kind = static_cast<OpKind>(w.kind);
      // Limits are applied last (ChildPlan::limits), ops before: neither takes the other's.
      if (limits != (kind == OpKind::kSetRlimit || kind == OpKind::kSchedIdle)) return false;
      Shape s = shape_of(kind);
      bool ok = true;
      Op op{kind};
      op.ignore_missing = w.ignore_missing != 0;
      op.mode = w.mode;
      op.flags = static_cast<unsigned long>(w.flags);
      op.a = str(w.a, s.a, &ok);
      op.b = str(w.b, s.b, &ok);
      op.c = str(w.c, s.c, &ok);
      op.d = str(w.d, s.d, &ok);
      op.step = w.step;
      if (s.fd) {
        if (!slot_ok(w.fd_slot)) return false;
        op.fd = fds[w.fd_slot];
      } else if (w.fd_slot != -1) {
        return false;
      }
      if (!ok) return false;
      dst[i] = op;
    }
    return true;
  };
  if (!ops_in(h.n_ops, out->ops, false)) return no("malformed op");
  if (!ops_in(h.n_limits, out->limits, true)) return no("malformed limit");
  auto list_in = [&](uint32_t n, char** dst) -> bool {
    for (uint32_t i = 0; i < n; ++i, p += sizeof(uint32_t)) {
      uint32_t off;
      std::memcpy(&off, p, sizeof off);
      bool ok = true;
      dst[i] = str(off, true, &ok);
      if (!ok) return false;
    }
    dst[n] = nullptr;
    return true;
  };
  if (!list_in(h.n_argv, out->argv)) return no("malformed argv");
  if (!list_in(h.n_envp, out->envp)) return no("malformed envp");
  bool ok = true;
  out->uid_map = str(h.uid_map, true, &ok);
  out->gid_map = str(h.gid_map, true, &ok);
  if (!ok) return no("id maps missing");
  ExecPlan& e = out->plan;
  e = ExecPlan{};
  e.ops = out->ops;
  e.n_ops = h.n_ops;
  e.limits = out->limits;
  e.n_limits = h.n_limits;
  e.argv = out->argv;
  e.envp = out->envp;
  // sock_filter needs 8-byte alignment only by convention; the kernel copies it.
  e.seccomp.len = static_cast<unsigned short>(h.n_seccomp);
  e.seccomp.filter = h.n_seccomp ? reinterpret_cast<sock_filter*>(const_cast<char*>(p)) : nullptr;
  e.err_wr = fds[h.err_slot];
  e.agent_child = fds[h.agent_slot];
  e.agent_listen = h.listen_slot >= 0 ? fds[h.listen_slot] : -1;
  e.cgroup_fd = h.cgroup_slot >= 0 ? fds[h.cgroup_slot] : -1;
  e.exe_fd = h.exe_slot >= 0 ? fds[h.exe_slot] : -1;
  e.log_fd = h.log_slot >= 0 ? fds[h.log_slot] : -1;
  e.exec_steps_base = h.exec_steps_base;
  out->clone_flags = h.clone_flags;
  out->owner_uid = h.owner_uid;
  out->flags = h.flags;
  return true;
}

}  // namespace tp::spawn
