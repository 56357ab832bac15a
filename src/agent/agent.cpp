#include "agent/agent.h"

#include <fcntl.h>
#include <linux/random.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "agent/command.h"
#include "agent/file_ops.h"
#include "agent/options.h"
#include "agent/session.h"
#include "protocol/wire.h"

namespace tp::agent {
namespace {

using proto::Message;
using proto::MsgType;
using proto::Tag;

constexpr uint64_t kDefaultOutputLimit = 16ull << 20;
// A command's output not yet acknowledged by the node (session.h) beyond
// this stops reads of its pipes (the pipe then blocks the command): a slow or
// absent node costs memory bounded by this per command, not by the command's
// output rate, and nothing is lost.
constexpr size_t kMaxQueuedPerCommand = 256u << 10;
// Beyond this much queued in total, the agent stops reading requests too.
constexpr size_t kMaxOutQueue = 8u << 20;
// One read from a pipe or the control stream. Static so that an idle agent
// owns no heap buffer; only the pages actually used become resident.
constexpr size_t kReadBuf = 64u << 10;
char g_buf[kReadBuf];

uint64_t mono_us() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000ull + static_cast<uint64_t>(ts.tv_nsec) / 1000;
}

void log_line(const char* fmt, const char* a = "", const char* b = "") {
  char line[512];
  int n = std::snprintf(line, sizeof(line), fmt, a, b);
  if (n > 0) (void)!::write(2, line, std::min<size_t>(static_cast<size_t>(n), sizeof(line) - 1));
}

struct Command {
  uint32_t id = 0;
  Spawned sp;
  uint64_t start_us = 0;
  uint64_t deadline_us = 0;  // 0 = none
  uint64_t limit = kDefaultOutputLimit;
  bool started = false;  // execve succeeded (kStarted sent unless quiet)
  bool quiet = false;    // kExec QUIET_START: no kStarted, PID goes with kExit
  bool failed = false;   // kError sent (the command never ran)
  bool kill_sent = false;
  bool timed_out = false;
  bool have_report = false;
  InitReport report;       // fallback mode; cgroup mode fills it from wait4
  pid_t pid = 0;           // the command's pid in the agent's namespace
  bool main_done = false;  // cgroup mode: the main pid was reaped
  bool draining = false;   // cgroup mode: waiting for the cgroup to empty
  uint64_t drain_checks = 0;
  std::vector<pid_t> members;  // cgroup mode: members at the last non-empty check
  bool got_failure = false;
  ExecFailure failure;
  std::string stdin_buf;
  size_t stdin_off = 0;
  bool stdin_eof = false;  // close stdin once stdin_buf is written
  // kStdinWrite: bytes of stdin ever queued and written, and the requests waiting
  // for their bytes to reach the pipe (request id, stdin_queued at its end).
  uint64_t stdin_queued = 0;
  uint64_t stdin_written = 0;
  std::deque<std::pair<uint32_t, uint64_t>> stdin_waiters;
  uint64_t forwarded[3] = {0, 0, 0};
  bool truncated[3] = {false, false, false};
  // kExec WINDOW: the node's consumer paces this command. Its pipes are read
  // only while credit (output bytes granted by WINDOW and kCredit, not yet
  // read) remains, so the node never has to hold more than it asked for.
  bool windowed = false;
  uint64_t credit = 0;
};

class Agent {
 public:
  Agent(Options opts, int ctl, sys::UniqueFd sigfd, FileService files)
      : opts_(std::move(opts)), ctl_(ctl), sigfd_(std::move(sigfd)), files_(std::move(files)) {
    if (opts_.listen_fd >= 0) listen_.reset(opts_.listen_fd);
    serial_ = opts_.serial;
  }

  int run();
  // Cgroup mode (see command.h); without it commands run under command inits.
  void set_cgroup_root(CgroupRoot r) { cgroup_root_ = r; }

 private:
  enum class Kind { kCtl, kListen, kSig, kExecChan, kInitChan, kStdout, kStderr, kStdin };
  struct Slot {
    Kind kind;
    uint32_t id;
  };

  void send(Message m, uint32_t owner = 0);
  bool flush();
  bool read_ctl();  // false: the session ended (see lose_ctl)
  bool lose_ctl();  // the session ended; false: the agent must end
  void accept_ctl();
  void start_session();
  void begin_session();
  // --serial: whether a host is connected to the port now (no POLLHUP).
  bool port_connected() const;
  void configure(const Message& m);
  void handle(const Message& m);
  void handle_exec(const Message& m);
  void kill_command(Command& c);
  void on_exec_chan(Command& c);
  void on_init_chan(Command& c);
  void on_pipe(Command& c, int stream, bool final);
  void on_stdin(Command& c);
  void stdin_write(const Message& m);
  // Answers the kStdinWrite requests whose bytes are written (kOk), or all of
  // them (kError) once the command's stdin is closed.
  void settle_stdin(Command& c);
  void reap();
  void finish(Command& c, int init_status);
  void on_main_exit(Command& c, int status, const rusage& ru);
  void drain(Command& c);
  void drain_all();
  void shutdown_commands();
  void maybe_trim();

  Options opts_;
  sys::UniqueFd ctl_;
  sys::UniqueFd sigfd_;
  FileService files_;
  sys::UniqueFd listen_;          // --listen-fd: where a node connects again
  uint64_t orphan_since_us_ = 0;  // when the last session ended (no ctl_)
  std::optional<proto::FrameReader> reader_{std::in_place};
  size_t reader_fed_ = 0;  // bytes fed since the reader was last renewed
  Session session_;        // what goes to the node, and what is kept until it acks
  bool heap_used_ = false;
  std::map<uint32_t, std::unique_ptr<Command>> cmds_;
  // Pids the agent waits for: the command's main process (cgroup mode) or
  // its command init (fallback).
  std::map<pid_t, uint32_t> inits_;
  CgroupRoot cgroup_root_;
  uint64_t cgroup_seq_ = 0;
  // Empty cgroups of ended commands, reused by the next ones: a mkdir and an
  // rmdir of a cgroup per exec (and an rmdir's EBUSY retry while the last
  // member leaves) were a fifth of the agent's cost of an exec. An empty
  // command cgroup carries nothing over: no controllers, no members, thawed.
  static constexpr size_t kSpareCgroups = 4;
  std::vector<CommandCgroup> spare_cgroups_;
  uint64_t last_drain_us_ = 0;
  int exit_code_ = 0;
  // --serial: ctl_ is a virtio-serial port that stays open; port_up_ while a
  // host is connected to it (a session runs).
  bool serial_ = false;
  bool port_up_ = false;
};

// Answers of a kExec (its kStarted, kOutput, kExit, or a kError for an id the
// session knows as an exec) are held until the node acknowledges them.
void Agent::send(Message m, uint32_t owner) {
  (void)owner;
  bool exec = m.type == MsgType::kStarted || m.type == MsgType::kOutput ||
              m.type == MsgType::kExit || (m.type == MsgType::kError && session_.holds(m.id));
  size_t size = 0;
  for (const auto& f : m.fields) size += f.second.size();
  if (size > 4096) heap_used_ = true;
  session_.send(std::move(m), exec);
}

// Writes what the control stream takes now. False when the stream broke.
bool Agent::flush() {
  if (!ctl_ || (serial_ && !port_up_)) return true;
  return session_.flush(ctl_.get());
}

// The control stream ended (EOF, error). With a listening socket the commands
// keep running and their answers wait for the next session; a protocol error
// or no listening socket ends the agent.
bool Agent::lose_ctl() {
  if (serial_ && exit_code_ == 0) {
    // The port stays open (closing it would drop what the host queued next).
    port_up_ = false;
    session_.end();
    reader_.emplace();
    reader_fed_ = 0;
    log_line("tp-agent: the host left the port; commands keep running until it connects again\n");
    return true;
  }
  if (!listen_ || exit_code_ != 0) return false;
  ctl_.reset();
  session_.end();
  reader_.emplace();
  reader_fed_ = 0;
  orphan_since_us_ = mono_us();
  log_line("tp-agent: the node is gone; commands keep running until it connects again\n");
  return true;
}

// A node connected to the listening socket: a new session, replacing the
// current one if there is one (the node restarted without our noticing).
void Agent::accept_ctl() {
  int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return;  // EAGAIN, or the peer gave up already
  if (ctl_) log_line("tp-agent: a new connection replaces the current session\n");
  ctl_.reset(fd);
  start_session();
}

// A new session on ctl_ (accepted, or a host connected to the serial port).
void Agent::start_session() {
  reader_.emplace();
  reader_fed_ = 0;
  begin_session();
}

// The session part of start_session(), the reader left as it is.
void Agent::begin_session() {
  session_.end();
  // Windows belong to the session that set them: the new node knows nothing of
  // them and would never send kCredit. Held frames (acks) still bound memory.
  for (auto& [id, c] : cmds_) c->windowed = false;
  session_.begin(static_cast<uint64_t>(::getpid()));
}

bool Agent::port_connected() const {
  pollfd p{ctl_.get(), POLLOUT, 0};
  if (::poll(&p, 1, 0) < 0) return false;
  return (p.revents & (POLLHUP | POLLERR | POLLNVAL)) == 0;
}

// kConfigure: a VM clone's own hostname, wall clock and random seed. Best effort:
// what fails is logged (a container's agent cannot set the clock, for one).
void Agent::configure(const Message& m) {
  if (auto name = m.get(Tag::kName); name && !name->empty()) {
    if (::sethostname(name->data(), name->size()) != 0)
      log_line("tp-agent: configure: sethostname: %s\n", std::strerror(errno));
  }
  if (m.has(Tag::kRealtimeNs)) {
    uint64_t ns = m.u64(Tag::kRealtimeNs);
    timespec ts{static_cast<time_t>(ns / 1000000000ull), static_cast<long>(ns % 1000000000ull)};
    if (::clock_settime(CLOCK_REALTIME, &ts) != 0)
      log_line("tp-agent: configure: clock_settime: %s\n", std::strerror(errno));
  }
  if (auto seed = m.get(Tag::kData); seed && !seed->empty()) {
    const size_t n = std::min<size_t>(seed->size(), 512);
    std::vector<char> buf(sizeof(rand_pool_info) + n);
    auto* info = reinterpret_cast<rand_pool_info*>(buf.data());
    info->entropy_count = static_cast<int>(n * 8);
    info->buf_size = static_cast<int>(n);
    std::memcpy(buf.data() + sizeof(rand_pool_info), seed->data(), n);
    sys::UniqueFd fd(::open("/dev/urandom", O_WRONLY | O_CLOEXEC));
    // Credited entropy, then a reseed: the clone's next random bytes are its own.
    if (!fd || ::ioctl(fd.get(), RNDADDENTROPY, info) != 0 || ::ioctl(fd.get(), RNDRESEEDCRNG) != 0)
      log_line("tp-agent: configure: seeding /dev/urandom: %s\n", std::strerror(errno));
  }
}

bool Agent::read_ctl() {
  ssize_t n = ::read(ctl_.get(), g_buf, sizeof(g_buf));
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  if (n == 0) return false;  // the node closed the stream
  reader_->feed(g_buf, static_cast<size_t>(n));
  reader_fed_ += static_cast<size_t>(n);
  while (auto m = reader_->next()) handle(*m);
  if (reader_->failed()) {
    log_line("tp-agent: protocol error: %s; closing\n", reader_->error().c_str());
    exit_code_ = 1;
    return false;
  }
  // A big frame leaves a big buffer behind; renew the reader between frames
  // so that an idle agent keeps none of it (emplace frees the old buffer;
  // assigning a fresh reader would keep its capacity).
  if (reader_->buffered() == 0 && reader_fed_ > kReadBuf) {
    reader_.emplace();
    reader_fed_ = 0;
    heap_used_ = true;
  }
  return true;
}

void Agent::handle(const Message& m) {
  switch (m.type) {
    case MsgType::kExec:
      handle_exec(m);
      return;
    case MsgType::kStdin: {
      auto it = cmds_.find(m.id);
      if (it == cmds_.end()) return;
      Command& c = *it->second;
      if (!c.sp.stdin_w || c.stdin_eof) return;
      if (auto d = m.get(Tag::kData)) {
        if (c.stdin_off == c.stdin_buf.size()) {
          c.stdin_buf.clear();
          c.stdin_off = 0;
        }
        c.stdin_buf.append(*d);
        c.stdin_queued += d->size();
      }
      if (m.flag(Tag::kEof)) c.stdin_eof = true;
      on_stdin(c);
      return;
    }
    case MsgType::kStdinWrite:
      stdin_write(m);
      return;
    case MsgType::kSignal: {
      auto it = cmds_.find(m.id);
      if (it == cmds_.end()) return;
      Command& c = *it->second;
      uint64_t sig = m.u64(Tag::kSigno);
      if (sig == 0 || sig >= NSIG) return;
      if (sig == SIGKILL) {
        kill_command(c);
      } else if (c.sp.cgroup.valid()) {
        c.sp.cgroup.signal_all(static_cast<int>(sig));
      } else if (c.sp.init_chan) {
        InitRequest r;
        r.op = 'S';
        r.signo = static_cast<int32_t>(sig);
        (void)::send(c.sp.init_chan.get(), &r, sizeof(r), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      return;
    }
    case MsgType::kFileWrite:
    case MsgType::kFileRead:
    case MsgType::kFileStat:
    case MsgType::kFileList:
    case MsgType::kFileRemove:
    case MsgType::kMkdir:
      send(files_.handle(m));
      return;
    case MsgType::kPing:
      send(Message(MsgType::kOk, m.id));
      return;
    case MsgType::kConfigure:
      configure(m);
      return;
    case MsgType::kHello:
      if (serial_ && session_.epoch() != 0 && m.u64(Tag::kEpoch) != session_.epoch()) {
        // Another node's first frame in a session that already had one: it connected
        // while the guest could not run (its host left and came back before we saw
        // the port close). Its stream starts here, at a frame boundary: a new session
        // on the same reader, so it gets kResumed, kReady and every held frame again.
        log_line("tp-agent: a new host took the port; new session\n");
        begin_session();
      }
      session_.hello(m.u64(Tag::kEpoch));
      return;
    case MsgType::kAck:
      session_.ack(m.u64(Tag::kSeq));
      return;
    case MsgType::kCredit: {
      auto it = cmds_.find(m.id);
      if (it == cmds_.end() || !it->second->windowed) return;
      Command& c = *it->second;
      uint64_t more = m.u64(Tag::kLength);
      c.credit = more > UINT64_MAX - c.credit ? UINT64_MAX : c.credit + more;
      return;
    }
    default: {
      char what[64];
      std::snprintf(what, sizeof(what), "unknown message type %u", static_cast<unsigned>(m.type));
      send(proto::make_error(m.id, code_name(Code::kInvalidArgument), 0, what));
    }
  }
}

void Agent::handle_exec(const Message& m) {
  auto reject = [&](Code code, std::string_view msg) {
    send(proto::make_error(m.id, code_name(code), 0, msg));
  };
  // Refusals of an id already in use are not the command's answers: not held.
  if (cmds_.count(m.id) || session_.holds(m.id)) {
    session_.send(
        proto::make_error(m.id, code_name(Code::kConflict), 0, "request id already in use"), false);
    return;
  }
  if (auto meta = m.get(Tag::kMeta); meta && meta->size() > proto::kMaxMeta) {
    session_.send(
        proto::make_error(m.id, code_name(Code::kInvalidArgument), 0, "exec: META too large"),
        false);
    return;
  }
  session_.note_exec(m.id, m.get(Tag::kMeta).value_or(""));
  ExecSpec spec;
  for (auto a : m.all(Tag::kArg)) spec.argv.emplace_back(a);
  std::vector<std::string> env;
  for (auto e : m.all(Tag::kEnv)) env.emplace_back(e);
  if (spec.argv.empty() || spec.argv[0].empty())
    return reject(Code::kInvalidArgument, "exec: empty argv");
  for (const auto* list : {&spec.argv, &env})
    for (const auto& s : *list)
      if (s.find('\0') != std::string::npos)
        return reject(Code::kInvalidArgument, "exec: NUL byte in argv or env");
  for (const auto& e : env)
    if (e.find('=') == std::string::npos || e[0] == '=')
      return reject(Code::kInvalidArgument, "exec: env entry is not KEY=VALUE");
  spec.cwd = m.str(Tag::kCwd, "/");
  if (spec.cwd.empty() || spec.cwd.find('\0') != std::string::npos)
    return reject(Code::kInvalidArgument, "exec: bad cwd");
  uint64_t uid = m.u64(Tag::kUid, 0);
  uint64_t gid = m.has(Tag::kGid) ? m.u64(Tag::kGid) : uid;
  if (uid > 0xfffffffeull || gid > 0xfffffffeull)
    return reject(Code::kInvalidArgument, "exec: bad uid/gid");
  spec.uid = static_cast<uint32_t>(uid);
  spec.gid = static_cast<uint32_t>(gid);
  spec.env = build_env(env, spec.uid);

  const CgroupRoot* root = cgroup_root_.fd >= 0 ? &cgroup_root_ : nullptr;
  CommandCgroup spare;
  if (root && !spare_cgroups_.empty()) {
    spare = std::move(spare_cgroups_.back());
    spare_cgroups_.pop_back();
  }
  auto sp = spawn_command(spec, root, ++cgroup_seq_, &spare);
  if (!sp) {
    send(proto::make_error(m.id, code_name(sp.error().code), sp.error().sys_errno,
                           sp.error().context));
    return;
  }
  auto c = std::make_unique<Command>();
  c->id = m.id;
  c->sp = std::move(*sp);
  c->start_us = mono_us();
  if (uint64_t t = m.u64(Tag::kTimeoutMs, 0)) c->deadline_us = c->start_us + t * 1000;
  c->limit = m.has(Tag::kOutputLimit) ? m.u64(Tag::kOutputLimit) : kDefaultOutputLimit;
  if (uint64_t w = m.u64(Tag::kWindow, 0)) {
    c->windowed = true;
    c->credit = w;
  }
  if (auto d = m.get(Tag::kData)) {
    c->stdin_buf.assign(*d);
    c->stdin_queued = d->size();
  }
  c->stdin_eof = !m.flag(Tag::kStdinOpen);
  c->quiet = m.flag(Tag::kQuietStart);
  inits_[c->sp.pid] = m.id;
  Command& ref = *c;
  cmds_[m.id] = std::move(c);
  if (!ref.sp.via_init) {
    // Cgroup mode: the vfork has returned, so whether execve happened is known.
    if (ref.sp.failed) {
      ref.failed = true;
      const ExecFailure& f = ref.sp.failure;
      send(proto::make_error(ref.id, code_name(f.err ? code_from_errno(f.err) : Code::kInternal),
                             f.err, std::string_view(f.what, strnlen(f.what, sizeof(f.what)))));
      ref.sp.stdin_w.reset();
      ref.sp.stdout_r.reset();
      ref.sp.stderr_r.reset();
      return;  // forgotten once its pid is reaped and its cgroup removed
    }
    ref.pid = ref.sp.pid;
    ref.started = true;
    if (!ref.quiet) {
      Message st(MsgType::kStarted, ref.id);
      st.add_u64(Tag::kPid, static_cast<uint64_t>(ref.pid));
      send(std::move(st));
    }
  }
  on_stdin(ref);
}

// Kills every process of the command: through its cgroup (the main pid is then
// reaped and the cgroup drained), or by asking the command init, which then
// reports the main process's status (SIGKILL) and exits.
void Agent::kill_command(Command& c) {
  if (c.kill_sent) return;
  c.kill_sent = true;
  if (!c.sp.via_init) {
    c.sp.cgroup.kill_all();
    return;
  }
  InitRequest r;
  r.op = 'K';
  if (!c.sp.init_chan ||
      ::send(c.sp.init_chan.get(), &r, sizeof(r), MSG_NOSIGNAL | MSG_DONTWAIT) != sizeof(r)) {
    // No way to ask: EOF on its channel makes the init sweep and exit.
    c.sp.init_chan.reset();
  }
}

void Agent::on_exec_chan(Command& c) {
  for (;;) {
    union {
      ExecFailure f;
      ExecHello h;
      char raw[sizeof(ExecFailure)];
    } msg{};
    union {
      cmsghdr align;
      char buf[CMSG_SPACE(sizeof(ucred))];
    } control{};
    iovec iov{&msg, sizeof(msg)};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control.buf;
    mh.msg_controllen = sizeof(control.buf);
    ssize_t n = ::recvmsg(c.sp.exec_chan.get(), &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return;
    }
    if (n <= 0) break;  // EOF: execve happened, or the command failed before it
    if (msg.raw[0] == 'P') {
      for (cmsghdr* h = CMSG_FIRSTHDR(&mh); h; h = CMSG_NXTHDR(&mh, h)) {
        if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_CREDENTIALS) {
          ucred cr;
          std::memcpy(&cr, CMSG_DATA(h), sizeof(cr));
          c.pid = cr.pid;
        }
      }
    } else if (msg.raw[0] == 'E' && static_cast<size_t>(n) == sizeof(ExecFailure)) {
      c.got_failure = true;
      c.failure = msg.f;
      c.failure.what[sizeof(c.failure.what) - 1] = '\0';
    }
  }
  c.sp.exec_chan.reset();
  if (c.got_failure || c.pid == 0) {
    c.failed = true;
    int e = c.got_failure ? c.failure.err : 0;
    std::string what =
        c.got_failure ? c.failure.what : "command init died before the command started";
    send(proto::make_error(c.id, code_name(e ? code_from_errno(e) : Code::kInternal), e, what));
    c.sp.stdin_w.reset();
    c.sp.stdout_r.reset();
    c.sp.stderr_r.reset();
    return;
  }
  c.started = true;
  if (c.quiet) return;
  Message s(MsgType::kStarted, c.id);
  s.add_u64(Tag::kPid, static_cast<uint64_t>(c.pid));
  send(std::move(s));
}

void Agent::on_init_chan(Command& c) {
  for (;;) {
    InitReport r;
    ssize_t n = ::recv(c.sp.init_chan.get(), &r, sizeof(r), MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n == static_cast<ssize_t>(sizeof(r)) && r.op == 'X') {
      c.report = r;
      c.have_report = true;
      continue;
    }
    if (n <= 0) break;
  }
  c.sp.init_chan.reset();
}

// Forwards what one pipe has. `final`: the command's processes are all gone,
// so read until the pipe is empty even if some other process still holds it.
void Agent::on_pipe(Command& c, int stream, bool final) {
  sys::UniqueFd& fd = stream == 1 ? c.sp.stdout_r : c.sp.stderr_r;
  while (fd) {
    // A windowed command is read no further than its credit; at its end
    // (`final`) what its pipes still hold (at most their capacity) is read anyway.
    size_t want = sizeof(g_buf);
    if (c.windowed && !final) want = static_cast<size_t>(std::min<uint64_t>(want, c.credit));
    if (want == 0) return;
    ssize_t n = ::read(fd.get(), g_buf, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN && !final) return;
    if (n <= 0) {
      fd.reset();
      return;
    }
    uint64_t room = c.limit > c.forwarded[stream] ? c.limit - c.forwarded[stream] : 0;
    size_t take = static_cast<size_t>(std::min<uint64_t>(room, static_cast<uint64_t>(n)));
    // Only what is sent takes credit: past the output limit the rest is read and
    // dropped, never credited back, and must not stall the command.
    if (c.windowed) c.credit -= std::min<uint64_t>(c.credit, take);
    if (take < static_cast<size_t>(n)) c.truncated[stream] = true;
    if (take > 0) {
      c.forwarded[stream] += take;
      Message m(MsgType::kOutput, c.id);
      m.add_u64(Tag::kStream, static_cast<uint64_t>(stream));
      m.add(Tag::kData, std::string_view(g_buf, take));
      send(std::move(m), c.id);
    }
    if (!final) return;  // one read per wakeup keeps the loop fair
  }
}

void Agent::on_stdin(Command& c) {
  while (c.sp.stdin_w && c.stdin_off < c.stdin_buf.size()) {
    ssize_t n = ::write(c.sp.stdin_w.get(), c.stdin_buf.data() + c.stdin_off,
                        c.stdin_buf.size() - c.stdin_off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n < 0) {  // EPIPE: the command closed its stdin or exited
      c.sp.stdin_w.reset();
      break;
    }
    c.stdin_off += static_cast<size_t>(n);
    c.stdin_written += static_cast<uint64_t>(n);
  }
  if (c.stdin_off == c.stdin_buf.size()) {
    std::string().swap(c.stdin_buf);
    c.stdin_off = 0;
    if (c.stdin_eof) c.sp.stdin_w.reset();
  }
  if (!c.sp.stdin_w) std::string().swap(c.stdin_buf);
  settle_stdin(c);
}

void Agent::stdin_write(const Message& m) {
  auto it = cmds_.find(static_cast<uint32_t>(m.u64(Tag::kExecId)));
  if (it == cmds_.end())
    return send(proto::make_error(m.id, code_name(Code::kNotFound), 0, "stdin: no such command"));
  Command& c = *it->second;
  if (!c.sp.stdin_w || c.stdin_eof)
    return send(proto::make_error(m.id, code_name(Code::kConflict), EPIPE,
                                  "stdin: the command's stdin is closed"));
  if (auto d = m.get(Tag::kData)) {
    if (c.stdin_off == c.stdin_buf.size()) {
      c.stdin_buf.clear();
      c.stdin_off = 0;
    }
    c.stdin_buf.append(*d);
    c.stdin_queued += d->size();
  }
  if (m.flag(Tag::kEof)) c.stdin_eof = true;
  c.stdin_waiters.emplace_back(m.id, c.stdin_queued);
  on_stdin(c);
}

void Agent::settle_stdin(Command& c) {
  while (!c.stdin_waiters.empty()) {
    auto [id, upto] = c.stdin_waiters.front();
    if (c.stdin_written >= upto) {
      send(Message(MsgType::kOk, id));
    } else if (!c.sp.stdin_w) {
      send(proto::make_error(id, code_name(Code::kConflict), EPIPE,
                             "stdin: the command closed its stdin"));
    } else {
      return;
    }
    c.stdin_waiters.pop_front();
  }
}

void Agent::reap() {
  signalfd_siginfo si;
  while (::read(sigfd_.get(), &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
  }
  for (;;) {
    int st = 0;
    rusage ru{};
    pid_t pid = ::wait4(-1, &st, WNOHANG, &ru);
    if (pid <= 0) break;
    auto it = inits_.find(pid);
    if (it == inits_.end()) continue;  // an orphan reparented to PID 1
    uint32_t id = it->second;
    inits_.erase(it);
    auto ct = cmds_.find(id);
    if (ct == cmds_.end()) continue;
    if (ct->second->sp.via_init) {
      finish(*ct->second, st);
    } else {
      on_main_exit(*ct->second, st, ru);
    }
  }
  // Every process of a command that leaves its cgroup last has the agent as
  // parent (orphans are reparented to it), so its exit lands here.
  drain_all();
}

// Cgroup mode: the command's main process is reaped. Whatever else it started
// is killed now (the process model), and the command ends once its cgroup is
// empty.
void Agent::on_main_exit(Command& c, int status, const rusage& ru) {
  c.main_done = true;
  c.report.wait_status = status;
  c.report.max_rss_kb = static_cast<uint64_t>(ru.ru_maxrss);
  c.report.wall_us = mono_us() - c.start_us;
  c.have_report = !c.failed;
  c.draining = true;
  drain(c);
}

// Ends a draining command whose cgroup is empty; else kills again (a fork may
// have raced a freezer-based kill) and waits for the next reap or tick.
void Agent::drain(Command& c) {
  if (!c.draining) return;
  std::vector<pid_t> p;
  if (!c.sp.cgroup.read_pids(&p) || !p.empty()) {
    if (!p.empty()) c.members = std::move(p);
    // The first check (at the main process's exit) kills at once.
    if (c.drain_checks++ % 4 == 0) c.sp.cgroup.kill_all();
    return;
  }
  // A process leaves its cgroup a moment before it becomes a zombie: the
  // command is over only once the agent's own children among the last members
  // are reaped (0 = still exiting; its SIGCHLD brings us back here).
  for (pid_t pid : c.members) {
    int st = 0;
    if (inits_.count(pid)) continue;  // reused meanwhile by another command's main process
    if (::waitpid(pid, &st, WNOHANG) == 0) return;
  }
  if (spare_cgroups_.size() < kSpareCgroups) {
    spare_cgroups_.push_back(std::move(c.sp.cgroup));
  } else if (auto r = c.sp.cgroup.remove(); !r) {
    log_line("tp-agent: %s\n", r.error().message().c_str());
  }
  finish(c, 0);
}

void Agent::drain_all() {
  std::vector<uint32_t> ids;
  for (auto& [id, c] : cmds_)
    if (c->draining) ids.push_back(id);
  for (uint32_t id : ids) {
    auto it = cmds_.find(id);
    if (it != cmds_.end()) drain(*it->second);
  }
}

// The command is over: its init reported (it has reaped every process of the
// command and only exits after) or the init has exited. Collect what the
// channels and pipes still hold, answer, and forget the command; an init still
// running is reaped later as an orphan (its command id may be reused by then).
void Agent::finish(Command& c, int init_status) {
  if (c.sp.via_init || !c.main_done) inits_.erase(c.sp.pid);
  if (c.sp.exec_chan) on_exec_chan(c);
  if (c.sp.init_chan) on_init_chan(c);
  if (c.started) {
    on_pipe(c, 1, true);
    on_pipe(c, 2, true);
  }
  if (!c.failed) {
    Message x(MsgType::kExit, c.id);
    int64_t code = -1;
    int sig = 0;
    if (c.have_report) {
      int ws = c.report.wait_status;
      if (WIFEXITED(ws))
        code = WEXITSTATUS(ws);
      else if (WIFSIGNALED(ws))
        sig = WTERMSIG(ws);
    } else {
      sig = WIFSIGNALED(init_status) ? WTERMSIG(init_status) : SIGKILL;
    }
    uint64_t wall = c.have_report ? c.report.wall_us : mono_us() - c.start_us;
    x.add_i64(Tag::kExitCode, code);
    x.add_u64(Tag::kTermSignal, static_cast<uint64_t>(sig));
    x.add_u64(Tag::kWallUs, wall);
    x.add_u64(Tag::kMaxRssKb, c.have_report ? c.report.max_rss_kb : 0);
    x.add_bool(Tag::kTimedOut, c.timed_out);
    x.add_bool(Tag::kStdoutTruncated, c.truncated[1]);
    x.add_bool(Tag::kStderrTruncated, c.truncated[2]);
    if (c.pid > 0) x.add_u64(Tag::kPid, static_cast<uint64_t>(c.pid));
    send(std::move(x));
  }
  c.sp.stdin_w.reset();
  settle_stdin(c);  // what was not written never will be
  uint32_t id = c.id;
  cmds_.erase(id);  // destroys c
  heap_used_ = true;
}

void Agent::shutdown_commands() {
  for (auto& [id, c] : cmds_) {
    c->kill_sent = false;  // kill again even if a kill was sent before
    kill_command(*c);
  }
  for (auto& [pid, id] : inits_) {
    int st;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
  }
  inits_.clear();
  // Cgroup mode: wait (bounded) until every command's cgroup is empty, so that
  // none is left behind (an agent that is PID 1 takes everything with it anyway).
  for (int i = 0; i < 5000; ++i) {
    bool all_empty = true;
    for (auto& [id, c] : cmds_) {
      if (c->sp.via_init || c->sp.cgroup.empty()) continue;
      all_empty = false;
      if (i % 50 == 49) c->sp.cgroup.kill_all();
    }
    if (all_empty) break;
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    ::usleep(1000);
  }
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  cmds_.clear();  // removes the cgroups
  spare_cgroups_.clear();
}

// After a burst (big frames, many commands) give the heap back to the kernel
// once the agent is idle again.
void Agent::maybe_trim() {
  if (!heap_used_ || !cmds_.empty() || !session_.idle()) return;
  heap_used_ = false;
  ::malloc_trim(0);
}

int Agent::run() {
  if (!serial_ || port_connected()) {
    port_up_ = serial_;
    session_.begin(static_cast<uint64_t>(::getpid()));
  }
  // kReady first; then, while the node finishes the sandbox's create, the first
  // command's cgroup: the first exec finds it made (a mkdir off its path).
  (void)flush();
  if (cgroup_root_.fd >= 0 && spare_cgroups_.empty())
    if (auto cg = CommandCgroup::make(cgroup_root_, ++cgroup_seq_))
      spare_cgroups_.push_back(std::move(*cg));
  std::vector<pollfd> pfds;
  std::vector<Slot> slots;
  for (;;) {
    if (serial_ && !port_up_ && port_connected()) {
      port_up_ = true;
      start_session();
    }
    if (!flush() && !lose_ctl()) break;
    maybe_trim();
    pfds.clear();
    slots.clear();
    auto add = [&](int fd, short ev, Kind k, uint32_t id) {
      pfds.push_back(pollfd{fd, ev, 0});
      slots.push_back(Slot{k, id});
    };
    if (ctl_ && (!serial_ || port_up_)) {
      short ctl_ev = (session_.unsent_bytes() < kMaxOutQueue ? POLLIN : 0) |
                     (session_.want_write() ? POLLOUT : 0);
      add(ctl_.get(), ctl_ev, Kind::kCtl, 0);
    }
    if (listen_) add(listen_.get(), POLLIN, Kind::kListen, 0);
    add(sigfd_.get(), POLLIN, Kind::kSig, 0);
    uint64_t now = mono_us();
    if (now - last_drain_us_ >= 20000) {
      drain_all();
      last_drain_us_ = now;
    }
    uint64_t next_deadline = 0;
    if (!ctl_) {
      // No node for too long: it is not coming back; do not run forever.
      uint64_t orphan_end = orphan_since_us_ + uint64_t{opts_.orphan_timeout_s} * 1000000ull;
      if (now >= orphan_end) {
        log_line("tp-agent: no node connected within --orphan-timeout; exiting\n");
        break;
      }
      next_deadline = orphan_end;
    }
    for (auto& [id, cp] : cmds_) {
      Command& c = *cp;
      if (c.deadline_us && !c.kill_sent) {
        if (now >= c.deadline_us) {
          c.timed_out = true;
          kill_command(c);
        } else if (!next_deadline || c.deadline_us < next_deadline) {
          next_deadline = c.deadline_us;
        }
      }
      // Cgroup mode, waiting for the cgroup to empty: a reap normally ends it;
      // the tick covers members leaving in other ways (and forks racing a kill).
      if (c.draining && (!next_deadline || now + 20000 < next_deadline))
        next_deadline = now + 20000;
      if (c.sp.exec_chan) add(c.sp.exec_chan.get(), POLLIN, Kind::kExecChan, id);
      if (c.sp.init_chan) add(c.sp.init_chan.get(), POLLIN, Kind::kInitChan, id);
      if (c.started && session_.held_bytes(id) < kMaxQueuedPerCommand &&
          (!c.windowed || c.credit > 0)) {
        if (c.sp.stdout_r) add(c.sp.stdout_r.get(), POLLIN, Kind::kStdout, id);
        if (c.sp.stderr_r) add(c.sp.stderr_r.get(), POLLIN, Kind::kStderr, id);
      }
      if (c.sp.stdin_w && c.stdin_off < c.stdin_buf.size())
        add(c.sp.stdin_w.get(), POLLOUT, Kind::kStdin, id);
    }
    int timeout = -1;
    if (next_deadline) timeout = static_cast<int>((next_deadline - now + 999) / 1000);
    // A port without a host reports POLLHUP all the time: it is not polled then.
    // SIGIO (signalfd) says when the host connects; the 1 s check is a backstop.
    if (serial_ && !port_up_ && (timeout < 0 || timeout > 1000)) timeout = 1000;
    int n = ::poll(pfds.data(), pfds.size(), timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      log_line("tp-agent: poll: %s\n", std::strerror(errno));
      exit_code_ = 1;
      break;
    }
    bool stop = false;
    for (size_t i = 0; i < pfds.size() && !stop; ++i) {
      short re = pfds[i].revents;
      if (!re) continue;
      const Slot s = slots[i];
      if (s.kind == Kind::kCtl) {
        bool lost = false;
        if (re & POLLOUT) {
          if (!flush()) lost = true;
        }
        if (!lost && (re & (POLLIN | POLLHUP | POLLERR))) {
          if (re & POLLIN) {
            if (!read_ctl()) lost = true;
          } else {
            lost = true;  // hung up with nothing left to read
          }
        }
        if (lost && !lose_ctl()) stop = true;
        continue;
      }
      if (s.kind == Kind::kListen) {
        accept_ctl();
        continue;
      }
      if (s.kind == Kind::kSig) {
        reap();
        continue;
      }
      auto it = cmds_.find(s.id);
      if (it == cmds_.end()) continue;  // finished earlier in this round
      Command& c = *it->second;
      switch (s.kind) {
        case Kind::kExecChan:
          if (c.sp.exec_chan) on_exec_chan(c);
          break;
        case Kind::kInitChan:
          if (c.sp.init_chan) on_init_chan(c);
          // The report comes once the init has reaped every process of the command:
          // answer now rather than after the init's own exit (reaped later, in reap()).
          if (c.have_report) finish(c, 0);
          break;
        case Kind::kStdout:
          on_pipe(c, 1, false);
          break;
        case Kind::kStderr:
          on_pipe(c, 2, false);
          break;
        case Kind::kStdin:
          on_stdin(c);
          break;
        default:
          break;
      }
    }
    if (stop) break;
  }
  shutdown_commands();
  (void)flush();
  return exit_code_;
}

// Makes sure fds 0..2 are open, so that pipe and socket fds are never 0..2
// (the command's dup2 onto 0..2 relies on it).
void ensure_std_fds() {
  for (int fd = 0; fd < 3; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0) continue;
    int n = ::open("/dev/null", O_RDWR);
    if (n < 0) n = ::open("/", O_RDONLY | O_DIRECTORY);
    if (n >= 0 && n != fd) {
      ::dup2(n, fd);
      ::close(n);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  auto opts = parse_options(argc, argv);
  if (!opts) {
    log_line("tp-agent: %s\n", opts.error().message().c_str());
    log_line(
        "usage: tp-agent [--fd N] [--listen-fd N] [--orphan-timeout S] [--root DIR] [--cgroup-fd "
        "N] [--serial] [--oom-fd N] [--resolve auto|openat2|walk]\n");
    return 2;
  }
  // Keep the heap small and give it back: no dynamic mmap threshold growth,
  // so big transient buffers are mmapped and unmapped when freed.
  ::mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  ::mallopt(M_TRIM_THRESHOLD, 128 * 1024);
  ensure_std_fds();
  if (::fcntl(opts->fd, F_GETFD) < 0) {
    log_line("tp-agent: --fd: %s\n", std::strerror(errno));
    return 2;
  }
  // Commands must not ptrace the agent or open /proc/<agent>/fd/*.
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  // As a plain process (tests), collect orphans the way PID 1 would.
  if (::getpid() != 1) ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  ::fcntl(opts->fd, F_SETFD, FD_CLOEXEC);
  if (opts->listen_fd >= 0) {
    if (::fcntl(opts->listen_fd, F_GETFD) < 0 || opts->listen_fd == opts->fd) {
      log_line("tp-agent: --listen-fd: %s\n", std::strerror(errno ? errno : EINVAL));
      return 2;
    }
    ::fcntl(opts->listen_fd, F_SETFD, FD_CLOEXEC);
    ::fcntl(opts->listen_fd, F_SETFL, ::fcntl(opts->listen_fd, F_GETFL) | O_NONBLOCK);
  }
  ::fcntl(opts->fd, F_SETFL, ::fcntl(opts->fd, F_GETFL) | O_NONBLOCK);
  ::signal(SIGPIPE, SIG_IGN);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  if (opts->serial) {
    // The port raises SIGIO when the host connects or leaves (and on data): it
    // wakes the poll loop through the signalfd while the port itself is not polled.
    sigaddset(&chld, SIGIO);
    ::fcntl(opts->fd, F_SETOWN, ::getpid());
    ::fcntl(opts->fd, F_SETFL, ::fcntl(opts->fd, F_GETFL) | O_ASYNC);
  }
  ::sigprocmask(SIG_BLOCK, &chld, nullptr);
  int sfd = ::signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) {
    log_line("tp-agent: signalfd: %s\n", std::strerror(errno));
    return 2;
  }
  // File modes from requests are taken as given; commands get umask 022.
  ::umask(0);
  auto resolver = Resolver::open_root(opts->root, opts->resolve);
  if (!resolver) {
    log_line("tp-agent: --root: %s\n", resolver.error().message().c_str());
    return 2;
  }
  CgroupRoot cg_root;
  if (opts->cgroup_fd >= 0) {
    // Commands must never get it (they would leave their cgroups).
    if (::fcntl(opts->cgroup_fd, F_SETFD, FD_CLOEXEC) != 0) {
      log_line("tp-agent: --cgroup-fd: %s\n", std::strerror(errno));
      return 2;
    }
    auto r = probe_cgroup_root(opts->cgroup_fd);
    if (!r) {
      log_line("tp-agent: %s\n", r.error().message().c_str());
      return 2;
    }
    cg_root = *r;
  }
  if (opts->oom_fd >= 0) {
    // Never a command's (it would move the agent's score); a bad one only costs the
    // commands their higher score.
    if (::fcntl(opts->oom_fd, F_SETFD, FD_CLOEXEC) == 0)
      set_oom_score_fd(opts->oom_fd);
    else
      log_line("tp-agent: --oom-fd: %s\n", std::strerror(errno));
  }
  int ctl = opts->fd;
  Agent agent(std::move(*opts), ctl, sys::UniqueFd(sfd), FileService(std::move(*resolver)));
  agent.set_cgroup_root(cg_root);
  return agent.run();
}

}  // namespace tp::agent
